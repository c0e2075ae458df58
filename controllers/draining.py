"""Draining: the idle holds of a cordoned node move to other nodes; the rest is reported
(``model.draining`` says which claim is which).

Key = a node ``("", name)``; woken by the node (cordoned, uncordoned, gone), by the claims
bound to it while it is cordoned, and by every change of the ledger's figures while some
node is cordoned (room may have freed elsewhere for a hold that could not move). A claim
that still carries this controller's condition once it is no longer on a cordoned node (it
lost its node, was refused by it, or the node was uncordoned) is keyed by itself
``(namespace, name)``, and the condition is removed. One pass, for one cordoned node:

* **movable holds** are moved one decision at a time, in order of creation, under
  ``Ledger.allocation_lock`` (the lock every binder pass and placement move holds): each
  target is chosen on the ledger's current figures by the binding model's rules
  (``Ledger.candidates``, ``binding.choose`` with the ``placementPolicy``), and the move
  goes through the claim status write-back (``claim_status``: assumed into the ledger
  before it is sent, resourceVersion precondition, fenced writer), so the next choice
  already counts it — moves obey the same allocation guarantees as binding. The ``Bound``
  condition says ``Moved`` and an Event on the claim says "moved from N1 to N2: node
  cordoned". A hold of a DRA class moves as device health moves one
  (``dra_hold_writes.rewrite``): its ResourceClaim deleted and created again on free
  devices of another eligible node (``Ledger.dra_move``), the moved state assumed first.
* **a movable hold that fits nowhere** stays; the claim's ``NodeCordoned`` condition
  (``CannotMove``) and a Warning Event say why, once per message. The condition is removed
  once the claim is no longer on a cordoned node.
* **blocking claims** (serving a VM instance) stay; the node gets a Warning Event
  ``DrainBlocked`` naming the tenants' VMs, once per change, and a log line.
  ``gpuoperator status --node N`` lists the same.

With the ``drainMoves`` setting off nothing is moved and no condition is set (conditions
already set are removed); the node Event and ``gpuoperator status`` still tell the hoster
what holds the node.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuoperator import dra_hold_writes
from gpuoperator.caches import BY_NODE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.dra_hold_writes import HoldsAccess
from gpuoperator.ledger import Ledger
from gpuoperator.model import binding, claim_states, conditions, dra_holds, draining
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model.draining import Hold, Role
from gpuoperator.runtime import managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "draining"
DRAIN_BLOCKED: Final = "DrainBlocked"
#: Seconds before a pass that lost a write race looks again.
RETRY: Final = 1.0


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.holds = Gauge(
            "gpuoperator_cordoned_node_holds",
            "Claims bound to a cordoned node by what the drain does with them (Movable: "
            "waiting to move or fitting nowhere, Blocking: serving a VM, Releasing: deleted)",
            ["node", "role"],
            registry=registry,
        )
        self.moves = Counter(
            "gpuoperator_drain_moves_total",
            "Holds moved off cordoned nodes",
            registry=registry,
        )


_metrics = per_registry(_Metrics)


class Draining:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        statuses: ClaimStatus,
        recorder: protocols.RecordsEvents,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
        holds: HoldsAccess | None = None,
    ) -> None:
        self.holds = holds
        self.caches = caches
        self.ledger = ledger
        self.statuses = statuses
        self.recorder = recorder
        self.settings = settings
        self.clock = clock
        self._metrics = _metrics(registry)
        self._lock = threading.Lock()
        #: node -> the blocking text last told (a change is told once)
        self._told: dict[str, str] = {}

    def reconcile(self, key: Key) -> Result | None:
        if key[0]:
            return self._unflag(key)
        name = key[1]
        node = self.caches.nodes.store.get(key)
        if not draining.draining(node):
            self._settle(name)
            return None
        with self.ledger.allocation_lock:
            claims = self._claims_on(name)
            holds = draining.holds_on(name, claims, self.caches.served_vmis(claims))
            moves = self.settings.drain_moves
            retry = False
            for h in holds:
                if moves and h.role is Role.MOVABLE:
                    retry = self._move(name, h) is None or retry
            # Only a movable hold that stays carries the condition.
            movable = {h.key for h in holds if moves and h.role is Role.MOVABLE}
            self._clear_conditions([c for c in claims if gpuclaims.key(c) not in movable])
        fresh = draining.holds_on(
            name,
            [self.ledger.claim(h.key) or {} for h in holds],
            self.caches.served_vmis(claims),
        )
        self._report(node or {}, name, fresh)
        return Result(requeue_after=RETRY) if retry else None

    def _claims_on(self, name: str) -> list[Obj]:
        """The claims the cache files under node ``name``, as the ledger counts them."""
        return [
            self.ledger.claim(gpuclaims.key(c)) or c
            for c in self.caches.claims.store.by_index(BY_NODE, name)
        ]

    # ---- decisions ------------------------------------------------------------------------
    def _move(self, source: str, h: Hold) -> bool | None:
        """Move one hold, or report it stuck: True moved, False stuck, None lost a race."""
        claim = self.ledger.claim(h.key)
        if claim is None or not gpuclaims.is_bound_to(claim, source):
            return True
        cls = self.caches.classes.store.get(("", h.class_name))
        if cls is None:
            return False
        now = self.clock.now()
        source_dra = gpuclasses.dra(cls)
        if source_dra is not None:
            return self._move_dra(source, h, claim, cls, source_dra.device_class_name, now)
        candidates = self.ledger.candidates(claim, cls, now)
        target = binding.choose(candidates, self.settings.placement_policy)
        if target is None:
            message = draining.stuck_message(source, h.count, gpuclasses.resource_name(cls))
            return False if self._mark_stuck(claim, message) else None
        message = draining.moved_message(source, target)
        status = claim_states.moved(claim, target, message, now, clear=(draining.CONDITION,))
        written = self.statuses.write(
            claim,
            status,
            Announcement(
                "hold moved off a cordoned node",
                claim_states.MOVED,
                message,
                fields={"source": source, "node": target, "count": h.count},
            ),
        )
        if written.ok:
            self._metrics.moves.inc()
            return True
        return None

    def _move_dra(
        self,
        source: str,
        h: Hold,
        claim: Obj,
        cls: Obj,
        device_class: str,
        now: datetime.datetime,
    ) -> bool | None:
        """Move a DRA hold off the cordoned node as device health moves one
        (``dra_hold_writes.rewrite``): the target node and devices by the binding rules
        (``Ledger.dra_move``: eligible nodes only, so never the cordoned one), the moved
        state assumed, the ResourceClaim deleted and created there, then the status."""
        inventory = self.ledger.dra_inventory(h.class_name)
        found = (
            self.ledger.dra_move(claim, cls, inventory, self.settings.placement_policy, now)
            if inventory is not None
            else None
        )
        if found is None or self.holds is None:
            message = draining.stuck_message(source, h.count, f"DeviceClass {device_class}")
            return False if self._mark_stuck(claim, message) else None
        target, devices = found
        message = draining.moved_message(source, target)
        state = claim_states.dra_moved(
            claim,
            target,
            dra_holds.resource_claim_name(claim),
            devices,
            message,
            now,
            clear=(draining.CONDITION,),
        )
        old = self.ledger.resource_claim((h.key[0], dra_holds.resource_claim_name(claim)))
        written = dra_hold_writes.rewrite(
            self.holds,
            self.statuses,
            claim,
            state,
            target,
            device_class,
            now,
            Announcement(
                "hold moved off a cordoned node",
                claim_states.MOVED,
                message,
                fields={"source": source, "node": target, "count": h.count},
            ),
            old=old if old is not None and dra_holds.is_hold_of(old, claim) else None,
        )
        if written:
            self._metrics.moves.inc()
        return written

    def _mark_stuck(self, claim: Obj, message: str) -> bool:
        status = claim_states.flagged(
            claim, draining.CONDITION, draining.CANNOT_MOVE, message, self.clock.now()
        )
        if status is None:
            return True  # it says so already
        return self.statuses.write(
            claim,
            status,
            Announcement(
                "hold cannot leave its cordoned node",
                draining.CANNOT_MOVE,
                message,
                event="Warning",
                level="warning",
                fields={"node": (claim.get("status") or {}).get("nodeName")},
            ),
        ).ok

    def _settle(self, name: str) -> None:
        """The node is not cordoned (any more): no condition of ours stays, nothing is told.
        The lock is taken only when a claim there still carries the condition."""
        if any(flagged(c) for c in self.caches.claims.store.by_index(BY_NODE, name)):
            with self.ledger.allocation_lock:
                self._clear_conditions(self._claims_on(name))
        with self._lock:
            self._told.pop(name, None)
        for role in Role:
            with contextlib.suppress(KeyError):
                self._metrics.holds.remove(name, role.value)

    def _unflag(self, key: Key) -> Result | None:
        """A claim (key ``(namespace, name)``) that carries the condition but is no longer
        Bound to a cordoned node (it lost its node, was refused, or its node was uncordoned
        while it was elsewhere): the condition goes."""
        claim = self.caches.claims.store.get(key)
        if claim is None or not flagged(claim):
            return None
        node = str((claim.get("status") or {}).get("nodeName") or "")
        if gpuclaims.is_bound_to(claim, node) and draining.draining(
            self.caches.nodes.store.get(("", node))
        ):
            return None  # its node's pass decides
        with self.ledger.allocation_lock:
            self._clear_conditions([self.ledger.claim(key) or claim])
        return None

    def _clear_conditions(self, claims: list[Obj]) -> None:
        for claim in claims:
            if not flagged(claim):
                continue
            self.statuses.write(claim, claim_states.unflagged(claim, draining.CONDITION))

    # ---- reporting ------------------------------------------------------------------------
    def _report(self, node: Obj, name: str, holds: list[Hold]) -> None:
        for role in Role:
            self._metrics.holds.labels(name, role.value).set(
                sum(1 for h in holds if h.role is role)
            )
        text = draining.blocking_text(holds)
        with self._lock:
            if self._told.get(name) == text:
                return
            self._told[name] = text
        if not text:
            return
        message = f"VMs block the drain of node {name} (GPU VMs cannot live-migrate): {text}"
        log.info("drain blocked", reason=DRAIN_BLOCKED, node=name, blocking=text)
        self.recorder.event(node, "Warning", DRAIN_BLOCKED, message, kind="Node", api_version="v1")


def flagged(claim: Obj) -> bool:
    """Whether the claim carries the ``NodeCordoned`` condition."""
    found = (claim.get("status") or {}).get("conditions")
    return conditions.find(found, draining.CONDITION) is not None


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: the fenced writer of DRA holds."""

    def writer_for(self, component: str) -> HoldsAccess: ...


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
        Draining(
            caches,
            ledger,
            statuses,
            recorder,
            settings,
            clock=manager.clock,
            registry=manager.registry,
            holds=manager.writer_for(NAME),
        ),
        workers=1,
        seed=lambda: [("", n) for _, n in caches.nodes.store],
    )

    def node_of_claim(claim: Obj) -> list[Key]:
        """A claim's node when it drains; the claim itself when it carries our condition
        and its node does not drain (or it has none): keys with a namespace are claims."""
        node = str((claim.get("status") or {}).get("nodeName") or "")
        key = ("", node)
        if node and draining.draining(caches.nodes.store.get(key)):
            return [key]
        return [gpuclaims.key(claim)] if flagged(claim) else []

    # The cordoned nodes, kept from the node events (read back from the cache, so the order
    # of an update's old and new objects does not matter): a change of the figures wakes
    # only them, without a scan of every node.
    cordoned: set[str] = set()
    cordoned_lock = threading.Lock()

    def from_node(obj: Obj) -> list[Key]:
        key = ("", str((obj.get("metadata") or {}).get("name") or ""))
        with cordoned_lock:
            if draining.draining(caches.nodes.store.get(key)):
                cordoned.add(key[1])
            else:
                cordoned.discard(key[1])
        return [key]

    def cordoned_nodes(_notice: Obj) -> list[Key]:
        with cordoned_lock:
            return [("", n) for n in sorted(cordoned)]

    manager.add_controller(
        controller,
        [
            (caches.nodes, from_node),
            (caches.claims, node_of_claim),
            (ledger.changes, cordoned_nodes),
        ],
    )
    return controller
