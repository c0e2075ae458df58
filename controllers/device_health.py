"""Device health: a DRA hold whose device turns unhealthy (a ``NoSchedule``/``NoExecute``
device taint, or the device gone from its driver's ResourceSlice) moves to healthy devices
when it is idle, and is reported when it serves a VM (``model.dra_health`` says which claim
is which; docs/design.md §5 "DRA classes").

Key = a DRA class ``("", name)``; woken by the ledger's changes of the class (slices,
allocations, claims), by its claims and by the class. One pass, under
``Ledger.allocation_lock`` (the lock of every binder pass and move), on the class's counted
inventory:

* **an idle hold** moves: the target node and devices are chosen by the binding rules
  (``Ledger.dra_move``); the move is assumed into the ledger first (``claim_states.
  dra_moved``: its new devices count as held from then on), then its ResourceClaim is
  deleted (uid precondition) and created again on the healthy devices with its allocation
  (``gpuoperator.dra_hold_writes``, the binder's own write of a hold), and only then the
  claim's status is written (node, devices, ``Bound`` condition ``Moved``), with an Event
  ``Moved`` saying why. The hold's name is the claim's (VMs name it), so the old one goes
  before the new one exists; the devices the claim names meanwhile are unhealthy ones no
  decision hands out, and its new ones are counted held by the assumption, so no device is
  given twice. A hold already allocated on healthy devices its claim's status does not
  name (the status write of a move lost a race, or the leader stopped between the two) is
  adopted: only the claim's status is written.
* **an idle hold that fits nowhere** stays; its ``DeviceUnhealthy`` condition and a Warning
  Event (reason ``DeviceTainted`` or ``DeviceGone``) say why, once per message.
* **a hold serving a VM** stays (GPU VMs cannot live-migrate): the same condition and a
  Warning Event name the device and the VM.

A claim whose devices are healthy again (or that is no longer Bound) loses the condition.
With the ``drainMoves`` setting off nothing is moved (the condition still reports).
"""

from __future__ import annotations

from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from gpuoperator import dra_hold_writes
from gpuoperator.caches import Caches, class_of_claim, own_key
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.dra_hold_writes import HoldsAccess
from gpuoperator.ledger import Ledger, changed_classes
from gpuoperator.model import (
    claim_states,
    conditions,
    dra_devices,
    dra_health,
    dra_holds,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model.draining import Role
from gpuoperator.runtime import managing
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "device-health"
#: Seconds before a pass that lost a write race looks again.
RETRY: Final = 1.0


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.moves = Counter(
            "gpuoperator_device_health_moves_total",
            "DRA holds moved off unhealthy devices",
            registry=registry,
        )


_metrics = per_registry(_Metrics)


class DeviceHealth:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        statuses: ClaimStatus,
        holds: HoldsAccess,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.statuses = statuses
        self.holds = holds
        self.settings = settings
        self.clock = clock
        self._metrics = _metrics(registry)

    def reconcile(self, key: Key) -> Result | None:
        cls = self.caches.classes.store.get(("", key[1]))
        source = gpuclasses.dra(cls) if cls is not None else None
        if cls is None or source is None:
            return None
        with self.ledger.allocation_lock:
            inventory = self.ledger.dra_inventory(key[1])
            if inventory is None:
                return None
            claims, unconfirmed = self.ledger.settled_claims_of_class(key[1])
            sick = dra_health.sick_holds(claims, inventory, self.caches.served_vmis(claims))
            retry = unconfirmed
            reported: set[Key] = set()
            for s in sick:
                claim = next(c for c in claims if gpuclaims.key(c) == s.key)
                if s.role is Role.RELEASING:
                    continue
                if s.role is Role.MOVABLE and self.settings.drain_moves:
                    done = self._move(claim, s, cls, source.device_class_name, inventory)
                    if done is None:
                        retry = True
                    elif not done:
                        reported.add(s.key)
                    continue
                message = (
                    dra_health.serving_message(s)
                    if s.role is Role.BLOCKING
                    else dra_health.stuck_message(s, source.device_class_name)
                )
                reported.add(s.key)
                if not self._flag(claim, s, message):
                    retry = True
            for claim in claims:
                if gpuclaims.key(claim) not in reported and flagged(claim):
                    self.statuses.write(claim, claim_states.unflagged(claim, dra_health.CONDITION))
        return Result(requeue_after=RETRY) if retry else None

    def _move(
        self,
        claim: Obj,
        sick: dra_health.Sick,
        cls: Obj,
        device_class: str,
        inventory: dra_devices.Inventory,
    ) -> bool | None:
        """Move one hold, or report it stuck: True moved, False stuck, None lost a race."""
        now = self.clock.now()
        old = self.ledger.resource_claim(gpuclaims.key(claim))
        own = old if old is not None and dra_holds.is_hold_of(old, claim) else None
        written_before = dra_health.adoptable(claim, own, inventory) if own else None
        found = written_before or self.ledger.dra_move(
            claim, cls, inventory, self.settings.placement_policy, now
        )
        if found is None:
            stuck = dra_health.stuck_message(sick, device_class)
            return False if self._flag(claim, sick, stuck) else None
        target, devices = found
        message = dra_health.moved_message(sick, target, devices)
        state = claim_states.dra_moved(
            claim,
            target,
            dra_holds.resource_claim_name(claim),
            devices,
            message,
            now,
            clear=(dra_health.CONDITION,),
        )
        intended = self.statuses.assume(claim, state)
        if written_before is None:  # else the hold holds them already: only the status
            try:
                if own is not None:
                    dra_hold_writes.release(self.holds, own)
            except BaseException:
                self.ledger.forget(gpuclaims.key(claim))
                raise
            if not dra_hold_writes.allocate(
                self.holds, self.ledger, claim, intended, target, device_class, now
            ):
                return None
        written = self.statuses.send(
            intended,
            Announcement(
                "hold moved off an unhealthy device",
                claim_states.MOVED,
                message,
                fields={
                    "source": sick.node,
                    "node": target,
                    "cause": sick.cause,
                    "count": sick.count,
                },
            ),
        )
        if written.ok:
            self._metrics.moves.inc()
            return True
        return None

    def _flag(self, claim: Obj, sick: dra_health.Sick, message: str) -> bool:
        status = claim_states.flagged(
            claim, dra_health.CONDITION, sick.cause, message, self.clock.now()
        )
        if status is None:
            return True  # it says so already
        return self.statuses.write(
            claim,
            status,
            Announcement(
                "hold has an unhealthy device and stays",
                sick.cause,
                message,
                event="Warning",
                level="warning",
                fields={"node": sick.node, "vmi": sick.vmi or None},
            ),
        ).ok


def flagged(claim: Obj) -> bool:
    """Whether the claim carries the ``DeviceUnhealthy`` condition."""
    found = (claim.get("status") or {}).get("conditions")
    return conditions.find(found, dra_health.CONDITION) is not None


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: the fenced writer of DRA holds."""

    def writer_for(self, component: str) -> HoldsAccess: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    statuses: ClaimStatus,
    settings: Settings,
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        DeviceHealth(
            caches,
            ledger,
            statuses,
            manager.writer_for(NAME),
            settings,
            clock=manager.clock,
            registry=manager.registry,
        ),
        workers=1,
        seed=caches.class_keys,
    )
    manager.add_controller(
        controller,
        [
            (caches.claims, class_of_claim),
            (caches.classes, own_key),
            (ledger.changes, changed_classes),
        ],
    )
    return controller
