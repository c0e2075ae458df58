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

**A Bound claim whose hold is gone** (no ResourceClaim of its hold's name, or its own one
unallocated: a leader stopped between a move's delete and its create, or an administrator
deleted it; confirmed by a read of the API server) is held again in the same pass, before
health is judged (``dra_health.rehold_target``, ``Ledger.dra_rehold``): on the devices its
status names when each is still free (no allocation, no other claim) and healthy (reason
``HoldRestored``); else an idle one moves as above (``Moved``); else an idle one waits again
(``Pending``, reason ``HoldLost``, as a claim whose node is gone), and one serving a VM stays
with the ``HoldMissing`` condition and a Warning Event. Its devices stay counted as held by
its status meanwhile, so no decision hands them out.

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
from gpuoperator.kinds import ResourceClaim
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
from gpuoperator.model.draining import Hold, Role
from gpuoperator.runtime import errors, managing
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
            vmis = self.caches.served_vmis(claims)
            retry = unconfirmed
            reported: set[Key] = set()
            missing: set[Key] = set()
            for claim in claims:
                if not self._hold_missing(claim):
                    continue
                missing.add(gpuclaims.key(claim))
                done = self._rehold(claim, dra_health.judge(claim, vmis), cls, source)
                if done is None:
                    retry = True
                elif not done:
                    reported.add(gpuclaims.key(claim))
            sick = [
                s for s in dra_health.sick_holds(claims, inventory, vmis) if s.key not in missing
            ]
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
                if gpuclaims.key(claim) in reported:
                    continue
                for type_ in (dra_health.CONDITION, dra_health.HOLD_MISSING):
                    current = self.ledger.claim(gpuclaims.key(claim)) or claim
                    if flagged(current, type_):
                        self.statuses.write(current, claim_states.unflagged(current, type_))
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
        written = dra_hold_writes.rewrite(
            self.holds,
            self.statuses,
            claim,
            state,
            target,
            device_class,
            now,
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
            old=own,
            allocated_already=written_before is not None,
        )
        if written:
            self._metrics.moves.inc()
        return written

    def _hold_missing(self, claim: Obj) -> bool:
        """Whether a Bound claim has lost its hold (``dra_health.hold_missing``): the cache
        says so, and a read of the API server confirms it (the hold of a bind or a move
        just written may not have been watched yet)."""
        if not dra_health.held(claim):
            return False
        key = gpuclaims.key(claim)
        name = dra_holds.resource_claim_name(claim)
        if not dra_health.hold_missing(claim, self.ledger.resource_claim((key[0], name))):
            return False
        try:
            live = self.holds.get(ResourceClaim, name, key[0])
        except errors.NotFoundError:
            live = None
        return dra_health.hold_missing(claim, live)

    def _rehold(
        self, claim: Obj, judged: Hold, cls: Obj, source: gpuclasses.DraSource
    ) -> bool | None:
        """Hold a Bound claim whose hold is gone again: on its own devices when they are
        free and healthy, else (idle, ``drainMoves`` on) moved as a health move is, else
        (idle) back to waiting, or (serving a VM) reported. True held again, False it
        stays or waits, None lost a race."""
        if judged.role is Role.RELEASING:
            return False  # its devices go with it
        now = self.clock.now()
        movable = judged.role is Role.MOVABLE
        found = self.ledger.dra_rehold(
            claim,
            cls,
            self.settings.placement_policy,
            now,
            move=movable and self.settings.drain_moves,
        )
        device_class = source.device_class_name
        node = gpuclaims.node_name(claim)
        if found is None and not movable:
            message = dra_health.hold_missing_message(claim, judged)
            status = claim_states.flagged(
                claim, dra_health.HOLD_MISSING, dra_health.HOLD_MISSING, message, now
            )
            if status is None:
                return False  # it says so already
            return (
                False
                if self.statuses.write(
                    claim,
                    status,
                    Announcement(
                        "hold gone and its devices cannot be held again; the VM keeps them",
                        dra_health.HOLD_MISSING,
                        message,
                        event="Warning",
                        level="warning",
                        fields={"node": node, "vmi": judged.vmi or None},
                    ),
                ).ok
                else None
            )
        if found is None:
            message = dra_health.hold_lost_message(claim, device_class)
            written = self.statuses.write(
                claim,
                claim_states.hold_lost(
                    claim,
                    dra_health.HOLD_LOST,
                    message,
                    now,
                    clear=(dra_health.CONDITION, dra_health.HOLD_MISSING),
                ),
                Announcement(
                    "hold gone and no device fits; the claim waits",
                    dra_health.HOLD_LOST,
                    message,
                    event="Warning",
                    fields={"node": node, "count": judged.count},
                ),
            )
            return False if written.ok else None
        message = dra_health.rehold_message(claim, found)
        if found.restored:
            reason = dra_health.HOLD_RESTORED
            state = claim_states.held_again(claim, reason, message, now)
        else:
            reason = claim_states.MOVED
            state = claim_states.dra_moved(
                claim,
                found.node,
                dra_holds.resource_claim_name(claim),
                found.devices,
                message,
                now,
                clear=(dra_health.CONDITION, dra_health.HOLD_MISSING),
            )
        done = dra_hold_writes.rewrite(
            self.holds,
            self.statuses,
            claim,
            state,
            found.node,
            device_class,
            now,
            Announcement(
                "hold gone; held again",
                reason,
                message,
                fields={"source": node, "node": found.node, "count": judged.count},
            ),
        )
        if done and not found.restored:
            self._metrics.moves.inc()
        return done

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


def flagged(claim: Obj, type_: str = dra_health.CONDITION) -> bool:
    """Whether the claim carries the condition ``type_`` (``DeviceUnhealthy``)."""
    found = (claim.get("status") or {}).get("conditions")
    return conditions.find(found, type_) is not None


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
