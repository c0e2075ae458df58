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
* **migrating claims** (serving a running VM instance that live-migrates,
  ``model.draining.migration_refusal``: evictionStrategy ``LiveMigrate``, every claim of
  the VM Bound here and of a ``vgpu`` class; docs/design.md §5 "Live migration") do not
  block the drain: a VirtualMachineInstanceMigration is created for the VM
  (``spec.vmiName``, ``generateName``, labelled ``app.kubernetes.io/managed-by:
  gpu-operator``, annotated with the drained node; ``draining.migration_object``), **at most
  one migration in flight per node** (an unfinished migration whose VM runs on the node,
  whoever made it), and none for a VM while one of its own is unfinished. The claims of
  that VM get the ``NodeCordoned`` condition with reason ``DrainMigrating`` (naming the
  migration) and an Event; the claims of a VM waiting its turn say ``DrainMigrationQueued``
  (naming the migration in flight); the node gets a ``DrainMigrating`` Event per migration
  created. The migrations controller then chooses the target and writes the transient
  holds; the claims move with the VM when it completes, and their condition goes once they
  are off the cordoned node.
* **blocking claims** (serving a VM instance that does not live-migrate) stay; the node gets
  a Warning Event ``DrainBlocked`` naming the tenants' VMs, once per change, and a log line.
  ``gpuoperator status --node N`` lists the same.

With the ``drainMoves`` setting off nothing is moved, no migration is started and no
condition is set (conditions already set are removed); VMs that would migrate block the
drain, and the node Event and ``gpuoperator status`` still tell the hoster what holds the
node.

Choices where docs/design.md is silent:

* A migration this replica created counts as in flight from its creation, before the watch
  shows it (for :data:`CREATED_TTL` seconds at most: one created and deleted before the
  watch showed it would otherwise hold the node's turn forever).
* After a VM's migration ends without moving it (Failed, or deleted: no target capacity),
  the next one for that VM is created no sooner than :data:`MIGRATION_RETRY` seconds after
  the last, so a migration that cannot succeed is not retried in a hot loop.
* VMs migrate in the order of their claims' creation (the oldest hold first).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuoperator import dra_hold_writes, names
from gpuoperator.caches import BY_NODE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.dra_hold_writes import HoldsAccess
from gpuoperator.kinds import VirtualMachineInstanceMigration
from gpuoperator.ledger import Ledger
from gpuoperator.model import (
    binding,
    claim_states,
    conditions,
    dra_holds,
    draining,
    migrations,
    objects,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model.draining import Hold, InFlight, Role
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "draining"
DRAIN_BLOCKED: Final = "DrainBlocked"
#: Seconds before a pass that lost a write race looks again.
RETRY: Final = 1.0
#: Seconds a migration this replica created counts as in flight before the watch shows it.
CREATED_TTL: Final = 90.0
#: The least seconds between two migrations the drain creates for one VM.
MIGRATION_RETRY: Final = 60.0


class ApiAccess(protocols.Creates, Protocol):
    """What draining asks of the API server: migrations created."""


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
        self.migrations = Counter(
            "gpuoperator_drain_migrations_total",
            "Live migrations created to drain cordoned nodes",
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
        writer: ApiAccess | None = None,
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
        #: creates migrations; without one (``None``) no VM is migrated and they block
        self.writer = writer
        self.clock = clock
        self._metrics = _metrics(registry)
        self._lock = threading.Lock()
        #: node -> the blocking text last told (a change is told once)
        self._told: dict[str, str] = {}
        #: migration key -> (drained node, its VM instance, monotonic time created), until
        #: the watch shows it
        self._created: dict[Key, tuple[str, Key, float]] = {}
        #: VM instance key -> monotonic time its last migration was created here
        self._last_migration: dict[Key, float] = {}

    def reconcile(self, key: Key) -> Result | None:
        if key[0]:
            return self._unflag(key)
        name = key[1]
        node = self.caches.nodes.store.get(key)
        if not draining.draining(node):
            self._settle(name)
            return None
        moves = self.settings.drain_moves
        wait: float | None = None
        with self.ledger.allocation_lock:
            claims = self._claims_on(name)
            vmis = self.caches.served_vmis(claims)
            migrating = self._migrating(name, claims, vmis) if moves else set()
            holds = draining.holds_on(name, claims, vmis, migrating)
            retry = False
            for h in holds:
                if moves and h.role is Role.MOVABLE:
                    retry = self._move(name, h) is None or retry
            if migrating:
                wait = self._migrate(node or {}, name, holds)
                retry = wait == RETRY or retry
            # Only a movable hold that stays, and a migrating one, carry the condition.
            kept = {h.key for h in holds if moves and h.role in (Role.MOVABLE, Role.MIGRATING)}
            self._clear_conditions([c for c in claims if gpuclaims.key(c) not in kept])
        fresh = draining.holds_on(
            name, [self.ledger.claim(h.key) or {} for h in holds], vmis, migrating
        )
        self._report(node or {}, name, fresh)
        if retry:
            return Result(requeue_after=RETRY)
        return Result(requeue_after=wait) if wait is not None else None

    # ---- live migration -------------------------------------------------------------------
    def _migrating(self, name: str, claims: list[Obj], vmis: dict[Key, Obj]) -> set[Key]:
        """The VM instances on node ``name`` that live-migrate off it (none without a
        writer to create migrations)."""
        if self.writer is None:
            return set()
        kubevirt = next(iter(self.caches.kubevirts.store.values()), None)
        classes = {
            str(objects.meta(cls).get("name") or ""): cls
            for cls in self.caches.classes.store.values()
        }
        return draining.migrating_vmis(
            name,
            claims,
            vmis,
            kubevirt,
            lambda key: self.ledger.claim(key) or self.caches.claims.store.get(key),
            classes,
        )

    def _in_flight(self, name: str, vmis: dict[Key, Obj], claims: list[Obj]) -> list[InFlight]:
        """The unfinished migrations off (or onto) node ``name``: the cached ones, and those
        this replica created that the watch does not show yet."""
        now = self.clock.monotonic()
        cached = list(self.caches.migrations.store.values())
        shown = {key_of(m) for m in cached}
        pending: list[InFlight] = []
        with self._lock:
            for key, (node, vmi, made) in list(self._created.items()):
                if key in shown or now - made > CREATED_TTL:
                    del self._created[key]
                elif node == name:
                    pending.append(
                        InFlight(key=key, vmi=vmi, claims=(), source=name, target="", since="")
                    )
        return draining.in_flight(name, cached, vmis, claims) + pending

    def _migrate(self, node: Obj, name: str, holds: list[Hold]) -> float | None:
        """Start the next migration off node ``name`` when none is in flight, and say on
        each migrating claim what becomes of it. Returns when to look again (``None``: an
        event will tell)."""
        order: list[Key] = []
        for h in holds:
            if h.role is Role.MIGRATING and (h.key[0], h.vmi) not in order:
                order.append((h.key[0], h.vmi))
        claims = [c for c in (self.ledger.claim(h.key) for h in holds) if c is not None]
        vmis = self.caches.served_vmis(claims)
        flying = self._in_flight(name, vmis, claims)
        wait: float | None = None
        if not any(f.source == name for f in flying):
            for vmi in order:
                left = self._retry_left(vmi)
                if left > 0:
                    wait = left if wait is None else min(wait, left)
                    continue
                created = self._create(node, name, vmi)
                if created is None:
                    return RETRY
                flying.append(created)
                break
        ok = True
        for vmi in order:
            own = next((f for f in flying if f.vmi == vmi and f.source == name), None)
            other = next((f for f in flying if f.source == name), None)
            if own is not None:
                reason = draining.DRAIN_MIGRATING
                message = draining.migrating_message(name, vmi, own.key[1])
            elif other is not None:
                reason = draining.MIGRATION_QUEUED
                message = draining.queued_message(name, vmi, other)
            else:
                continue  # waiting for its retry time: the condition it carries stays
            for h in holds:
                if h.role is Role.MIGRATING and (h.key[0], h.vmi) == vmi:
                    ok = self._flag(h.key, reason, message) and ok
        return wait if ok else RETRY

    def _retry_left(self, vmi: Key) -> float:
        with self._lock:
            last = self._last_migration.get(vmi)
        if last is None:
            return 0.0
        return max(0.0, MIGRATION_RETRY - (self.clock.monotonic() - last))

    def _create(self, node: Obj, name: str, vmi: Key) -> InFlight | None:
        """Create the migration of ``vmi`` off node ``name``; ``None`` when it failed."""
        assert self.writer is not None
        try:
            made = self.writer.create(
                VirtualMachineInstanceMigration, draining.migration_object(vmi[0], vmi[1], name)
            )
        except errors.ApiError as exc:
            log.warning(
                "migration not created",
                reason="MigrationNotCreated",
                node=name,
                vmi=f"{vmi[0]}/{vmi[1]}",
                error=str(exc),
            )
            return None
        key = key_of(made)
        now = self.clock.monotonic()
        with self._lock:
            self._created[key] = (name, vmi, now)
            self._last_migration[vmi] = now
        self._metrics.migrations.inc()
        message = (
            f"VM {vmi[0]}/{vmi[1]} live-migrates off cordoned node {name}: "
            f"{names.VMIM_KIND} {key[1]} created"
        )
        log.info(
            "migration created",
            reason=draining.DRAIN_MIGRATING,
            node=name,
            vmi=f"{vmi[0]}/{vmi[1]}",
            migration=key[1],
        )
        self.recorder.event(
            node, "Normal", draining.DRAIN_MIGRATING, message, kind="Node", api_version="v1"
        )
        return InFlight(
            key=key,
            vmi=vmi,
            claims=(),
            source=name,
            target="",
            since=str(objects.meta(made).get("creationTimestamp") or ""),
        )

    def _flag(self, key: Key, reason: str, message: str) -> bool:
        """The claim's ``NodeCordoned`` condition says ``reason``: whether it does now."""
        claim = self.ledger.claim(key)
        if claim is None:
            return True
        status = claim_states.flagged(claim, draining.CONDITION, reason, message, self.clock.now())
        if status is None:
            return True  # it says so already
        return self.statuses.write(
            claim,
            status,
            Announcement(
                "claim's VM live-migrates off a cordoned node",
                reason,
                message,
                fields={"node": (claim.get("status") or {}).get("nodeName")},
            ),
        ).ok

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
        message = (
            f"VMs block the drain of node {name} (they do not live-migrate: passthrough and "
            f"DRA GPUs never do, a vGPU VM only with evictionStrategy "
            f"{names.EVICTION_STRATEGY_LIVE_MIGRATE}): {text}"
        )
        log.info("drain blocked", reason=DRAIN_BLOCKED, node=name, blocking=text)
        self.recorder.event(node, "Warning", DRAIN_BLOCKED, message, kind="Node", api_version="v1")


def flagged(claim: Obj) -> bool:
    """Whether the claim carries the ``NodeCordoned`` condition."""
    found = (claim.get("status") or {}).get("conditions")
    return conditions.find(found, draining.CONDITION) is not None


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: its fenced writer (migrations created), and
    the fenced writer of DRA holds."""

    @property
    def writer(self) -> ApiAccess: ...

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
            writer=manager.writer,
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

    def node_of_migration(migration: Obj) -> list[Key]:
        """The node a migration drains (ours say so) and its VM's node, when cordoned."""
        read = migrations.migration(migration)
        vmi = caches.vmis.store.get((read.namespace, read.vmi_name)) if read else None
        found = {
            str(objects.annotations(migration).get(names.DRAINED_NODE_ANNOTATION) or ""),
            migrations.vmi_node(vmi),
        }
        with cordoned_lock:
            return [("", n) for n in sorted(found) if n in cordoned]

    manager.add_controller(
        controller,
        [
            (caches.nodes, from_node),
            (caches.claims, node_of_claim),
            (ledger.changes, cordoned_nodes),
            (caches.migrations, node_of_migration),
        ],
    )
    return controller
