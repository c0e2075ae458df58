"""Node rejections: a launcher pod the placement controller pinned, which its node rejects,
taken and recorded on the claims of its set. The placement
controller hands over every pinned pod kube-scheduler reports ``Unschedulable``
(``launcher_pods.maybe_rejected``); this module holds what is remembered about them.

**Taking a rejection.** The pod is read first (only the full pod shows the affinity
``pin_and_ungate`` wrote: a pod the operator did not pin is left alone), and the rejection
waits while it may be transient (``model.node_rejections``: lagging taints, a lagging
scheduler, pods being deleted on the node), within :data:`SETTLE` seconds counted from when
this replica first saw the pod rejected. The pod is then deleted, with its UID and the
resourceVersion it was judged on as preconditions: kube-scheduler retries a rejected pod by
itself, and a pod it placed between the look and the deletion (its binding changes the
resourceVersion) is judged again instead, so a running launcher pod is never separated from
its claims. KubeVirt then fails the VMI and the VirtualMachine controller starts a new one
after its backoff (deletion is the last resort, used only here).

**Recording it.** Each claim of the VMI that no other live VM uses gets the node in
``status.refusedNodes`` until ``now + refusalTTL`` (``binding.add_refusal``); the claims
Bound to that node go back to ``Pending`` without ``nodeName`` (the ``Bound`` condition says
``RefusedByNode``), so the binder places them elsewhere, skipping the node. A claim write
that loses a race is tried again: the rejection is owed until written (in memory: a replica
that dies in between loses it, and the set's next pod, pinned to the same node, is judged
afresh). Events ``RefusedByNode`` on each claim and on the VMI (on the pod when the VMI is
gone or replaced).

Claims attached to another live VM are left as they are: the set cannot have been pinned
with them, and their binding is that VM's.

**A refused migration target** (docs/design.md §5 "Live migration") is taken the same way:
deleted under the same preconditions once the rejection is not transient, so KubeVirt fails
the migration while the VM keeps running on its source node. Its claims stay Bound where
they are: the target node joins their ``refusedNodes`` (the next migration's target, like
the binder, skips it until ``until``), and a claim Bound to the refusing node itself (which a
target is never pinned to) is left alone rather than unbound. The migrations controller
clears the transient holds once the target pod is gone.

The Event, log and condition reason ``RefusedByNode`` and the field ``refusedNodes`` are
API and keep their names.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from typing import Final, Protocol

import pykube
import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NODE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus, Outcome
from gpuoperator.ledger import Ledger
from gpuoperator.model import (
    claim_states,
    conditions,
    launcher_pods,
    migration_targets,
    objects,
    orders,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import node_rejections as rules
from gpuoperator.model.node_rejections import Rejection
from gpuoperator.runtime import errors, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

#: Seconds a rejection may wait for what makes it transient (lagging taints, a lagging
#: scheduler, pods being deleted on the node) to pass.
SETTLE: Final = 60.0
#: Seconds before a rejection whose pod changed, or whose claim write lost a race, is looked
#: at again.
RETRY: Final = 1.0
#: The longest wait between two looks at a rejection that waits.
RECHECK: Final = 5.0

#: Event, log and ``Bound`` condition reason (API: unchanged).
REFUSED_BY_NODE: Final = "RefusedByNode"


class ApiAccess(protocols.Gets, protocols.Deletes, Protocol):
    """What node rejections ask of the API server: the pod read live, and deleted under
    preconditions."""


@dataclasses.dataclass(eq=False)
class NodeRejections:
    """The placement controller's node rejections. Of one pod key at a time (the placement
    controller never reconciles a key twice at once) it keeps when this replica first saw
    its pod rejected, and the rejection owed to the claims once the pod is deleted."""

    caches: Caches
    ledger: Ledger
    writer: ApiAccess
    statuses: ClaimStatus
    recorder: protocols.RecordsEvents
    settings: Settings
    clock: Clock = dataclasses.field(default=SYSTEM, kw_only=True)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    #: pod key -> (pod uid, monotonic time this replica first saw it rejected)
    _since: dict[Key, tuple[str, float]] = dataclasses.field(default_factory=dict, init=False)
    #: pod key -> a rejection whose pod is deleted and whose claims are still to be written
    _owed: dict[Key, Rejection] = dataclasses.field(default_factory=dict, init=False)

    def owed(self, key: Key) -> Rejection | None:
        """The rejection of the pod at ``key`` still to be written on its claims, if any."""
        with self._lock:
            return self._owed.get(key)

    def remembers(self, key: Key) -> bool:
        """Whether a rejection of the pod at ``key`` is being waited on."""
        return key in self._since

    def forget(self, key: Key) -> None:
        """Drop when the pod at ``key`` was first seen rejected (an owed rejection stays)."""
        with self._lock:
            self._since.pop(key, None)

    def take(
        self, pod: Obj, vmi_name: str, vmi_uid: str, claim_names: list[str]
    ) -> tuple[Result | None, bool]:
        """Judge the cached ``pod`` kube-scheduler reports unschedulable, and take its node's
        rejection: delete the pod and record the rejection on its claims. Returns the result
        of the reconcile and whether the pod is gone (deleted here or already), so that the
        caller drops what it remembers of it."""
        key = key_of(pod)
        try:
            full = self.writer.get(pykube.Pod, key[1], key[0])
        except errors.NotFoundError:
            return None, False
        uid = objects.meta(full).get("uid")
        if not launcher_pods.maybe_rejected(full) or uid != objects.meta(pod).get("uid"):
            return None, False  # the cache was behind: the pod was scheduled or replaced
        node = launcher_pods.pinned_node(full)
        if node is None:
            log.info("unschedulable pod not pinned by the operator; left alone", reason="NotPinned")
            return None, False
        claims = [c for c in (self.caches.claims.store.get((key[0], n)) for n in claim_names) if c]
        said = rules.said(full)
        wait = self._settling(key, full, said, node, claims)
        if wait is not None:
            return Result(requeue_after=wait), False
        # The pod goes first, and only as it was read: kube-scheduler may place it at any
        # moment (the rejection was its last attempt, not its last word), and its binding
        # changes the resourceVersion. A pod placed meanwhile runs where its claims are bound,
        # so they must stay there; only once the rejected pod is gone are they unbound.
        try:
            self.writer.delete(
                pykube.Pod,
                key[1],
                key[0],
                uid=uid,
                resource_version=objects.meta(full).get("resourceVersion"),
            )
        except errors.ConflictError:
            log.info("refused pod changed before its deletion; judging again", reason="Stale")
            return Result(requeue_after=RETRY), False
        except errors.NotFoundError:
            log.info("refused pod gone before its deletion; nothing refused", reason="Gone")
            self.forget(key)
            return None, True
        self.forget(key)
        now = self.clock.now()
        owed = Rejection(
            pod=full,
            node=node,
            detail=said or launcher_pods.UNSCHEDULABLE,
            now=now,
            until=now + datetime.timedelta(seconds=self.settings.refusal_ttl),
            vmi_name=vmi_name,
            vmi_uid=vmi_uid,
            claim_names=tuple(claim_names),
            migration=(
                migration_targets.migration_uid(full) if migration_targets.is_target(full) else ""
            ),
        )
        with self._lock:
            self._owed[key] = owed
        log.warning(
            "pinned pod refused by its node; deleted",
            reason=REFUSED_BY_NODE,
            node=node,
            detail=owed.detail,
            until=str(owed.until),
            migration=owed.migration or None,
        )
        return self.record(key, owed), True

    def record(self, key: Key, owed: Rejection) -> Result | None:
        """Record a rejection whose pod is deleted: each claim of the set that no other live
        VM uses skips the node, and the claims Bound there go back to Pending. A claim write
        that loses a race is tried again on the next look (the pod is gone; the rejection is
        owed)."""
        for name in owed.claim_names:
            cached = self.caches.claims.store.get((key[0], name))
            if cached is None:
                continue
            claim = self.ledger.claim(key_of(cached)) or cached  # our own writes included
            if objects.meta(claim).get("deletionTimestamp"):
                continue
            other = gpuclaims.other_live_user(
                claim, owed.vmi_name, lambda vmi: self.caches.vmis.store.get((key[0], vmi))
            )
            if other:
                log.info(
                    "claim of another live VM left as it is",
                    reason="AttachedElsewhere",
                    claim=name,
                    vmi=other,
                )
                continue
            if not self.write(claim, owed, key):
                return Result(requeue_after=RETRY)
        with self._lock:
            self._owed.pop(key, None)
        if owed.migration:
            message = (
                f"node {owed.node} refused migration target pod {key[1]} ({owed.detail}); the "
                f"pod was deleted, so migration {owed.migration} fails and the VM keeps running "
                f"on its node; the claims stay bound there and skip node {owed.node} until "
                f"{conditions.stamp(owed.until)}"
            )
        else:
            message = (
                f"node {owed.node} refused launcher pod {key[1]} ({owed.detail}); the pod was "
                f"deleted, so this VM instance fails and its VM starts again after KubeVirt's "
                f"backoff; the claims skip the node until {conditions.stamp(owed.until)} and "
                "are placed again"
            )
        vmi = self.caches.vmis.store.get((key[0], owed.vmi_name))
        uid = objects.meta(vmi).get("uid")
        if vmi is not None and (not owed.vmi_uid or uid == owed.vmi_uid):
            self.recorder.event(
                vmi,
                "Warning",
                REFUSED_BY_NODE,
                message,
                kind=names.VMI_KIND,
                api_version=names.KUBEVIRT_API_VERSION,
            )
        else:
            self.recorder.event(
                owed.pod, "Warning", REFUSED_BY_NODE, message, kind="Pod", api_version="v1"
            )
        return None

    def _settling(
        self, key: Key, pod: Obj, said: str, node: str, claims: list[Obj]
    ) -> float | None:
        """Seconds to wait before taking the rejection kube-scheduler ``said`` (``None``: take
        it now): while it may still pass (``model.node_rejections.deferral``), within
        :data:`SETTLE` seconds of this replica first seeing it."""
        uid = str(objects.meta(pod).get("uid") or "")
        mono = self.clock.monotonic()
        with self._lock:
            seen = self._since.get(key)
            if seen is None or seen[0] != uid:
                seen = self._since[key] = (uid, mono)
        left = SETTLE - (mono - seen[1])
        if left <= 0:
            return None
        why = rules.deferral(
            pod,
            said,
            self.caches.nodes.store.get(("", node)),
            self._resources(claims),
            self.caches.pods.store.by_index(BY_NODE, node),
        )
        if why is None:
            return None
        log.info(why.message, reason=why.reason, node=node, **why.fields)
        return max(RETRY, min(left, RECHECK))

    def _resources(self, claims: list[Obj]) -> set[str]:
        """The device-plugin resources of the claims' classes."""
        resources: set[str] = set()
        for claim in claims:
            cls = self.caches.classes.store.get(("", orders.ordered_class(claim)))
            if cls is not None and gpuclasses.resource_name(cls):
                resources.add(gpuclasses.resource_name(cls))
        return resources

    def write(self, claim: Obj, owed: Rejection, pod_key: Key) -> bool:
        """Write the rejection on ``claim``: the node in ``refusedNodes``, and the claim back
        to Pending when it is Bound there. Whether the write is done (``False``: try again)."""
        node, now, until = owed.node, owed.now, owed.until
        unbind = gpuclaims.is_bound_to(claim, node)
        if owed.migration and unbind:
            # A target is never pinned to its claims' node; should the claim have been moved
            # there meanwhile, the refusal of a target does not unbind it.
            log.info(
                "claim bound to the node that refused a migration target left as it is",
                reason="MigrationTargetRefused",
                node=node,
            )
            return True
        what = "migration target pod" if owed.migration else "launcher pod"
        message = (
            f"node {node} refused {what} {pod_key[1]} ({owed.detail}); it is skipped "
            f"until {conditions.stamp(until)}"
        )
        if owed.migration:
            message += f"; migration {owed.migration} fails and the claim stays on its node"
        elif unbind:
            message += "; the claim is bound again elsewhere"
        status = claim_states.refused(claim, node, until, REFUSED_BY_NODE, message, now)
        announce = Announcement(
            "node refusal recorded",
            REFUSED_BY_NODE,
            message,
            event="Warning",
            fields={"node": node, "unbound": unbind},
        )
        return self.statuses.write(claim, status, announce).outcome is not Outcome.CHANGED
