"""Preemption of running spot VMs (docs/design.md §5 "Preemptible classes").

The binder takes idle preemptible holds back at once. When they are not enough, the oldest
waiting claim of a guaranteed class may still fit by taking back holds whose VMs run; this
controller gives those VMs notice and stops them when it runs out. One key (the whole
cluster), decided again on every change of the figures or of a claim of a preemptible class,
so that a notice follows what is needed now:

* for each guaranteed class beside preemptible ones, its oldest waiting claim that fits on
  no node as it is and not by taking back idle holds either (those the binder takes) is
  given ``model.preemption.take_back_for(..., running=True)``: the running spot VMs of that
  choice are *wanted*;
* a wanted claim without notice gets the condition ``Preempting`` (reason
  ``StopScheduled``, the time it will be stopped, an Event on the claim);
* a claim with notice that is no longer wanted (the order was bound elsewhere or deleted,
  room freed) loses it (Event ``PreemptionCancelled``) and its VM keeps running;
* a wanted claim whose notice is older than ``preemptionGrace`` has its VM stopped through
  KubeVirt: a VM instance controlled by a VirtualMachine is halted (``spec.runStrategy:
  Halted``, or ``spec.running: false`` where the VirtualMachine uses that field), any other
  VM instance is deleted (UID precondition); the condition's reason becomes ``VMStopped``
  and an Event says so. Once the VM instance is gone the hold is idle, and the binder takes
  it back as any idle one (clearing the condition).

The controller hands out no units, so it needs no allocation lock: what it stops frees units
only through the binder's next decision.
"""

from __future__ import annotations

import datetime
from typing import Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import Caches
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.kinds import VirtualMachine, VirtualMachineInstance
from gpuoperator.ledger import Ledger
from gpuoperator.model import claim_states, gpu_hours, orders, preemption
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "preemption"
#: The one key: every decision is taken over the whole cluster.
ALL: Key = ("", "all")


class ApiAccess(protocols.Gets, protocols.Patches, protocols.Deletes, Protocol):
    """Stops a VM: reads its VirtualMachine, halts it, or deletes a bare VM instance."""


class Preemption:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        statuses: ClaimStatus,
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.statuses = statuses
        self.writer = writer
        self.recorder = recorder
        self.settings = settings
        self.clock = clock

    def reconcile(self, key: Key) -> Result | None:
        now = self.clock.now()
        classes = self.caches.classes.store.values()
        if not any(gpuclasses.preemptible(c) for c in classes):
            return None
        wanted: dict[Key, tuple[str, str, str]] = {}  # spot claim -> (order, its class, node)
        spot_names: set[str] = set()
        for cls in classes:
            spot = preemption.spot_classes(cls, classes)
            spot_names.update(spot)
            if spot:
                self._wanted_by(cls, now, wanted)
        looks: list[float] = []
        for name in sorted(spot_names):
            for claim in self.ledger.claims_of_class(name):
                look = self._settle(claim, wanted.get(gpuclaims.key(claim)), now)
                if look is not None:
                    looks.append(look)
        return Result(requeue_after=max(0.1, min(looks))) if looks else None

    def _wanted_by(
        self, cls: Obj, now: datetime.datetime, wanted: dict[Key, tuple[str, str, str]]
    ) -> None:
        """Add the running spot VMs the oldest waiting claim of guaranteed ``cls`` needs."""
        order = self.ledger.unplaced_order(cls, now)
        if order is None:
            return  # nothing waits, or it fits as it is: the binder binds it
        spot_claims = self.ledger.spot_claims(cls)
        vmis = self.caches.served_vmis(spot_claims)
        policy = self.settings.placement_policy
        # With running VMs allowed the choice is an idle-only one wherever idle holds are
        # enough (it ranks VMs stopped first): those the binder takes back itself.
        found = self.ledger.take_back(order, cls, spot_claims, vmis, policy, now, running=True)
        if found is None or found.running == 0:
            return
        by = "/".join(gpuclaims.key(order))
        for hold in found.holds:
            if hold.running:
                wanted.setdefault(hold.key, (by, gpuclasses.name(cls), found.node))

    def _settle(
        self, claim: Obj, wanted: tuple[str, str, str] | None, now: datetime.datetime
    ) -> float | None:
        """Give, keep, withdraw or act on ``claim``'s notice; seconds until it is due."""
        given = preemption.notice(claim)
        if wanted is None:
            if given is None or not gpuclaims.is_bound(claim):
                return None
            # A VM already stopped leaves an idle hold the binder takes back (clearing the
            # condition); if no order needs it any more, the condition just goes.
            withdrawn = given.get("reason") != preemption.VM_STOPPED
            self.statuses.write(
                claim,
                claim_states.unflagged(claim, preemption.CONDITION),
                Announcement(
                    "preemption withdrawn", preemption.CANCELLED, preemption.cancelled_message()
                )
                if withdrawn
                else None,
            )
            return None
        order, order_class, node = wanted
        vmi_name = gpu_hours.served_vmi_name(claim)
        vmi_text = f"{claim['metadata']['namespace']}/{vmi_name}"
        if given is None:
            at = now + datetime.timedelta(seconds=self.settings.preemption_grace)
            message = preemption.notice_message(vmi_text, order, order_class, node, at)
            status = claim_states.flagged(
                claim, preemption.CONDITION, preemption.STOP_SCHEDULED, message, now
            )
            if status is not None:
                self.statuses.write(
                    claim,
                    status,
                    Announcement(
                        "running spot VM given notice",
                        preemption.CONDITION,
                        message,
                        event="Warning",
                        fields={"vmi": vmi_text, "by": order, "node": node},
                    ),
                )
            return self.settings.preemption_grace
        due = preemption.stop_at(claim, self.settings.preemption_grace)
        if due is not None and due > now:
            return (due - now).total_seconds()
        if given.get("reason") != preemption.VM_STOPPED:
            self._stop(claim, vmi_name, vmi_text, order, now)
        return None

    def _stop(
        self, claim: Obj, vmi_name: str, vmi_text: str, order: str, now: datetime.datetime
    ) -> None:
        ns = claim["metadata"]["namespace"]
        vmi = self.caches.vmis.store.get((ns, vmi_name))
        if vmi is not None:
            owner = next(
                (
                    o
                    for o in vmi["metadata"].get("ownerReferences") or []
                    if o.get("controller") and o.get("kind") == names.VM_KIND
                ),
                None,
            )
            try:
                if owner is not None:
                    vm = self.writer.get(VirtualMachine, str(owner["name"]), ns)
                    halt = (
                        {"spec": {"running": False}}
                        if "running" in (vm.get("spec") or {})
                        else {"spec": {"runStrategy": "Halted"}}
                    )
                    self.writer.patch(VirtualMachine, str(owner["name"]), halt, ns)
                else:
                    self.writer.delete(
                        VirtualMachineInstance, vmi_name, ns, uid=vmi["metadata"].get("uid")
                    )
            except errors.NotFoundError:
                pass  # gone already: the hold is idle, and the binder takes it back
        message = preemption.stopped_message(vmi_text, order)
        log.info("running spot VM stopped", reason=preemption.VM_STOPPED, vmi=vmi_text, by=order)
        status = claim_states.flagged(
            claim, preemption.CONDITION, preemption.VM_STOPPED, message, now
        )
        if status is not None:
            self.statuses.write(
                claim,
                status,
                Announcement(
                    "running spot VM stopped", preemption.VM_STOPPED, message, event="Warning"
                ),
            )


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
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        Preemption(
            caches, ledger, statuses, manager.writer, recorder, settings, clock=manager.clock
        ),
        workers=1,
        seed=lambda: [ALL],
    )

    def all_of_it(_obj: Obj) -> list[Key]:
        return [ALL]

    def beside_spot(claim: Obj) -> list[Key]:
        """A claim of a preemptible class, or of a class that may take from one."""
        cls = caches.classes.store.get(("", orders.ordered_class(claim)))
        if cls is None:
            return []
        if gpuclasses.preemptible(cls):
            return [ALL]
        classes = caches.classes.store.values()
        return [ALL] if preemption.spot_classes(cls, classes) else []

    manager.add_controller(
        controller,
        [(ledger.changes, all_of_it), (caches.claims, beside_spot), (caches.classes, all_of_it)],
    )
    return controller
