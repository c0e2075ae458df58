"""Attachments: a held claim's ``status.attachment`` ``{vmi, uid}`` kept true to the VMIs
that exist (DESIGN.md §2 GPUClaim, §5 "VMs").

The VMI webhook records ``{vmi: <name>}`` on each held claim while the VMI is being created,
before the API server has persisted it or given it a UID. Key: a claim ``(namespace,
name)``. This controller then

* **fills** ``attachment.uid`` once a VMI of that name exists and names the claim in its
  references: from then on the attachment means that very VMI (claim protection and the
  VMI webhook compare UIDs);
* **clears** an attachment whose VMI is gone or has another UID (the attachment was
  confirmed for an earlier VMI of that name) — at once, after a live read confirms what the
  cache says. A VMI being deleted is still the claim's user (``model.claims``): its launcher
  pod may hold the GPU during the VM's graceful shutdown, so its attachment stays until it is
  gone and no other VM can take the claim meanwhile;
* **clears** an attachment that stayed unconfirmed (no UID) for :data:`GRACE` seconds and
  whose VMI a live read still does not find as one that uses the claim: its create failed
  after the webhook had written it (another webhook refused, the name was taken...);
* **restores** a missing attachment when exactly one live VMI (existing, not finished) names
  the held claim in its references and no other attachment is
  recorded: the state the webhook would have written, should an attachment have been
  cleared while that VMI's create was completing (only with ``gpuForVMs`` on).

Every write is a merge patch of the status subresource carrying the claim's
resourceVersion, so it fails with a conflict if the webhook (or anyone) wrote meanwhile, and
the claim is judged again on its new state.

**The grace rule.** An attachment without UID is cleared only when the same claim state
(same resourceVersion, same VMI name) has been seen unconfirmed for :data:`GRACE` seconds
by this replica, and a live GET of the VMI then still finds no VMI that would confirm it.
The webhook writes the attachment milliseconds before the VMI is persisted; 30 seconds
covers the create's remaining admission, the write and the watch delivering the VMI, with a
wide margin. The timer lives in memory: a leader change starts it again, which only delays
a clear. A webhook re-writing the same attachment (a retried create) does not restart it —
the write changes nothing — but the live read before the clear sees the VMI if it exists.

Events on the claim: ``Attached`` (the UID was recorded or an attachment restored) and
``Detached`` (why the attachment was cleared); log lines carry the finer reason.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Final

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches, own_key
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.model import claims, orders, references
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.informing import Key
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "attachments"
#: Seconds an attachment may stay unconfirmed (no UID, no VMI) before it is cleared.
GRACE: Final = 30.0

ATTACHED = "Attached"
DETACHED = "Detached"


def _meta(obj: Obj | None) -> dict[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def attachment(claim: Obj) -> dict[str, Any]:
    """The claim's ``status.attachment`` (``{}`` when none)."""
    found = (claim.get("status") or {}).get("attachment")
    return found if isinstance(found, dict) else {}


def uses_claim(vmi: Obj, claim_name: str) -> bool:
    """Whether the VMI names ``claim_name`` as a held claim in its references (pure)."""
    if not references.has_references(vmi):
        return False
    try:
        refs = references.from_object(vmi)
    except references.AnnotationError:
        return False
    return claim_name in references.held_claims(refs)


def confirms(vmi: Obj | None, claim_name: str) -> bool:
    """Whether ``vmi`` is one an unconfirmed attachment of ``claim_name`` may be confirmed
    for: it exists with a UID (being deleted or not) and uses the claim (pure)."""
    return vmi is not None and bool(_meta(vmi).get("uid")) and uses_claim(vmi, claim_name)


def stale_reason(attached: dict[str, Any], vmi: Obj | None) -> tuple[str, str] | None:
    """Why a confirmed attachment (with UID) no longer holds — ``(reason, message)`` — or
    ``None`` while its VMI is a live user: it exists with that UID, being deleted or not
    (``model.claims.is_live_user``; pure)."""
    name, uid = str(attached.get("vmi") or ""), str(attached.get("uid") or "")
    if claims.is_live_user(claims.VmiRef(name, uid), vmi):
        return None
    if vmi is None:
        return ("VMDeleted", f"VM instance {name} (uid {uid}) no longer exists")
    return (
        "VMReplaced",
        f"VM instance {name} now has uid {_meta(vmi).get('uid')}, not the uid {uid} the claim "
        "was attached to",
    )


class Attachments:
    def __init__(
        self,
        caches: Caches,
        writer: Client,
        recorder: Recorder,
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
        attached = attachment(claim) if claim is not None else {}
        vmi_name = str(attached.get("vmi") or "")
        if claim is None or not vmi_name or attached.get("uid"):
            self._forget(key)
        if claim is None:
            return None
        if not vmi_name:
            return self._restore(claim)
        vmi = self.caches.vmis.store.get((key[0], vmi_name))
        if attached.get("uid"):
            why = stale_reason(attached, vmi)
            if why is None:
                return None
            live = self.writer.get_or_none(VirtualMachineInstance, vmi_name, key[0])
            why = stale_reason(attached, live)
            if why is None:
                log.info("cache behind; attachment holds", reason="VMIExists", vmi=vmi_name)
                return None
            self._clear(claim, *why)
            return None
        if confirms(vmi, key[1]):
            assert vmi is not None
            self._fill(claim, vmi)
            return None
        waited = self._waited(key, claim, vmi_name)
        if waited < self.grace:
            log.debug("attachment unconfirmed; waiting", reason="Unconfirmed", vmi=vmi_name)
            return Result(requeue_after=self.grace - waited)
        live = self.writer.get_or_none(VirtualMachineInstance, vmi_name, key[0])
        if confirms(live, key[1]):
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
    def _patch(self, claim: Obj, new_attachment: dict[str, Any] | None) -> bool:
        meta = _meta(claim)
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"attachment": new_attachment},
        }
        try:
            self.writer.patch(GPUClaim, meta["name"], body, meta["namespace"], subresource="status")
        except (errors.ConflictError, errors.NotFoundError) as exc:
            # The claim changed (or went) meanwhile: its new state is judged on the next event.
            log.info("claim changed meanwhile; judging again", reason=exc.reason)
            return False
        return True

    def _fill(self, claim: Obj, vmi: Obj) -> None:
        name, uid = _meta(vmi)["name"], _meta(vmi)["uid"]
        if not self._patch(claim, {"vmi": name, "uid": uid}):
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
        vmi_name = attachment(claim).get("vmi")
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
        """Record the attachment of a held claim that exactly one live VMI uses."""
        if not self.settings.gpu_for_vms or orders.is_template_claim(claim):
            return None
        ns, name = _meta(claim)["namespace"], _meta(claim)["name"]
        users = [
            vmi
            for vmi in self.caches.vmis.store.by_index(BY_NAMESPACE, ns)
            if confirms(vmi, name) and not claims.is_vmi_final(vmi)
        ]
        if not users:
            return None
        if len(users) > 1:
            log.warning(
                "several VMs name one claim; attachment not restored",
                reason="SeveralUsers",
                vmis=sorted(_meta(v)["name"] for v in users),
            )
            return None
        vmi = users[0]
        vmi_name, uid = _meta(vmi)["name"], _meta(vmi)["uid"]
        if not self._patch(claim, {"vmi": vmi_name, "uid": uid}):
            return None
        log.info("attachment restored", reason="UsedByLiveVMI", vmi=vmi_name, uid=uid)
        self.recorder.event(
            claim,
            "Normal",
            ATTACHED,
            f"attached to VM instance {vmi_name} (uid {uid}), which uses this claim",
            kind=names.GPU_CLAIM,
        )
        return None


def claims_of_vmi(caches: Caches, vmi: Obj) -> list[Key]:
    """The claims a VMI event may concern: those attached to its name and the held claims
    its references name."""
    ns, name = str(_meta(vmi).get("namespace") or ""), str(_meta(vmi).get("name") or "")
    keys = {
        (ns, str(_meta(c).get("name")))
        for c in caches.claims.store.by_index(BY_NAMESPACE, ns)
        if attachment(c).get("vmi") == name
    }
    if references.has_references(vmi):
        with contextlib.suppress(references.AnnotationError):
            keys.update((ns, held) for held in references.held_claims(references.from_object(vmi)))
    return sorted(keys)


def register(
    manager: Manager, caches: Caches, recorder: Recorder, settings: Settings, workers: int = 2
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
