"""Placement: a VM's launcher pod pinned to the node its claims are bound to, and moved on
when that node rejects it (docs/design.md §5 "VMs").

Key: a pod ``(namespace, name)`` — a launcher pod or KubeVirt's temporary pod for
WaitForFirstConsumer volumes (``launcher_pods.launcher_pod_kind``) of a VM with claim
references, or a live migration's target pod the pod webhook gated (docs/design.md §5 "Live
migration"). Two situations are handled:

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
* all of DRA classes (the VMI webhook admits at most one such claim, and none beside
  it): ONE merge patch (``launcher_pods.ungate``) removes the gate and pins nothing:
  kube-scheduler places the pod on the node of the claims' allocated ResourceClaims, which
  the pod names. Event ``Ungated`` on the pod.
* Bound to several nodes: the set is gathered on one of them, as ``model.gathering``
  decides on the ledger's figures. Candidate targets are the set's nodes, the one holding
  most of its units first; the claims on other nodes are moved there when the target is
  eligible for their classes and has free units of each resource for all of them together
  (classes may share a resource), and no moving claim refused the target. A move rewrites
  the claim's status (``nodeName``, ``boundTime``, the ``Bound`` condition with reason
  ``Moved``) with the claim's resourceVersion and is fed to the ledger at once, so the
  binder's next plan sees it. The claims of this VM are not attached to any running VM (the
  pod waits otherwise), so moving them stops nothing.
  When no target fits, the pod stays gated and the Event ``WaitingForPlacement`` says why;
  it is looked at again every :data:`WAIT_RECHECK` seconds (capacity frees without any
  event on this pod).

**A gated migration target** (label ``kubevirt.io/migrationJobUID``) waits as a launcher pod
does until every claim of its VMI exists, is attached to this VMI (or is its template claim)
and is Bound; then until every claim carries the transient hold of this very migration
(``status.migration.uid`` equal to the pod's label) and all name one node that is neither the
VMI's node nor a claim's (``model.migration_targets.target_node``). ONE merge patch pins it
there and removes the gate, as for a launcher pod (its classes' tolerations the pod webhook
added). Event ``Pinned`` on the pod. It is never gathered and never moves a claim: the
migrations controller writes the transient holds, and KubeVirt deletes a target that stays
pending too long (the migration fails; the VM runs on).

**A pinned pod reported Unschedulable** (no gate, PodScheduled False with reason
``Unschedulable``, and the required affinity ``pin_and_ungate`` wrote): the node rejected the
set. ``controllers.node_rejections`` takes the rejection (the pod is deleted) once it is not
transient, and records it on the set's claims, which go back to ``Pending`` when Bound to
that node, so the binder places them elsewhere. A refused migration target is deleted the
same way (KubeVirt fails the migration, the VM keeps running on its source), but its claims
stay Bound where they are: the node only joins their ``refusedNodes``.

Choices where docs/design.md is silent:

* **Moves never race the binder.** A move is decided and written while holding
  ``Ledger.allocation_lock``, the lock every binder pass and drain move holds too, and it
  goes through the same write-back (``claim_status``): counted in the ledger before it is
  sent, kept there until the watch delivers a newer version.
* ``gpuForVMs`` off does not stop this controller: a gated pod was admitted while it was on,
  and pinning it is the only correct way to remove the operator's gate.
* Waits are reported once per message (log line and Event), not on every look.
* **A pod this replica pinned is not judged again while the cache still shows it gated.**
  A scheduling gate cannot be added back after a pod's creation, so a cached pod of the
  same uid older than the pin (``runtime.own_writes``) is only the cache lagging behind it:
  the watch brings the pinned version; reading or patching the pod again would be wasted
  requests.
"""

from __future__ import annotations

import threading
from typing import Any, Final, Protocol

import pykube
import structlog

from controllers import node_rejections
from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.ledger import Ledger
from gpuoperator.model import (
    claim_states,
    conditions,
    gathering,
    launcher_pods,
    migration_targets,
    orders,
    references,
    templates,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.own_writes import OwnWrites
from gpuoperator.runtime.recording import EventType
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "placement"
#: Seconds after which a waiting pod is looked at again without any event.
WAIT_RECHECK: Final = 30.0
#: Seconds before a reconcile that lost a write race looks again.
RETRY: Final = 1.0


PINNED = "Pinned"
#: The gate removed without a pin (a VM on claims of DRA classes).
UNGATED = "Ungated"
WAITING = "WaitingForPlacement"
PIN_FAILED = "PinFailed"

# ---- reading objects -----------------------------------------------------------------------


def _meta(obj: Obj | None) -> dict[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def _status(obj: Obj | None) -> dict[str, Any]:
    status = (obj or {}).get("status")
    return status if isinstance(status, dict) else {}


# ---- the controller --------------------------------------------------------------------------


class ApiAccess(protocols.Gets, protocols.Patches, protocols.Deletes, Protocol):
    """What placement asks of the API server: pods read live, patched (the pin) and deleted (a
    node rejection, ``node_rejections``)."""


class Placement:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        writer: ApiAccess,
        statuses: ClaimStatus,
        recorder: protocols.RecordsEvents,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.writer = writer
        self.statuses = statuses
        self.recorder = recorder
        self.clock = clock
        self._lock = threading.Lock()
        #: pod key -> the last wait message reported (Events and logs only on change)
        self._waits: dict[Key, str] = {}
        #: pod key -> the pod as this replica pinned it, until the cache shows that version
        self._pinned: OwnWrites[Key] = OwnWrites()
        self.rejections = node_rejections.NodeRejections(
            caches, ledger, writer, statuses, recorder, settings, clock=clock
        )

    def reconcile(self, key: Key) -> Result | None:
        owed = self.rejections.owed(key)
        if owed is not None:
            return self.rejections.record(key, owed)
        pod = self.caches.pods.store.get(key)
        if pod is None or not launcher_pods.watched(pod):
            self._forget(key)
            return None
        vmi_name, vmi_uid = self._vmi_of(pod)
        if not vmi_name:
            return self._report_waiting(
                pod,
                "Warning",
                "the pod names no VM instance (no controller ownerReference to a "
                f"{names.VMI_KIND}, no {names.VM_NAME_LABEL} or {names.CREATED_BY_LABEL} label)",
            )
        try:
            refs = references.from_object(pod)
        except references.AnnotationError as exc:
            return self._report_waiting(pod, "Warning", str(exc))
        claim_names = templates.claim_names(vmi_name, refs)
        made = {
            name
            for name, ref in zip(claim_names, refs, strict=True)
            if isinstance(ref, references.TemplateRef)
        }
        if launcher_pods.needs_pin(pod):
            if self._pinned.current(key, pod) is not pod:
                log.debug("pinned already; the cache has not caught up", reason="Pinned")
                return None
            return self._place(pod, vmi_name, vmi_uid, claim_names, made)
        result, gone = self.rejections.take(pod, vmi_name, vmi_uid, claim_names)
        if gone:
            self._forget(key)
        return result

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
        """Another live VMI the claim is attached to ("" when none;
        ``claims.other_live_user``)."""
        ns = str(_meta(claim).get("namespace"))
        return gpuclaims.other_live_user(
            claim, vmi_name, lambda vmi: self.caches.vmis.store.get((ns, vmi))
        )

    # ---- gated pods ------------------------------------------------------------------------
    def _place(
        self, pod: Obj, vmi_name: str, vmi_uid: str, claim_names: list[str], made: set[str]
    ) -> Result | None:
        ns = str(_meta(pod).get("namespace"))
        vmi = self.caches.vmis.store.get((ns, vmi_name))
        if vmi is not None and _meta(vmi).get("deletionTimestamp"):
            log.info("pod of a VMI being deleted left gated", reason="VMIDeleting", vmi=vmi_name)
            return None
        claims = self._ready_claims(pod, vmi_name, vmi_uid, claim_names, made)
        if isinstance(claims, Result):
            return claims
        if migration_targets.is_target(pod):
            return self._place_target(pod, vmi, claims, claim_names)
        if all(self._is_dra(c) for c in claims):
            # kube-scheduler places the pod on the node of its allocated holds: no pin.
            return self._pin(pod, None, claim_names)
        nodes = sorted({gpuclaims.node_name(c) for c in claims})
        if len(nodes) == 1:
            node = nodes[0]
            if not self.ledger.has_node(node):
                return self._report_waiting(
                    pod, "Normal", f"node {node} of the claims is gone; they will be bound again"
                )
            return self._pin(pod, node, claim_names)
        return self._gather(pod, vmi_name, claims)

    def _place_target(
        self, pod: Obj, vmi: Obj | None, claims: list[Obj], claim_names: list[str]
    ) -> Result | None:
        """Pin a gated migration target to its claims' transient holds' node, or say why it
        waits (``model.migration_targets.target_node``)."""
        node, why = migration_targets.target_node(
            pod, claims, str(_status(vmi).get("nodeName") or "")
        )
        if node is None:
            return self._report_waiting(pod, "Normal", why)
        if not self.ledger.has_node(node):
            return self._report_waiting(
                pod, "Warning", f"node {node} of the claims' transient holds is gone"
            )
        return self._pin(pod, node, claim_names, migration=migration_targets.migration_uid(pod))

    def _ready_claims(
        self, pod: Obj, vmi_name: str, vmi_uid: str, claim_names: list[str], made: set[str]
    ) -> list[Obj] | Result:
        """Every claim of the VMI, once each exists, is this VMI's and is Bound; else the
        result of reporting why the pod waits."""
        ns = str(_meta(pod).get("namespace"))
        owner = {"metadata": {"uid": vmi_uid}}
        claims: list[Obj] = []
        for name in claim_names:
            claim = self.caches.claims.store.get((ns, name))
            if claim is None:
                why = " (it is made from the VM's claim template)" if name in made else ""
                return self._report_waiting(pod, "Normal", f"claim {name} does not exist yet{why}")
            if _meta(claim).get("deletionTimestamp"):
                return self._report_waiting(pod, "Warning", f"claim {name} is being deleted")
            if name in made and vmi_uid and not templates.is_template_claim_of(claim, owner):
                return self._report_waiting(
                    pod,
                    "Normal",
                    f"claim {name} is not this VM instance's template claim (an earlier VM "
                    "instance's, not yet removed, or a claim of the same name made by hand)",
                )
            other = self._other_user(claim, vmi_name)
            if other:
                return self._report_waiting(
                    pod,
                    "Warning",
                    f"claim {name} is attached to VM instance {other}, which still exists; "
                    f"this VM instance waits until {other} is gone",
                )
            if name not in made and gpuclaims.attachment(claim) != gpuclaims.VmiRef(
                vmi_name, vmi_uid
            ):
                return self._report_waiting(
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
                return self._report_waiting(
                    pod, "Normal", f"claim {name} is {gpuclaims.phase(claim) or 'new'}: {why}"
                )
            claims.append(claim)
        return claims

    def _is_dra(self, claim: Obj) -> bool:
        cls = self.caches.classes.store.get(("", orders.ordered_class(claim)))
        return cls is not None and gpuclasses.dra(cls) is not None

    @staticmethod
    def _update(pod: Obj, node: str | None) -> Obj:
        return (
            launcher_pods.ungate(pod) if node is None else launcher_pods.pin_and_ungate(pod, node)
        )

    def _pin(
        self, pod: Obj, node: str | None, claim_names: list[str], *, migration: str = ""
    ) -> Result | None:
        """Pin the pod to ``node`` and remove the gate; ``None``: only remove the gate (its
        claims are of DRA classes). ``migration``: the pod is the target of that migration,
        pinned to the claims' transient holds."""
        key = key_of(pod)
        full = pod  # the cached gated pod carries everything the patch is built from
        try:
            try:
                pinned = self.writer.patch(pykube.Pod, key[1], self._update(pod, node), key[0])
            except errors.ConflictError:
                # The cache is behind the pod: judge the version the API server has.
                full = self.writer.get(pykube.Pod, key[1], key[0])
                if not launcher_pods.is_gated(full) or _meta(full).get("uid") != _meta(pod).get(
                    "uid"
                ):
                    log.info("pod changed meanwhile; judging again", reason="Stale")
                    return Result(requeue_after=RETRY)
                pinned = self.writer.patch(pykube.Pod, key[1], self._update(full, node), key[0])
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
        self._pinned.wrote(key, pinned)
        if node is None:
            log.info("pod ungated", reason=UNGATED, claims=claim_names)
            self._event_pod(
                full,
                "Normal",
                UNGATED,
                f"its claims {', '.join(claim_names)} are bound (DRA classes: kube-scheduler "
                f"places the pod on the node of their devices); scheduling gate "
                f"{names.PLACEMENT_GATE} removed",
            )
            return None
        if migration:
            log.info(
                "migration target pinned",
                reason=PINNED,
                node=node,
                claims=claim_names,
                migration=migration,
            )
            where = (
                f"where the transient holds of migration {migration} keep its claims "
                f"{', '.join(claim_names)}"
            )
        else:
            log.info("pod pinned", reason=PINNED, node=node, claims=claim_names)
            where = f"where its claims {', '.join(claim_names)} are bound"
        self._event_pod(
            full,
            "Normal",
            PINNED,
            f"pinned to node {node}, {where}; scheduling gate {names.PLACEMENT_GATE} removed",
        )
        return None

    def _gather(self, pod: Obj, vmi_name: str, claims: list[Obj]) -> Result | None:
        """Move the claims bound elsewhere to one node of the set, or say why not."""
        with self.ledger.allocation_lock:
            # Judge on the ledger's view: another reconcile may have just moved claims.
            # Not on a state whose write is unconfirmed: a move would rest on the stored
            # version's resourceVersion, not on that state.
            if any(self.ledger.unconfirmed(key_of(c)) for c in claims):
                return Result(requeue_after=RETRY)
            fresh = [self.ledger.claim(key_of(c)) or c for c in claims]
            if len({gpuclaims.node_name(c) for c in fresh}) == 1:
                return Result(requeue_after=RETRY)
            plan = self._move_plan(fresh)
            target, moving, why = plan.target, plan.moving, plan.why
            if target is None:
                where = ", ".join(f"{_meta(c)['name']} on {gpuclaims.node_name(c)}" for c in fresh)
                return self._report_waiting(
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
        """Where ``claims`` gather, on the ledger's figures (``model.gathering``)."""
        class_free: dict[str, dict[str, int] | None] = {}
        for node in {gpuclaims.node_name(c) for c in claims}:
            if not self.ledger.has_node(node):
                class_free[node] = None
                continue
            view = self.ledger.node(node)
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

    # ---- reporting -------------------------------------------------------------------------
    def _report_waiting(self, pod: Obj, type_: EventType, message: str) -> Result:
        """Log the pod's wait and record it as an Event on the pod, once per message; the
        pod is looked at again after :data:`WAIT_RECHECK` seconds."""
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
        self._pinned.forget(key)
        self.rejections.forget(key)

    def seen_unwatched(self, key: Key) -> None:
        """The cache shows the pod at ``key`` as nothing this controller acts on (pinned and
        caught up, scheduled, gone): whatever was remembered about it is dropped."""
        if key in self._pinned or key in self._waits or self.rejections.remembers(key):
            self._forget(key)


# ---- wiring ----------------------------------------------------------------------------------


def pods_of_vmi(caches: Caches, namespace: str, vmi_name: str) -> list[Key]:
    """The watched pods of the VMI ``vmi_name``."""
    return sorted(
        key_of(pod) for pod in caches.pods_of_vmi(namespace, vmi_name) if launcher_pods.watched(pod)
    )


#: The VMIs a claim serves: the one its attachment names and the one controlling it.
vmis_of_claim = gpuclaims.vmi_names


class ManagerAccess(managing.Controls, managing.Clocked, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    statuses: ClaimStatus,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    placement = Placement(
        caches, ledger, manager.writer, statuses, recorder, settings, clock=manager.clock
    )
    controller = manager.controller(
        NAME,
        placement,
        workers=workers,
        seed=lambda: [key_of(p) for p in caches.pods.store.values() if launcher_pods.watched(p)],
    )

    def own_pod(pod: Obj) -> list[Key]:
        if launcher_pods.watched(pod):
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
