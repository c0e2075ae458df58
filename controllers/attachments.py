"""Attachments: a held claim's ``status.attachment`` ``{vmi, uid}`` kept true to the VMIs
that exist (docs/design.md §2 GPUClaim, §5 "VMs"). This controller is the attachment's only
writer: the VMI webhook writes nothing, so a review sent to it (forged or not) cannot mark a
claim attached.

Key: a claim ``(namespace, name)``. This controller

* **attaches** a held claim that has no attachment to the live VMI (existing, not being
  deleted, not finished, with a UID) that names it in its references — by name and UID at
  once. Of several such VMIs (two admitted at once for one claim: the webhook judged each
  before the other existed) the **oldest** gets it: by ``creationTimestamp``, then name,
  then UID. The others wait: placement never pins a launcher pod whose held claim is
  attached to another VMI, so their pods stay gated until the holder is gone and the claim
  passes to the next;
* **clears** an attachment whose VMI is gone or has another UID (the attachment was
  recorded for an earlier VMI of that name) — at once, after a live read confirms what the
  cache says. A VMI being deleted is still the claim's user (``model.claims``): its launcher
  pod may hold the GPU during the VM's graceful shutdown, so its attachment stays until it is
  gone and no other VM can take the claim meanwhile;
* **fills** the UID of an attachment without one (written by an earlier version, whose VMI
  webhook recorded the name at admission) once that VMI exists and names the claim, and
  clears such an attachment that stayed unconfirmed for :data:`GRACE` seconds when a live
  read still does not find a VMI that uses the claim.

An attachment, once recorded for a live VMI, is never moved to another while that VMI
lives, even to an older one seen later (its launcher pod may already run on the claim's
units); the cache delivers VMIs in creation order, so the oldest is normally the first seen.

**Who holds, who waits** (decided here, where the claim is the object of record; the VMI is
KubeVirt's): the claim's condition ``Attached`` says which VM instance holds it — True with
reason ``Attached``, or ``VMsWaiting`` naming the VM instances that also want it — and False
(``NotAttached``) when none does. Each waiting VMI gets a Warning Event ``ClaimInUse`` naming
the VM instance that holds the claim, once per change of the waiters (written together with
the condition). The waiting launcher pod's own Event (``WaitingForPlacement``) says the same.

Every write is a merge patch of the status subresource carrying the claim's
resourceVersion, so it fails with a conflict if anyone wrote meanwhile, and the claim is
judged again on its new state.

**The grace rule** (attachments without UID only). Such an attachment is cleared only when
the same claim state (same resourceVersion, same VMI name) has been seen unconfirmed for
:data:`GRACE` seconds by this replica, and a live GET of the VMI then still finds no VMI that
would confirm it. The timer lives in memory: a leader change starts it again, which only
delays a clear.

Events on the claim: ``Attached`` (recorded) and ``Detached`` (why the attachment was
cleared); log lines carry the finer reason.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches, own_key
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.model import attachments as rules
from gpuoperator.model import claim_states, conditions, orders, references
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "attachments"
#: Seconds an attachment may stay unconfirmed (no UID, no VMI) before it is cleared.
GRACE: Final = 30.0

#: Event reason for an attachment recorded (also the ``Attached`` condition's reason).
ATTACHED = rules.ATTACHED
DETACHED = "Detached"
CLAIM_IN_USE = "ClaimInUse"
CONDITION = rules.CONDITION


def _meta(obj: Obj | None) -> dict[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


class ApiAccess(protocols.Gets, protocols.Patches, Protocol):
    """What the attachments controller asks of the API server: live reads of VMIs, and merge
    patches of claim status."""


class Attachments:
    def __init__(
        self,
        caches: Caches,
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        grace: float = GRACE,
    ) -> None:
        self.caches = caches
        self.writer = writer
        self.recorder = recorder
        self.settings = settings
        self.clock = clock
        self.grace = grace
        #: claim key -> ((vmi name, claim resourceVersion), monotonic time first seen so)
        self._unconfirmed: dict[Key, tuple[tuple[str, str], float]] = {}
        self._lock = threading.Lock()

    def reconcile(self, key: Key) -> Result | None:
        claim = self.caches.claims.store.get(key)
        attached = rules.recorded(claim) if claim is not None else {}
        vmi_name = str(attached.get("vmi") or "")
        if claim is None or not vmi_name or attached.get("uid"):
            self._forget(key)
        if claim is None:
            return None
        if not vmi_name:
            return self._restore(claim)
        vmi = self.caches.vmis.store.get((key[0], vmi_name))
        if attached.get("uid"):
            why = rules.stale_reason(attached, vmi)
            if why is None:
                self._report_waiters(claim)
                return None
            live = self.writer.get_or_none(VirtualMachineInstance, vmi_name, key[0])
            why = rules.stale_reason(attached, live)
            if why is None:
                log.info("cache behind; attachment holds", reason="VMIExists", vmi=vmi_name)
                return None
            self._clear(claim, *why)
            return None
        if rules.confirms(vmi, key[1]):
            assert vmi is not None
            self._fill(claim, vmi)
            return None
        waited = self._waited(key, claim, vmi_name)
        if waited < self.grace:
            log.debug("attachment unconfirmed; waiting", reason="Unconfirmed", vmi=vmi_name)
            return Result(requeue_after=self.grace - waited)
        live = self.writer.get_or_none(VirtualMachineInstance, vmi_name, key[0])
        if rules.confirms(live, key[1]):
            assert live is not None
            self._fill(claim, live)
            return None
        if live is None:
            why = (
                "VMNeverAppeared",
                f"VM instance {vmi_name} was not created within {self.grace:g}s of its "
                "attachment (its create failed)",
            )
        else:
            why = (
                "VMDoesNotUseClaim",
                f"VM instance {vmi_name} does not name this claim in its references",
            )
        self._clear(claim, *why)
        return None

    # ---- the unconfirmed timer ----------------------------------------------------------
    def _waited(self, key: Key, claim: Obj, vmi_name: str) -> float:
        state = (vmi_name, str(_meta(claim).get("resourceVersion") or ""))
        now = self.clock.monotonic()
        with self._lock:
            seen = self._unconfirmed.get(key)
            if seen is None or seen[0] != state:
                self._unconfirmed[key] = (state, now)
                return 0.0
            return now - seen[1]

    def _forget(self, key: Key) -> None:
        with self._lock:
            self._unconfirmed.pop(key, None)

    # ---- writes ---------------------------------------------------------------------------
    def _waiting(self, claim: Obj, holder: str) -> list[Obj]:
        """The live VMIs other than ``holder`` that name the claim (oldest first)."""
        ns, name = _meta(claim)["namespace"], _meta(claim)["name"]
        vmis = self.caches.vmis.store.by_index(BY_NAMESPACE, ns)
        return [v for v in rules.live_users(vmis, name) if _meta(v).get("name") != holder]

    def _patch(
        self, claim: Obj, new_attachment: dict[str, Any] | None, waiting: Sequence[Obj] = ()
    ) -> bool:
        """Write the attachment and the ``Attached`` condition with the claim's
        resourceVersion; ``False`` when the claim changed or went meanwhile."""
        meta = _meta(claim)
        holder = str((new_attachment or {}).get("vmi") or "")
        waiters = [str(_meta(v)["name"]) for v in waiting]
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": claim_states.attached(claim, new_attachment, waiters, self.clock.now()),
        }
        try:
            self.writer.patch(GPUClaim, meta["name"], body, meta["namespace"], subresource="status")
        except (errors.ConflictError, errors.NotFoundError) as exc:
            # The claim changed (or went) meanwhile: its new state is judged on the next event.
            log.info("claim changed meanwhile; judging again", reason=exc.reason)
            return False
        for vmi in waiting:
            self._tell_waiting(vmi, claim, holder)
        return True

    def _tell_waiting(self, vmi: Obj, claim: Obj, holder: str) -> None:
        name = _meta(claim)["name"]
        log.info(
            "VM waits for a claim another VM holds",
            reason=CLAIM_IN_USE,
            vmi=_meta(vmi).get("name"),
            holder=holder,
        )
        self.recorder.event(
            vmi,
            "Warning",
            CLAIM_IN_USE,
            f"claim {name} is attached to VM instance {holder}, which still exists; this VM "
            f"instance waits with its launcher pod gated until {holder} is gone (a claim "
            "serves one VM at a time)",
            kind=names.VMI_KIND,
            api_version=names.KUBEVIRT_API_VERSION,
        )

    def _fill(self, claim: Obj, vmi: Obj) -> None:
        name, uid = _meta(vmi)["name"], _meta(vmi)["uid"]
        if not self._patch(claim, {"vmi": name, "uid": uid}, self._waiting(claim, name)):
            return
        self._forget((_meta(claim)["namespace"], _meta(claim)["name"]))
        log.info("attachment confirmed", reason="VMIExists", vmi=name, uid=uid)
        self.recorder.event(
            claim,
            "Normal",
            ATTACHED,
            f"attached to VM instance {name} (uid {uid})",
            kind=names.GPU_CLAIM,
        )

    def _clear(self, claim: Obj, reason: str, message: str) -> None:
        vmi_name = rules.recorded(claim).get("vmi")
        if not self._patch(claim, None):
            return
        self._forget((_meta(claim)["namespace"], _meta(claim)["name"]))
        log.info("attachment cleared", reason=reason, vmi=vmi_name, detail=message)
        self.recorder.event(
            claim,
            "Normal",
            DETACHED,
            f"detached from VM instance {vmi_name}: {message}",
            kind=names.GPU_CLAIM,
        )

    def _restore(self, claim: Obj) -> Result | None:
        """Attach a held claim without attachment to the oldest live VMI that uses it."""
        if not self.settings.gpu_for_vms or orders.is_template_claim(claim):
            return None
        ns, name = _meta(claim)["namespace"], _meta(claim)["name"]
        users = rules.live_users(self.caches.vmis.store.by_index(BY_NAMESPACE, ns), name)
        if not users:
            return None
        vmi, waiting = users[0], users[1:]
        vmi_name, uid = _meta(vmi)["name"], _meta(vmi)["uid"]
        if not self._patch(claim, {"vmi": vmi_name, "uid": uid}, waiting):
            return None
        log.info(
            "claim attached",
            reason="UsedByLiveVMI",
            vmi=vmi_name,
            uid=uid,
            waiting=[_meta(v)["name"] for v in waiting],
        )
        self.recorder.event(
            claim,
            "Normal",
            ATTACHED,
            f"attached to VM instance {vmi_name} (uid {uid}), which uses this claim",
            kind=names.GPU_CLAIM,
        )
        return None

    def _report_waiters(self, claim: Obj) -> None:
        """Keep the ``Attached`` condition of a claim attached to a live VMI true to the VMIs
        that wait for it; when they change, each is told by an Event."""
        attached = rules.recorded(claim)
        holder, uid = str(attached["vmi"]), str(attached["uid"])
        waiting = self._waiting(claim, holder)
        _, reason, message = rules.condition_for(
            holder, uid, [str(_meta(v)["name"]) for v in waiting]
        )
        found = conditions.find((claim.get("status") or {}).get("conditions"), CONDITION)
        if found is not None and (found.get("reason"), found.get("message")) == (reason, message):
            return
        if found is None and not waiting:
            return  # attached by an earlier version, nobody waits: nothing to say
        # The waiters changed: the condition is rewritten and every waiter told again.
        self._patch(claim, {"vmi": holder, "uid": uid}, waiting)


def claims_of_vmi(caches: Caches, vmi: Obj) -> list[Key]:
    """The claims a VMI event may concern: those attached to its name and the held claims
    its references name."""
    ns, name = str(_meta(vmi).get("namespace") or ""), str(_meta(vmi).get("name") or "")
    keys = {
        (ns, str(_meta(c).get("name")))
        for c in caches.claims_of_vmi(ns, name)
        if rules.recorded(c).get("vmi") == name
    }
    if references.has_references(vmi):
        with contextlib.suppress(references.AnnotationError):
            keys.update((ns, held) for held in references.held_claims(references.from_object(vmi)))
    return sorted(keys)


class ManagerAccess(managing.Controls, managing.Clocked, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        Attachments(caches, manager.writer, recorder, settings, clock=manager.clock),
        workers=workers,
        seed=lambda: list(caches.claims.store),
    )
    manager.add_controller(
        controller,
        [(caches.claims, own_key), (caches.vmis, lambda vmi: claims_of_vmi(caches, vmi))],
    )
    return controller
