"""Placement: a VM's launcher pod pinned to the node its claims are bound to, and moved on
when that node refuses it (DESIGN.md §5 "VMs").

Key: a pod ``(namespace, name)`` — a launcher pod or KubeVirt's temporary pod for
WaitForFirstConsumer volumes (``launcher_pods.launcher_pod_kind``) of a VM with claim
references. Migration targets are never touched (KubeVirt renders them afresh and deletes
them when they stay pending). Two situations are handled:

**A gated pod** (the pod webhook added ``gpu.cozystack.io/placement``). Its VMI is found
through the pod's controller ownerReference (else the ``vm.kubevirt.io/name`` label, else
the VMI whose UID the ``kubevirt.io/created-by`` label names), its claims through the pod's
references (``templates.claim_names``: held claims by name, template claims by
``<vmi>-gpu-<index>``). The pod waits, gated, until every claim exists, is not being
deleted, is a template claim of this very VMI (not of an earlier VMI of that name still being
collected) or a held claim attached to this very VMI (by name and UID, as the attachments
controller records it: a held claim attached to another VMI, or not attached yet, is never
pinned for this one), and is Bound. Then:

* all Bound to ONE node that still exists: ONE merge patch with the pod's resourceVersion
  (``launcher_pods.pin_and_ungate``) adds the required node affinity and removes the gate — the
  API server accepts the affinity only while the pod is gated. Event ``Pinned`` on the pod.
  The patch is built from the cached pod (a gated pod is cached with its affinity,
  ``slimming.slim_pod``), so the pod is pinned without reading it first; only when that
  version is stale (409) is the pod read and the patch sent once more on what was read.
* Bound to several nodes: the set is gathered on one of them, as ``model.gathering``
  decides on the inventory's figures. Candidate targets are the set's nodes, the one holding
  most of its units first; the claims on other nodes are moved there when the target is
  eligible for their classes and has free units of each resource for all of them together
  (classes may share a resource), and no moving claim refused the target. A move rewrites
  the claim's status (``nodeName``, ``boundTime``, the ``Bound`` condition with reason
  ``Moved``) with the claim's resourceVersion and is fed to the inventory at once, so the
  binder's next plan sees it. The claims of this VM are not attached to any running VM (the
  pod waits otherwise), so moving them stops nothing.
  When no target fits, the pod stays gated and the Event ``WaitingForPlacement`` says why;
  it is looked at again every :data:`WAIT_RECHECK` seconds (capacity frees without any
  event on this pod).

**A pinned pod reported Unschedulable** (no gate, PodScheduled False with reason
``Unschedulable``, and the required affinity ``pin_and_ungate`` wrote): the node refused the
set. The pod is deleted first, with its UID and the resourceVersion it was judged on as
preconditions: kube-scheduler retries a refused pod by itself, and a pod it placed between
the look and the deletion (its binding changes the resourceVersion) is judged again instead,
so a running launcher pod is never separated from its claims. KubeVirt then fails the VMI
and the VirtualMachine controller starts a new one after its backoff (deletion is the last
resort, used only here). Then each claim of the VMI that no other live VM uses gets the node
in ``status.refusedNodes`` until ``now + refusalTTL`` (``binding.add_refusal``); the claims
Bound to that node go back to ``Pending`` without ``nodeName`` (the ``Bound`` condition says
``RefusedByNode``), so the binder places them elsewhere, skipping the node. A claim write
that loses a race is tried again: the refusal is owed until written (in memory: a replica
that dies in between loses it, and the set's next pod, pinned to the same node, is judged
afresh). Events ``RefusedByNode`` on each claim and on the VMI.

Choices where DESIGN.md is silent:

* **Moves never race the binder.** A move is decided and written while holding
  ``Ledger.allocation_lock``, the lock every binder pass holds too, and it goes through the
  same write-back (``claim_status``): counted in the inventory before it is sent, kept
  there until the watch delivers a newer version.
* **A refusal is not taken at once while the node's taints lag behind its state.** A node
  that just became Ready (or was uncordoned) keeps ``node.kubernetes.io/not-ready`` (or
  ``unschedulable``) until the node lifecycle controller removes it; eligibility skips those
  taints (Ready and cordon decide them), so a set may be pinned there meanwhile and be refused
  for the taint alone. The refusal waits (within :data:`SETTLE`) while the node carries such a
  taint; the scheduler places the pod once it is removed.
* **A refusal is not taken at once while kube-scheduler's view of the node lags.** When
  node affinity is the scheduler's only reason for rejecting every node although the pinned
  node, as the API shows it, satisfies the pod's node selection
  (``node_selection.scheduler_view_lags``), the scheduler does not know the node yet (its
  node informer is catching up, after an API server restart for instance) or still sees its
  old labels; it tries the pod again once the node reaches its cache. The refusal waits
  (within :data:`SETTLE`); one for the pod's own node selection is taken at once.
* **A refusal is not taken at once while the node is still releasing GPUs.** When pods being
  deleted on the pinned node still request one of the claims' resources (a restarted VM's old
  launcher pod, for instance), kube-scheduler tries the pinned pod again as soon as they are
  gone; the refusal waits up to :data:`SETTLE` seconds, counted from when this replica first
  saw the pod refused, before it is recorded.
* Claims attached to another live VM are left as they are when a pinned pod is refused: the
  set cannot have been pinned with them, and their binding is that VM's.
* ``gpuForVMs`` off does not stop this controller: a gated pod was admitted while it was on,
  and pinning it is the only correct way to remove the operator's gate.
* Waits are reported once per message (log line and Event), not on every look.
* **A pod this replica pinned is not judged again while the cache still shows it gated.**
  A scheduling gate cannot be added back after a pod's creation, so a cached pod of the
  same uid that still carries the gate is only the cache lagging behind the pin: the watch
  brings the pinned version; reading or patching the pod again would be wasted requests.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from typing import Any, Final

import pykube
import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, BY_NODE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus, Outcome
from gpuoperator.ledger import Ledger
from gpuoperator.model import (
    claim_states,
    conditions,
    eligibility,
    gathering,
    launcher_pods,
    node_selection,
    orders,
    pods,
    references,
    templates,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.informing import Key, key_of
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import EventType, Recorder
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "placement"
#: Seconds after which a waiting pod is looked at again without any event.
WAIT_RECHECK: Final = 30.0
#: Seconds a refusal may wait for what makes it transient (lagging taints, a lagging
#: scheduler, pods being deleted on the node) to pass.
SETTLE: Final = 60.0
#: Seconds before a reconcile that lost a write race looks again.
RETRY: Final = 1.0


UNSCHEDULABLE: Final = "Unschedulable"

PINNED = "Pinned"
WAITING = "WaitingForPlacement"
REFUSED = "RefusedByNode"
PIN_FAILED = "PinFailed"

_PLACED_KINDS: Final = ("launcher", "ephemeral")


# ---- pure reading of pods and claims -------------------------------------------------------


def _meta(obj: Obj | None) -> dict[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def _status(obj: Obj | None) -> dict[str, Any]:
    status = (obj or {}).get("status")
    return status if isinstance(status, dict) else {}


def _text(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def is_unschedulable(pod: Obj) -> bool:
    """Whether kube-scheduler reports the pod unschedulable (``PodScheduled`` False with
    reason ``Unschedulable``; a gated pod's reason is ``SchedulingGated``)."""
    scheduled = conditions.find(_status(pod).get("conditions"), "PodScheduled")
    return (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == UNSCHEDULABLE
    )


def _placed_pod(pod: Obj) -> bool:
    return launcher_pods.launcher_pod_kind(pod) in _PLACED_KINDS and not _meta(pod).get(
        "deletionTimestamp"
    )


def needs_pin(pod: Obj) -> bool:
    """A launcher (or temporary) pod still held at the placement gate."""
    return _placed_pod(pod) and launcher_pods.is_gated(pod)


def maybe_refused(pod: Obj) -> bool:
    """A launcher (or temporary) pod without the gate that the scheduler cannot place: a
    refusal if the operator pinned it (only the full pod shows the affinity)."""
    return (
        _placed_pod(pod)
        and not launcher_pods.is_gated(pod)
        and not pods.node_name(pod)
        and is_unschedulable(pod)
    )


def watched(pod: Obj) -> bool:
    """Whether the pod is one this controller acts on."""
    return needs_pin(pod) or maybe_refused(pod)


def vmi_name_of(pod: Obj) -> str:
    """The name of the pod's VMI as the pod itself says it ("" when it does not): its
    controller ownerReference, else the ``vm.kubevirt.io/name`` label."""
    owner = gpuclaims.controlling_vmi(pod)
    if owner is not None:
        return owner.name
    return str((_meta(pod).get("labels") or {}).get(names.VM_NAME_LABEL) or "")


@dataclasses.dataclass(frozen=True)
class _Refusal:
    """A node's refusal of a pinned pod, taken (the pod is deleted) and still to be recorded
    on the set's claims."""

    pod: Obj
    node: str
    detail: str
    now: datetime.datetime
    until: datetime.datetime
    vmi_name: str
    vmi_uid: str
    claim_names: tuple[str, ...]


# ---- the controller --------------------------------------------------------------------------


class Placement:
    def __init__(
        self,
        caches: Caches,
        inventory: Ledger,
        writer: Client,
        statuses: ClaimStatus,
        recorder: Recorder,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.inventory = inventory
        self.writer = writer
        self.statuses = statuses
        self.recorder = recorder
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        #: pod key -> the last wait message reported (Events and logs only on change)
        self._waits: dict[Key, str] = {}
        #: pod key -> (pod uid, monotonic time this replica first saw it refused)
        self._refused_since: dict[Key, tuple[str, float]] = {}
        #: pod key -> uid of the pod this replica pinned, until the cache shows it ungated
        self._pinned: dict[Key, str] = {}
        #: pod key -> a refusal whose pod is deleted and whose claims are still to be written
        self._owed: dict[Key, _Refusal] = {}

    def reconcile(self, key: Key) -> Result | None:
        with self._lock:
            owed = self._owed.get(key)
        if owed is not None:
            return self._record(key, owed)
        pod = self.caches.pods.store.get(key)
        if pod is None or not watched(pod):
            self._forget(key)
            return None
        vmi_name, vmi_uid = self._vmi_of(pod)
        if not vmi_name:
            return self._wait(
                pod,
                "Warning",
                "the pod names no VM instance (no controller ownerReference to a "
                f"{names.VMI_KIND}, no {names.VM_NAME_LABEL} or {names.CREATED_BY_LABEL} label)",
            )
        try:
            refs = references.from_object(pod)
        except references.AnnotationError as exc:
            return self._wait(pod, "Warning", str(exc))
        names_ = templates.claim_names(vmi_name, refs)
        made = {
            name
            for name, ref in zip(names_, refs, strict=True)
            if isinstance(ref, references.TemplateRef)
        }
        if needs_pin(pod):
            with self._lock:
                pinned = self._pinned.get(key) == _meta(pod).get("uid")
            if pinned:
                log.debug("pinned already; the cache has not caught up", reason="Pinned")
                return None
            return self._place(pod, vmi_name, vmi_uid, names_, made)
        return self._refused(pod, vmi_name, vmi_uid, names_)

    def _vmi_of(self, pod: Obj) -> tuple[str, str]:
        """The pod's VMI name and UID ("" when unknown)."""
        ns = str(_meta(pod).get("namespace") or "")
        owner = gpuclaims.controlling_vmi(pod)
        if owner is not None:
            return owner.name, owner.uid
        labels = _meta(pod).get("labels") or {}
        name = str(labels.get(names.VM_NAME_LABEL) or "")
        if name:
            vmi = self.caches.vmis.store.get((ns, name))
            return name, str(_meta(vmi).get("uid") or "")
        uid = str(labels.get(names.CREATED_BY_LABEL) or "")
        if uid:
            for vmi in self.caches.vmis.store.by_index(BY_NAMESPACE, ns):
                if _meta(vmi).get("uid") == uid:
                    return str(_meta(vmi).get("name") or ""), uid
        return "", ""

    def _other_user(self, claim: Obj, vmi_name: str) -> str:
        """Another live VMI the claim is attached to ("" when none; ``model.claims``: a VMI
        being deleted is still live). An attachment naming this VMI's name is this VMI's (or
        an earlier one's of that name, which is gone)."""
        attached = gpuclaims.attachment(claim)
        if attached is None or attached.name == vmi_name:
            return ""
        live = self.caches.vmis.store.get((str(_meta(claim).get("namespace")), attached.name))
        return attached.name if gpuclaims.is_live_user(attached, live) else ""

    # ---- gated pods ------------------------------------------------------------------------
    def _place(
        self, pod: Obj, vmi_name: str, vmi_uid: str, claim_names: list[str], made: set[str]
    ) -> Result | None:
        ns = str(_meta(pod).get("namespace"))
        vmi = self.caches.vmis.store.get((ns, vmi_name))
        if vmi is not None and _meta(vmi).get("deletionTimestamp"):
            log.info("pod of a VMI being deleted left gated", reason="VMIDeleting", vmi=vmi_name)
            return None
        owner = {"metadata": {"uid": vmi_uid}}
        claims: list[Obj] = []
        for name in claim_names:
            claim = self.caches.claims.store.get((ns, name))
            if claim is None:
                why = " (it is made from the VM's claim template)" if name in made else ""
                return self._wait(pod, "Normal", f"claim {name} does not exist yet{why}")
            if _meta(claim).get("deletionTimestamp"):
                return self._wait(pod, "Warning", f"claim {name} is being deleted")
            if name in made and vmi_uid and not templates.is_template_claim_of(claim, owner):
                return self._wait(
                    pod,
                    "Normal",
                    f"claim {name} is not this VM instance's template claim (an earlier VM "
                    "instance's, not yet removed, or a claim of the same name made by hand)",
                )
            other = self._other_user(claim, vmi_name)
            if other:
                return self._wait(
                    pod,
                    "Warning",
                    f"claim {name} is attached to VM instance {other}, which still exists; "
                    f"this VM instance waits until {other} is gone",
                )
            if name not in made and gpuclaims.attachment(claim) != gpuclaims.VmiRef(
                vmi_name, vmi_uid
            ):
                return self._wait(
                    pod,
                    "Normal",
                    f"claim {name} is not attached to this VM instance yet (the attachments "
                    "controller records it)",
                )
            if not gpuclaims.is_bound(claim):
                bound = (
                    conditions.find(_status(claim).get("conditions"), gpuclaims.BOUND_CONDITION)
                    or {}
                )
                why = bound.get("message") or "not bound yet"
                return self._wait(
                    pod, "Normal", f"claim {name} is {gpuclaims.phase(claim) or 'new'}: {why}"
                )
            claims.append(claim)
        nodes = sorted({gpuclaims.node_name(c) for c in claims})
        if len(nodes) == 1:
            node = nodes[0]
            if not self.inventory.has_node(node):
                return self._wait(
                    pod, "Normal", f"node {node} of the claims is gone; they will be bound again"
                )
            return self._pin(pod, node, claim_names)
        return self._gather(pod, vmi_name, claims)

    def _pin(self, pod: Obj, node: str, claim_names: list[str]) -> Result | None:
        key = key_of(pod)
        full = pod  # the cached gated pod carries everything the patch is built from
        try:
            try:
                self.writer.patch(
                    pykube.Pod, key[1], launcher_pods.pin_and_ungate(pod, node), key[0]
                )
            except errors.ConflictError:
                # The cache is behind the pod: judge the version the API server has.
                full = self.writer.get(pykube.Pod, key[1], key[0])
                if not launcher_pods.is_gated(full) or _meta(full).get("uid") != _meta(pod).get(
                    "uid"
                ):
                    log.info("pod changed meanwhile; judging again", reason="Stale")
                    return Result(requeue_after=RETRY)
                self.writer.patch(
                    pykube.Pod, key[1], launcher_pods.pin_and_ungate(full, node), key[0]
                )
        except errors.ConflictError:
            log.info("pod changed meanwhile; judging again", reason="Conflict")
            return Result(requeue_after=RETRY)
        except errors.NotFoundError:
            return None
        except errors.InvalidError as exc:
            log.warning("pin refused by the API server", reason=PIN_FAILED, error=exc.message)
            self._event_pod(full, "Warning", PIN_FAILED, f"could not pin to node {node}: {exc}")
            return None
        self._forget(key)
        with self._lock:
            self._pinned[key] = str(_meta(pod).get("uid") or "")
        log.info("pod pinned", reason=PINNED, node=node, claims=claim_names)
        self._event_pod(
            full,
            "Normal",
            PINNED,
            f"pinned to node {node}, where its claims {', '.join(claim_names)} are bound; "
            f"scheduling gate {names.PLACEMENT_GATE} removed",
        )
        return None

    def _gather(self, pod: Obj, vmi_name: str, claims: list[Obj]) -> Result | None:
        """Move the claims bound elsewhere to one node of the set, or say why not."""
        with self.inventory.allocation_lock:
            # Judge on the inventory's view: another reconcile may have just moved claims.
            # Not on a state whose write is unconfirmed: a move would rest on the stored
            # version's resourceVersion, not on that state.
            if any(self.inventory.unconfirmed(key_of(c)) for c in claims):
                return Result(requeue_after=RETRY)
            fresh = [self.inventory.claim(key_of(c)) or c for c in claims]
            if len({gpuclaims.node_name(c) for c in fresh}) == 1:
                return Result(requeue_after=RETRY)
            plan = self._move_plan(fresh)
            target, moving, why = plan.target, plan.moving, plan.why
            if target is None:
                where = ", ".join(f"{_meta(c)['name']} on {gpuclaims.node_name(c)}" for c in fresh)
                return self._wait(
                    pod,
                    "Warning",
                    f"the claims are bound to different nodes ({where}) and none of these "
                    f"nodes can take the others now: {why}",
                )
            for claim in moving:
                if not self._move(claim, target, vmi_name):
                    return Result(requeue_after=RETRY)
        # The claims' updates bring this pod back to be pinned; the look-again is a safety
        # net for a claim whose update maps to no VMI (an attachment cleared meanwhile).
        return Result(requeue_after=WAIT_RECHECK)

    def _move_plan(self, claims: list[Obj]) -> gathering.Gathering:
        """Where ``claims`` gather, on the inventory's figures (``model.gathering``)."""
        class_free: dict[str, dict[str, int] | None] = {}
        for node in {gpuclaims.node_name(c) for c in claims}:
            if not self.inventory.has_node(node):
                class_free[node] = None
                continue
            view = self.inventory.node(node)
            class_free[node] = {c["name"]: c["free"] for c in view.classes} if view else {}
        resources: dict[str, str] = {}
        for class_name in {orders.ordered_class(c) for c in claims}:
            cls = self.caches.classes.store.get(("", class_name))
            resources[class_name] = gpuclasses.resource_name(cls) if cls is not None else ""
        return gathering.gather(claims, class_free, resources, self.clock.now())

    def _move(self, claim: Obj, target: str, vmi_name: str) -> bool:
        now = self.clock.now()
        source = gpuclaims.node_name(claim)
        message = (
            f"moved from node {source} to node {target} to join the other claims of VM "
            f"instance {vmi_name}"
        )
        status = claim_states.moved(claim, target, message, now)
        announce = Announcement(
            "claim moved",
            claim_states.MOVED,
            message,
            fields={"source": source, "node": target, "vmi": vmi_name},
        )
        return self.statuses.write(claim, status, announce).ok

    # ---- refused pods ----------------------------------------------------------------------
    def _refused(
        self, pod: Obj, vmi_name: str, vmi_uid: str, claim_names: list[str]
    ) -> Result | None:
        key = key_of(pod)
        try:
            full = self.writer.get(pykube.Pod, key[1], key[0])
        except errors.NotFoundError:
            return None
        if not maybe_refused(full) or _meta(full).get("uid") != _meta(pod).get("uid"):
            return None  # the cache was behind: the pod was scheduled or replaced
        node = launcher_pods.pinned_node(full)
        if node is None:
            log.info("unschedulable pod not pinned by the operator; left alone", reason="NotPinned")
            return None
        claims = [c for c in (self.caches.claims.store.get((key[0], n)) for n in claim_names) if c]
        scheduled = conditions.find(_status(full).get("conditions"), "PodScheduled") or {}
        said = str(scheduled.get("message") or "")
        wait = self._settling(key, full, said, node, claims)
        if wait is not None:
            return Result(requeue_after=wait)
        # The pod goes first, and only as it was read: kube-scheduler may place it at any
        # moment (the refusal was its last attempt, not its last word), and its binding
        # changes the resourceVersion. A pod placed meanwhile runs where its claims are bound,
        # so they must stay there; only once the refused pod is gone are they unbound.
        try:
            self.writer.delete(
                pykube.Pod,
                key[1],
                key[0],
                uid=_meta(full).get("uid"),
                resource_version=_meta(full).get("resourceVersion"),
            )
        except errors.ConflictError:
            log.info("refused pod changed before its deletion; judging again", reason="Stale")
            return Result(requeue_after=RETRY)
        except errors.NotFoundError:
            log.info("refused pod gone before its deletion; nothing refused", reason="Gone")
            self._forget(key)
            return None
        self._forget(key)
        now = self.clock.now()
        owed = _Refusal(
            pod=full,
            node=node,
            detail=said or UNSCHEDULABLE,
            now=now,
            until=now + datetime.timedelta(seconds=self.settings.refusal_ttl),
            vmi_name=vmi_name,
            vmi_uid=vmi_uid,
            claim_names=tuple(claim_names),
        )
        with self._lock:
            self._owed[key] = owed
        log.warning(
            "pinned pod refused by its node; deleted",
            reason=REFUSED,
            node=node,
            detail=owed.detail,
            until=str(owed.until),
        )
        return self._record(key, owed)

    def _record(self, key: Key, owed: _Refusal) -> Result | None:
        """Record a refusal whose pod is deleted: each claim of the set that no other live VM
        uses skips the node, and the claims Bound there go back to Pending. A claim write that
        loses a race is tried again on the next look (the pod is gone; the refusal is owed)."""
        for name in owed.claim_names:
            cached = self.caches.claims.store.get((key[0], name))
            if cached is None:
                continue
            claim = self.inventory.claim(key_of(cached)) or cached  # our own writes included
            if _meta(claim).get("deletionTimestamp"):
                continue
            other = self._other_user(claim, owed.vmi_name)
            if other:
                log.info(
                    "claim of another live VM left as it is",
                    reason="AttachedElsewhere",
                    claim=name,
                    vmi=other,
                )
                continue
            if not self._refuse(claim, owed, key):
                return Result(requeue_after=RETRY)
        with self._lock:
            self._owed.pop(key, None)
        message = (
            f"node {owed.node} refused launcher pod {key[1]} ({owed.detail}); the pod was "
            f"deleted, so this VM instance fails and its VM starts again after KubeVirt's "
            f"backoff; the claims skip the node until {conditions.stamp(owed.until)} and are "
            "placed again"
        )
        vmi = self.caches.vmis.store.get((key[0], owed.vmi_name))
        if vmi is not None and (not owed.vmi_uid or _meta(vmi).get("uid") == owed.vmi_uid):
            self.recorder.event(
                vmi,
                "Warning",
                REFUSED,
                message,
                kind=names.VMI_KIND,
                api_version=names.KUBEVIRT_API_VERSION,
            )
        else:
            self._event_pod(owed.pod, "Warning", REFUSED, message)
        return None

    def _settling(
        self, key: Key, pod: Obj, said: str, node: str, claims: list[Obj]
    ) -> float | None:
        """Seconds to wait before taking the refusal kube-scheduler ``said`` (``None``: take
        it now): ``node`` still
        carries a lifecycle taint its state no longer calls for
        (``eligibility.lagging_taints``), kube-scheduler's view of it lags behind the API
        (``node_selection.scheduler_view_lags``), or pods being deleted there still request
        one of the claims' resources, within :data:`SETTLE` seconds of this replica first
        seeing the refusal."""
        uid = str(_meta(pod).get("uid") or "")
        mono = self.clock.monotonic()
        with self._lock:
            seen = self._refused_since.get(key)
            if seen is None or seen[0] != uid:
                seen = self._refused_since[key] = (uid, mono)
        left = SETTLE - (mono - seen[1])
        if left <= 0:
            return None
        why = (
            self._lagging_taints(node)
            or self._unseen_node(node, pod, said)
            or self._releasing(node, claims)
        )
        if why is None:
            return None
        message, reason, detail = why
        log.info(message, reason=reason, node=node, **detail)
        return max(RETRY, min(left, 5.0))

    def _lagging_taints(self, node: str) -> tuple[str, str, dict[str, Any]] | None:
        """Why a refusal on ``node`` waits for its lifecycle taints to catch up, if it does."""
        cached = self.caches.nodes.store.get(("", node))
        lagging = eligibility.lagging_taints(cached) if cached is not None else []
        if not lagging:
            return None
        message = "refusal deferred: the node still carries taints its state no longer calls for"
        return message, "NodeTaintsLag", {"taints": lagging}

    def _unseen_node(
        self, node: str, pod: Obj, said: str
    ) -> tuple[str, str, dict[str, Any]] | None:
        """Why a refusal on ``node`` waits for kube-scheduler's view of the node to catch up
        with the API, if it does (``node_selection.scheduler_view_lags``)."""
        cached = self.caches.nodes.store.get(("", node))
        if cached is None or not node_selection.scheduler_view_lags(pod, cached, said):
            return None
        why = (
            "refusal deferred: kube-scheduler rejected every node for node affinity alone, "
            "which the node satisfies; its view of the node lags behind"
        )
        return why, "SchedulerViewLags", {"scheduler": said}

    def _releasing(self, node: str, claims: list[Obj]) -> tuple[str, str, dict[str, Any]] | None:
        """Why a refusal on ``node`` waits for pods being deleted there that still request
        one of the claims' resources, if it does."""
        resources: set[str] = set()
        for claim in claims:
            cls = self.caches.classes.store.get(("", orders.ordered_class(claim)))
            if cls is not None and gpuclasses.resource_name(cls):
                resources.add(gpuclasses.resource_name(cls))
        leaving = sorted(
            _text(key_of(p))
            for p in self.caches.pods.store.by_index(BY_NODE, node)
            if _meta(p).get("deletionTimestamp")
            and not pods.is_terminated(p)
            and resources & set(pods.requests(p))
        )
        if not leaving:
            return None
        message = "refusal deferred: pods being deleted still hold GPUs there"
        return message, "NodeReleasing", {"pods": leaving}

    def _refuse(self, claim: Obj, owed: _Refusal, pod_key: Key) -> bool:
        node, now, until = owed.node, owed.now, owed.until
        unbind = gpuclaims.is_bound_to(claim, node)
        message = (
            f"node {node} refused launcher pod {pod_key[1]} ({owed.detail}); it is skipped "
            f"until {conditions.stamp(until)}"
        )
        if unbind:
            message += "; the claim is bound again elsewhere"
        status = claim_states.refused(claim, node, until, REFUSED, message, now)
        announce = Announcement(
            "node refusal recorded",
            REFUSED,
            message,
            event="Warning",
            fields={"node": node, "unbound": unbind},
        )
        return self.statuses.write(claim, status, announce).outcome is not Outcome.CHANGED

    # ---- reporting -------------------------------------------------------------------------
    def _wait(self, pod: Obj, type_: EventType, message: str) -> Result:
        key = key_of(pod)
        with self._lock:
            changed = self._waits.get(key) != message
            self._waits[key] = message
        if changed:
            log.info("pod waits for placement", reason=WAITING, detail=message)
            self._event_pod(pod, type_, WAITING, message)
        return Result(requeue_after=WAIT_RECHECK)

    def _event_pod(self, pod: Obj, type_: EventType, reason: str, message: str) -> None:
        self.recorder.event(pod, type_, reason, message, kind="Pod", api_version="v1")

    def _forget(self, key: Key) -> None:
        with self._lock:
            self._waits.pop(key, None)
            self._refused_since.pop(key, None)
            self._pinned.pop(key, None)

    def seen_unwatched(self, key: Key) -> None:
        """The cache shows the pod at ``key`` as nothing this controller acts on (pinned and
        caught up, scheduled, gone): whatever was remembered about it is dropped."""
        if key in self._pinned or key in self._waits or key in self._refused_since:
            self._forget(key)


# ---- wiring ----------------------------------------------------------------------------------


def pods_of_vmi(caches: Caches, namespace: str, vmi_name: str) -> list[Key]:
    """The watched pods of the VMI ``vmi_name``."""
    return sorted(
        key_of(pod)
        for pod in caches.pods.store.by_index(BY_NAMESPACE, namespace)
        if watched(pod) and vmi_name_of(pod) == vmi_name
    )


def vmis_of_claim(claim: Obj) -> set[str]:
    """The VMIs a claim serves: the one its attachment names and the one controlling it."""
    refs = (gpuclaims.attachment(claim), gpuclaims.controlling_vmi(claim))
    return {ref.name for ref in refs if ref is not None}


def register(
    manager: Manager,
    caches: Caches,
    inventory: Ledger,
    statuses: ClaimStatus,
    recorder: Recorder,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    placement = Placement(
        caches, inventory, manager.writer, statuses, recorder, settings, clock=manager.clock
    )
    controller = manager.controller(
        NAME,
        placement,
        workers=workers,
        seed=lambda: [key_of(p) for p in caches.pods.store.values() if watched(p)],
    )

    def own_pod(pod: Obj) -> list[Key]:
        if watched(pod):
            return [key_of(pod)]
        placement.seen_unwatched(key_of(pod))
        return []

    def from_claim(claim: Obj) -> list[Key]:
        ns = str(_meta(claim).get("namespace") or "")
        return [key for vmi in vmis_of_claim(claim) for key in pods_of_vmi(caches, ns, vmi)]

    def from_vmi(vmi: Obj) -> list[Key]:
        return pods_of_vmi(caches, str(_meta(vmi).get("namespace") or ""), _meta(vmi)["name"])

    manager.add_controller(
        controller,
        [(caches.pods, own_pod), (caches.claims, from_claim), (caches.vmis, from_vmi)],
    )
    return controller
