"""The binder: binds Pending (and Lost) claims of a class to one eligible node each.

Key = class name, one worker: a class's claims are decided together, in order of creation
(``model.binding.plan``: FIFO with backfill, binpack or spread, unexpired ``refusedNodes``
skipped: the oldest claim that fits nowhere nominates the node it will fit on soonest, and
younger claims are bound anywhere else), on the ledger's current figures, and each
binding is written to the claim's status with its resourceVersion as precondition
(``claim_status``). Budgets and the vGPU entitlement are re-checked at bind time (two orders
can pass the webhook together; template claims never met it). The class's nomination is
logged when it changes; each waiting claim's ``Bound`` condition says why it waits.

**Preemptible classes** (docs/design.md §5 "Preemptible classes"). When the oldest waiting
claim of a guaranteed class fits nowhere, the idle preemptible holds ``model.preemption``
chooses are written back to ``Pending`` (reason ``Preempted``, an Event on each), and once
every write has landed the class is planned again in the same pass, still under the
allocation lock, so the units freed go to that claim and to no other decision.

A bound claim whose node is gone becomes ``Lost`` (an Event says so) and is planned again
in the same pass: bound elsewhere, or back to ``Pending`` with the reason it waits on its
``Bound`` condition (docs/design.md §5). The ledger wakes the classes of a deleted node's
claims even when the node served nothing any more (NotReady or cordoned before it went).
``status.lostNode`` names the lost node until the claim is bound again. Every status the
binder writes is one of ``model.claim_states``.

A claim is bound only once it carries the claim-protection finalizer. It is normally set at
admission (``config/policy``), so the binding is the claim's first write; where it is not,
the protection controller's write comes first, and binding after it spares a conflict.

**DRA classes** (docs/design.md §5 "DRA classes"). The plan runs on the class's free
devices (``Ledger.dra_inventory``), and each binding takes the devices
``model.dra_holds.assign`` gives it. A binding is written in three steps, each settling the
claim's assumption as its status write does: the claim's ``dra_bound`` state is assumed
(its devices count as held from then on), the ResourceClaim (``dra_holds.resource_claim``,
controlled by the GPUClaim) is created and its allocation written through the status
subresource with the reply's resourceVersion as precondition, then the claim's status. A
conflict or a ResourceClaim that is not the claim's forgets the assumption (the next pass
decides on the watched state); an unknown outcome keeps it for ``ASSUME_TTL``. A waiting
claim whose own ResourceClaim is already allocated (a pass that stopped between the
allocation and the claim's status, or a claim that went back to waiting) is bound to what
that allocation holds, on a node that still exists and has not refused the claim; otherwise
the hold is deleted first (uid precondition) and the claim is bound anew once the watch
shows it gone. A
tenant's ResourceClaim of the claim's name is never adopted: the claim waits, saying so.
Deleting the GPUClaim frees its devices through garbage collection of the ResourceClaim it
controls.

Never over-allocating rests on four things:

* one decision at a time: a pass holds ``Ledger.allocation_lock`` (placement's and
  draining's moves take it too) from reading the figures until **every** write it started
  has ended — a failed write does not let the pass leave while the others are still in
  flight;
* the claims and figures a pass reads are the ledger's *assumed* state: a plan's
  bindings are counted before their writes leave (``ClaimStatus.assume``), and kept until
  the watch delivers a newer version, so the next pass neither plans a claim bound a moment
  ago (no wasted 409, no false ``NoCapacity``) nor hands its units out again; an
  assumption that releases units (a node refusal unbinding a claim) frees nothing until its
  write is confirmed, and a claim whose last write is unconfirmed is left out of the pass
  (a bind is written only on top of a stored waiting version, so a claim changes node only
  through a stored version that released the first one);
* a 409 on the binder's own retried write is recognised as its own (``claim_status``);
* writes are fenced — a replica that stops leading stops writing, even between retries,
  and each attempt ends before another replica may take the Lease; and a replica that
  becomes leader lists every claim afresh into the ledger before its first pass, so the
  previous leader's last bindings count even if its watch has not delivered them yet.
"""

from __future__ import annotations

import contextvars
import datetime
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuoperator import dra_hold_writes, names
from gpuoperator.caches import BY_NAMESPACE, Caches, class_of_claim, own_key
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.dra_hold_writes import HoldsAccess
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger, changed_classes
from gpuoperator.model import (
    binding,
    claim_states,
    conditions,
    dra_devices,
    dra_holds,
    orders,
    preemption,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime import managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "binder"
#: Seconds before a pass that left out a claim with a write in flight looks again (a safety
#: net: the write's outcome or the watch's next version wakes the class too).
UNCONFIRMED_RECHECK = 1.0


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.wait = Histogram(
            "gpuoperator_claim_bind_wait_seconds",
            "Seconds from a claim's creation to its binding",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 86400),
            registry=registry,
        )
        self.preemptions = Counter(
            "gpuoperator_preemptions_total",
            "Preemptible holds taken back for guaranteed orders, by the preemptible class",
            ["gpuclass"],
            registry=registry,
        )


_metrics = per_registry(_Metrics)


class Binder:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        statuses: ClaimStatus,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
        holds: HoldsAccess | None = None,
    ) -> None:
        #: The fenced writer of DRA holds; without it DRA claims wait (DRA binding off).
        self.holds = holds
        self.caches = caches
        self.ledger = ledger
        self.statuses = statuses
        self.settings = settings
        self.clock = clock
        self._metrics = _metrics(registry)
        #: class name -> the nomination last logged (a line is logged when it changes)
        self._nominations: dict[str, binding.Nomination | None] = {}
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="bind")

    def reconcile(self, key: Key) -> Result | None:
        with self.ledger.allocation_lock:
            return self._reconcile(key[1])

    def _reconcile(self, class_name: str, *, took_back: bool = False) -> Result | None:
        # The ledger's view: a claim bound (or lost) a moment ago reads as such even
        # while the claims cache still shows the version before.
        claims, unconfirmed = self.ledger.settled_claims_of_class(class_name)
        cls = self.caches.classes.store.get(("", class_name))
        if cls is None:
            for claim in claims:
                if binding.is_waiting(claim):
                    self._write_waiting(
                        claim,
                        "ClassNotFound",
                        f"class {class_name} does not exist (kubectl get gpuclasses)",
                    )
            return None
        lost = [
            c
            for c in claims
            if gpuclaims.is_bound(c) and not self.ledger.has_node(gpuclaims.node_name(c))
        ]
        for claim in lost:
            self._lose(claim)
        if lost:
            claims, unconfirmed = self.ledger.settled_claims_of_class(class_name)
        candidates = []
        tenants: dict[str, list[Obj]] = {}  # namespace -> its claims, read once per pass
        for claim in claims:
            if not binding.is_waiting(claim) or claim["metadata"].get("deletionTimestamp"):
                continue
            if names.CLAIM_PROTECTION_FINALIZER not in claim["metadata"].get("finalizers", []):
                # Bound only once protected: the protection controller's write comes first
                # (it enqueues the class again), so the bind does not race it into a 409.
                continue
            why = self._refusal(claim, cls, tenants)
            if why is not None:
                self._write_waiting(claim, why.reason.value, why.message)
            else:
                candidates.append(claim)
        now = self.clock.now()
        devices = None
        if gpuclasses.is_dra(cls) and self.holds is not None:
            candidates = self._dra_candidates(candidates, now)
            devices = self.ledger.dra_inventory(class_name)
        plan = self.ledger.plan(
            candidates, cls, self.settings.placement_policy, now, devices=devices
        )
        self._log_nomination(class_name, plan.nomination)
        by_key = {gpuclaims.key(c): c for c in candidates}
        # The oldest claim that fits nowhere may fit once preemptible holds give their units
        # back: take them back, then plan again within this pass (the allocation lock is
        # still held, so no other decision takes the units meanwhile).
        if (
            plan.nomination is not None
            and not took_back
            and devices is None
            and self._take_back(cls, by_key[plan.nomination.claim], now)
        ):
            return self._reconcile(class_name, took_back=True)
        if devices is not None:
            self._bind_dra(cls, by_key, plan.bindings, devices, now)
        else:
            self._bind_all([(by_key[key_], node) for key_, node in plan.bindings], now)
        for claim_key, waiting in plan.waiting.items():
            self._write_waiting(by_key[claim_key], waiting.reason.value, waiting.message)
        looks: list[float] = []
        if plan.waiting and any(_refusals(c) for c in by_key.values()):
            looks.append(30.0)  # a refusal expires: look again
        expiry = self.ledger.next_expiry(class_name)
        if expiry is not None:
            looks.append(expiry + 0.1)  # a write with an unknown outcome is forgotten then
        elif unconfirmed:
            looks.append(UNCONFIRMED_RECHECK)  # another controller's write is in flight
        return Result(requeue_after=min(looks)) if looks else None

    def _take_back(self, cls: Obj, claim: Obj, now: datetime.datetime) -> bool:
        """Take back the preemptible holds ``model.preemption`` chooses for ``claim``, each
        written back to ``Pending`` (reason ``Preempted``, an Event on it); True when every
        one was written, so a new plan finds their units free. Returns only once every
        write has ended (as :meth:`_bind_all`)."""
        spot_claims = self.ledger.spot_claims(cls)
        if not spot_claims:
            return False
        vmis = self.caches.served_vmis(spot_claims)
        found = self.ledger.take_back(
            claim, cls, spot_claims, vmis, self.settings.placement_policy, now
        )
        if found is None or not found.holds:
            return False
        by = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        log.info(
            "taking back preemptible holds",
            reason=claim_states.PREEMPTED,
            claim=by,
            node=found.node,
            units=found.units,
            holds=[f"{h.key[0]}/{h.key[1]}" for h in found.holds],
        )
        spots = [self.ledger.claim(hold.key) for hold in found.holds]
        if any(s is None or not gpuclaims.is_bound_to(s, found.node) for s in spots):
            return False  # changed since the figures were read: decide again
        intended = []
        for spot in filter(None, spots):
            message = claim_states.preempted_message(
                found.node, by, gpuclasses.name(cls), orders.ordered_class(spot)
            )
            status = claim_states.preempted(spot, message, now, clear=(preemption.CONDITION,))
            intended.append((self.statuses.assume(spot, status), message))
        futures = [
            self._pool.submit(
                contextvars.copy_context().run,
                self.statuses.send,
                obj,
                Announcement(
                    "hold taken back",
                    claim_states.PREEMPTED,
                    message,
                    fields={"node": found.node, "by": by},
                ),
            )
            for obj, message in intended
        ]
        wait(futures)
        written = [future.result() for future in futures]  # the first failure, none in flight
        for (obj, _), outcome in zip(intended, written, strict=True):
            if outcome.ok:
                self._metrics.preemptions.labels(orders.ordered_class(obj)).inc()
        return all(w.ok for w in written)

    def _log_nomination(self, class_name: str, nomination: binding.Nomination | None) -> None:
        """One line when the class's nomination changes (claim, node, or units missing): the
        claim's own condition says the same to its tenant."""
        if self._nominations.get(class_name) == nomination:
            return
        self._nominations[class_name] = nomination
        if nomination is None:
            log.info("nomination cleared", reason="NoNomination", gpuclass=class_name)
            return
        log.info(
            "node nominated",
            reason="Nominated",
            gpuclass=class_name,
            claim=f"{nomination.claim[0]}/{nomination.claim[1]}",
            node=nomination.node,
            need=nomination.need,
            missing=nomination.missing,
        )

    def _bind_all(self, bindings: list[tuple[Obj, str]], now: datetime.datetime) -> None:
        """Write a plan's bindings together and return only once every write has ended.

        All are assumed into the ledger first (their units are counted before anything is
        sent), then written in parallel (each in a copy of this reconcile's log context).
        The first failure is raised after the last write ended, never before: leaving early
        would let the next pass plan on figures the writes still running are about to take.
        """
        intended = [
            (
                self.statuses.assume(
                    claim, claim_states.bound(claim, node, now, self.caches.served_vmi(claim))
                ),
                node,
            )
            for claim, node in bindings
        ]
        futures: list[Future[None]] = [
            self._pool.submit(contextvars.copy_context().run, self._bind, obj, node)
            for obj, node in intended
        ]
        wait(futures)
        for future in futures:
            future.result()  # raises the first failure, now that none is in flight

    # ---- DRA holds ----------------------------------------------------------------------
    def _dra_candidates(self, candidates: list[Obj], now: datetime.datetime) -> list[Obj]:
        """The DRA claims to plan: a claim whose own hold is already allocated is not
        planned but bound to it (:meth:`_adopt`); a claim whose name a tenant's
        ResourceClaim has taken waits, saying so."""
        planned: list[Obj] = []
        for claim in candidates:
            hold = self.ledger.resource_claim(gpuclaims.key(claim))
            if hold is None:
                planned.append(claim)
            elif not dra_holds.is_hold_of(hold, claim):
                self._write_waiting(
                    claim,
                    binding.WaitReason.NO_CAPACITY.value,
                    f"a ResourceClaim named {dra_holds.resource_claim_name(claim)} exists in "
                    "the namespace and is not this claim's; it holds its devices only through "
                    "a ResourceClaim of its own name (delete or rename that ResourceClaim)",
                )
            elif not dra_holds.allocated(hold):
                planned.append(claim)
            else:
                self._adopt(claim, hold, now)
        return planned

    def _adopt(self, claim: Obj, hold: Obj, now: datetime.datetime) -> None:
        """Bind ``claim`` to what its allocated ``hold`` holds, on the node the allocation
        names; on a node that is gone or among the claim's unexpired refusals, delete the
        hold instead (uid precondition): the claim is planned anew once the watch shows it
        gone, and its devices stay counted by the allocation until then."""
        node = dra_holds.allocation_node(hold)
        if (
            node
            and self.ledger.has_node(node)
            and node not in binding.unexpired_refusals(claim, now)
        ):
            chosen = dra_holds.allocated(hold)
            state = claim_states.dra_bound(
                claim,
                node,
                dra_holds.resource_claim_name(claim),
                chosen,
                now,
                self.caches.served_vmi(claim),
            )
            self._bind(self.statuses.assume(claim, state), node)
            return
        log.info(
            "deleting a hold on a node that is gone or refused the claim",
            reason="HoldReleased",
            claim=f"{gpuclaims.key(claim)[0]}/{gpuclaims.key(claim)[1]}",
            node=node,
        )
        dra_hold_writes.release(self.holds_writer(), hold)

    def holds_writer(self) -> HoldsAccess:
        if self.holds is None:
            raise RuntimeError("DRA binding needs the holds writer")
        return self.holds

    def _bind_dra(
        self,
        cls: Obj,
        by_key: dict[Key, Obj],
        bindings: list[tuple[Key, str]],
        devices: dra_devices.Inventory,
        now: datetime.datetime,
    ) -> None:
        """The plan's DRA bindings, each assumed before any is written (module docstring),
        then written together as :meth:`_bind_all` writes device-plugin bindings (each
        binding's three writes in order); the first failure is raised after the last
        write ended, never before."""
        source = gpuclasses.dra(cls)
        assert source is not None
        chosen = dra_holds.assign(
            [(k, n, orders.ordered_count(by_key[k])) for k, n in bindings], devices
        )
        intended = []
        for key_, node in bindings:
            if key_ not in chosen:
                continue
            claim = by_key[key_]
            state = claim_states.dra_bound(
                claim,
                node,
                dra_holds.resource_claim_name(claim),
                chosen[key_],
                now,
                self.caches.served_vmi(claim),
            )
            intended.append((claim, self.statuses.assume(claim, state), node))
        futures: list[Future[None]] = [
            self._pool.submit(
                contextvars.copy_context().run,
                self._hold_and_bind,
                claim,
                obj,
                node,
                source.device_class_name,
                now,
            )
            for claim, obj, node in intended
        ]
        wait(futures)
        for future in futures:
            future.result()  # raises the first failure, now that none is in flight

    def _hold_and_bind(
        self, claim: Obj, intended: Obj, node: str, device_class: str, now: datetime.datetime
    ) -> None:
        writer = self.holds_writer()
        if dra_hold_writes.allocate(writer, self.ledger, claim, intended, node, device_class, now):
            self._bind(intended, node)

    # ---- decisions --------------------------------------------------------------------
    def _refusal(
        self, claim: Obj, cls: Obj, tenants: dict[str, list[Obj]]
    ) -> orders.Refusal | None:
        ns = claim["metadata"]["namespace"]
        namespace = self.caches.namespaces.store.get(("", ns))
        quotas = self.caches.quotas.store.by_index(BY_NAMESPACE, ns)
        # No budget in this namespace: nothing to add up, so no claims are read.
        others = self._tenant_claims(ns, tenants) if quotas else []
        return orders.binding_refusal(claim, cls, namespace, quotas, others)

    def _tenant_claims(self, ns: str, tenants: dict[str, list[Obj]]) -> list[Obj]:
        """The namespace's claims as the ledger counts them — a claim this replica bound
        a moment ago reads as Bound while the claims cache still shows it Pending (a budget
        added up on the cache would let a later pass bind past it) — read once per pass, so
        every claim of the pass is judged on the same figures while the watch moves on."""
        if ns not in tenants:
            cached = self.caches.claims.store.by_index(BY_NAMESPACE, ns)
            tenants[ns] = [self.ledger.claim(key_of(c)) or c for c in cached]
        return tenants[ns]

    def _bind(self, intended: Obj, node: str) -> None:
        count = intended["spec"]["count"]
        message = f"bound to node {node} ({count} unit(s))"
        held = intended["status"].get("devices")
        if held:
            names_ = ", ".join(f"{d['driver']}/{d['pool']}/{d['device']}" for d in held)
            message = (
                f"bound to node {node}, devices {names_} held by ResourceClaim "
                f"{intended['status'].get('resourceClaimName')}"
            )
        written = self.statuses.send(
            intended,
            Announcement(
                "claim bound",
                claim_states.BOUND,
                message,
                fields={"node": node, "count": count},
            ),
        )
        if written.ok:
            created = conditions.parse_stamp(intended["metadata"].get("creationTimestamp"))
            if created is not None:
                waited = (self.clock.now() - created).total_seconds()
                self._metrics.wait.observe(max(0.0, waited))

    def _write_waiting(self, claim: Obj, reason: str, message: str) -> None:
        """Write the claim's waiting status (``reason``, ``message``) unless it says so
        already; a new reason, or a claim that was Lost, is announced."""
        status = claim_states.waiting(claim, reason, message, self.clock.now())
        if status is None:
            return  # it says so already
        current = conditions.find(
            (claim.get("status") or {}).get("conditions"), gpuclaims.BOUND_CONDITION
        )
        lost = gpuclaims.phase(claim) == gpuclaims.Phase.LOST
        announce = None
        if lost or not current or current.get("reason") != reason:
            told = claim_states.waiting_message(claim, message)
            announce = Announcement(
                "claim waits",
                reason,
                told,
                event="Normal" if reason == binding.WaitReason.QUEUED.value else "Warning",
                fields={"detail": told},
            )
        self.statuses.write(claim, status, announce)

    def _lose(self, claim: Obj) -> None:
        node = gpuclaims.node_name(claim)
        self.statuses.write(
            claim,
            claim_states.lost(claim, self.clock.now()),
            Announcement(
                "claim lost its node",
                claim_states.NODE_LOST,
                claim_states.lost_message(node),
                event="Warning",
                level="warning",
                fields={"node": node},
            ),
        )


def _refusals(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("refusedNodes"))


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: a hook run on becoming leader, its (unfenced)
    client to read every claim afresh then, and the fenced writer of DRA holds."""

    @property
    def client(self) -> protocols.Lists: ...

    def writer_for(self, component: str) -> HoldsAccess: ...

    def on_leading(self, hook: Callable[[], None]) -> None: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    statuses: ClaimStatus,
    settings: Settings,
) -> Controller[Key]:
    binder = Binder(
        caches,
        ledger,
        statuses,
        settings,
        clock=manager.clock,
        registry=manager.registry,
        holds=manager.writer_for(NAME),
    )
    controller = manager.controller(NAME, binder, workers=1, seed=caches.class_keys)
    # A new leader first reads every claim afresh: the previous leader's last bindings may
    # not have reached this replica's watch yet. They are slimmed as the cache slims them.
    slim = caches.claims.options.transform
    manager.on_leading(lambda: ledger.catch_up(manager.client.list(GPUClaim, transform=slim)[0]))

    def every_class(_obj: Obj) -> list[Key]:
        return caches.class_keys()

    manager.add_controller(
        controller,
        [
            (caches.claims, class_of_claim),
            (caches.classes, own_key),
            (caches.quotas, every_class),
            (caches.namespaces, every_class),
            (ledger.changes, changed_classes),
        ],
    )
    return controller
