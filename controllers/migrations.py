"""Migrations: the transient holds of a VM's live migration, chosen, written and ended
(docs/design.md §5 "Live migration"; ``model.migrations`` says which VMs, how a migration
ends; ``model.binding.migration_target`` where to).

Key = a VMI ``(namespace, name)``; woken by its VirtualMachineInstanceMigrations, the VMI,
the claims serving it and its migration target pods (``kubevirt.io/migrationJobUID``).
Everything is read from the caches and the ledger, so whatever one leader left half done
the next one finishes or clears from the same objects. One pass, under
``Ledger.allocation_lock`` (the lock of every decision that hands units out):

* **ending transient holds.** Each claim of the VM whose ``status.migration`` names a
  migration is judged (``migrations.verdict``): *migrated* (the VMI's ``migrationState`` is
  that migration's, completed on the target) moves the claim there in one write
  (``claim_states.migrated``: ``nodeName`` the target, ``Bound`` reason ``Migrated``,
  ``status.migration`` removed, Event ``Migrated`` naming both nodes); *cleared* (failed,
  aborted, the migration object gone or finished ``Failed``, its target pod gone before
  completion, completed elsewhere) removes the transient hold and the claim stays
  (``Migrating`` False with the reason, a Warning Event).
* **holding.** For a migration that may still be held (``migrations.may_hold``: not
  finished nor being deleted, its target pod not scheduled yet, not ended), of a VM that may
  migrate (``migrations.refusal``: every claim Bound on the VMI's node, all of ``vgpu``
  device-plugin classes, no host devices, no DRA claims; otherwise nothing is written and a
  debug line says why: KubeVirt itself refuses such migrations), one target node is chosen
  for all the claims on the ledger's figures, never from what older waiting claims keep
  (the binder's own plan of them, ``binding.older_waiting``/``kept_by``), and each claim's
  ``status.migration`` is written as a binding is (``claim_status``: every state assumed
  into the ledger first, so its units count on the target before the writes leave;
  resourceVersion preconditions; the fenced writer). A migration whose first transient
  holds are written keeps their node for the rest. **No target**: the migration object is
  deleted (UID precondition; KubeVirt aborts the migration) before its target pod could
  time out, and each claim's ``Migrating`` condition says ``NoTargetCapacity`` with the
  count, class and why, with a Warning Event.

A claim whose last write is unconfirmed is decided once settled (the pass looks again). The
``gpuoperator_migrations_total{gpuclass,outcome}`` counter counts each claim's migration
outcome (``Migrated``, ``NoTargetCapacity`` and the clearing reasons).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.claim_status import Announcement, ClaimStatus
from gpuoperator.kinds import VirtualMachineInstanceMigration
from gpuoperator.ledger import Ledger
from gpuoperator.model import binding, claim_states, migrations, orders, pods, references, templates
from gpuoperator.model import claims as gpuclaims
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "migrations"
#: Seconds before a pass that met an unconfirmed write or lost a race looks again.
RETRY: Final = 1.0


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.outcomes = Counter(
            "gpuoperator_migrations_total",
            "Live migrations' outcomes per claim (Migrated, NoTargetCapacity, MigrationFailed, "
            "MigrationAborted, MigrationGone, TargetPodGone, TargetMismatch)",
            ["gpuclass", "outcome"],
            registry=registry,
        )


_metrics = per_registry(_Metrics)


def _meta(obj: Mapping[str, object] | None) -> Mapping[str, object]:
    found = (obj or {}).get("metadata")
    return found if isinstance(found, Mapping) else {}


def _text(claim: Obj) -> str:
    key = key_of(claim)
    return f"{key[0]}/{key[1]}"


class ApiAccess(protocols.Deletes, Protocol):
    """What the controller asks of the API server besides claim status writes: deleting a
    migration that gets no target."""


class Migrations:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        statuses: ClaimStatus,
        writer: ApiAccess,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.statuses = statuses
        self.writer = writer
        self.settings = settings
        self.clock = clock
        self._metrics = _metrics(registry)

    # ---- reading ----------------------------------------------------------------------------
    def _claims(self, namespace: str, vmi_name: str) -> list[Obj]:
        """The claims of the namespace serving the VMI of that name (its owner or
        attachment), as the ledger counts them, in order of creation."""
        found = [
            self.ledger.claim(key_of(c)) or c
            for c in self.caches.claims_of_vmi(namespace, vmi_name)
            if (ref := gpuclaims.user(c)) is not None and ref.name == vmi_name
        ]
        return sorted(found, key=orders.creation_order)

    def _migrations(self, namespace: str, vmi_name: str) -> dict[str, migrations.Migration]:
        """The VMI's migration objects by UID."""
        out: dict[str, migrations.Migration] = {}
        for obj in self.caches.migrations.store.by_index(BY_NAMESPACE, namespace):
            found = migrations.migration(obj)
            if found is not None and found.vmi_name == vmi_name:
                out[found.uid] = found
        return out

    def _target_pods(self, namespace: str, vmi: Obj | None, uid: str) -> list[Obj]:
        """The cached target pods of migration ``uid`` controlled by ``vmi``."""
        vmi_uid = str(_meta(vmi).get("uid") or "")
        return [
            pod
            for pod in self.caches.pods_of_vmi(namespace, str(_meta(vmi).get("name") or ""))
            if pods.migration_job(pod) == uid
            and (owner := gpuclaims.controlling_vmi(pod)) is not None
            and owner.uid == vmi_uid
        ]

    # ---- the pass ---------------------------------------------------------------------------
    def reconcile(self, key: Key) -> Result | None:
        namespace, vmi_name = key
        found = self._migrations(namespace, vmi_name)
        claims = self._claims(namespace, vmi_name)
        vmi = self.caches.vmis.store.get(key)
        state = migrations.migration_state(vmi)
        active = [m for m in found.values() if migrations.may_hold(m, state)]
        if not active and not any(migrations.transient_hold(c) for c in claims):
            return None
        retry = False
        with self.ledger.allocation_lock:
            for claim in claims:
                retry = self._end(claim, vmi, found) or retry
            for migration in sorted(active, key=lambda m: m.name):
                retry = self._hold(migration, vmi) or retry
        return Result(requeue_after=RETRY) if retry else None

    # ---- ending -----------------------------------------------------------------------------
    def _end(self, claim: Obj, vmi: Obj | None, found: Mapping[str, migrations.Migration]) -> bool:
        """Finish or clear the claim's transient hold when its migration ended; whether to
        look again."""
        hold = migrations.transient_hold(claim)
        if hold is None:
            return False
        if self.ledger.unconfirmed(key_of(claim)):
            return True
        namespace = key_of(claim)[0]
        verdict = migrations.verdict(
            hold,
            found.get(hold.uid),
            migrations.migration_state(vmi),
            self._target_pods(namespace, vmi, hold.uid),
        )
        if verdict.end is migrations.End.KEPT:
            return False
        now = self.clock.now()
        source = gpuclaims.node_name(claim)
        if verdict.end is migrations.End.MIGRATED and gpuclaims.is_bound(claim):
            message = claim_states.migrated_message(source, hold.target_node)
            status = claim_states.migrated(claim, now)
            announce = Announcement(
                "claim moved with its VM's live migration",
                migrations.MIGRATED,
                message,
                fields={"source": source, "node": hold.target_node, "migration": hold.uid},
            )
        else:
            reason = verdict.reason or migrations.MIGRATION_GONE
            message = f"{verdict.message}; the claim stays on node {source}"
            status = claim_states.migration_cleared(claim, reason, message, now) or {}
            announce = Announcement(
                "transient hold cleared",
                reason,
                message,
                event="Warning",
                fields={"node": source, "target": hold.target_node, "migration": hold.uid},
            )
        written = self.statuses.write(claim, status, announce)
        if not written.ok:
            return True
        self._metrics.outcomes.labels(orders.ordered_class(claim), announce.reason).inc()
        return False

    # ---- holding ----------------------------------------------------------------------------
    def _vm_claims(self, vmi: Obj) -> tuple[list[str], dict[str, Obj]]:
        """The claims the VMI's references name, and those of them that exist and serve this
        very VMI, by name (as counted)."""
        namespace, vmi_name = key_of(vmi)
        try:
            names_ = templates.claim_names(vmi_name, references.from_object(vmi))
        except references.AnnotationError:
            return [], {}
        serving: dict[str, Obj] = {}
        for name in names_:
            cached = self.caches.claims.store.get((namespace, name))
            claim = self.ledger.claim((namespace, name)) or cached
            if claim is not None and gpuclaims.serves_live_vmi(claim, vmi):
                serving[name] = claim
        return names_, serving

    def _hold(self, migration: migrations.Migration, vmi: Obj | None) -> bool:
        """Write the transient holds of ``migration``, or cancel it; whether to look again."""
        if vmi is None:
            log.debug("migration of no cached VMI", reason="VMINotFound", vmim=migration.name)
            return False
        claim_names, serving = self._vm_claims(vmi)
        if not claim_names:
            return False  # not a VM with GPU claims: none of the operator's business
        classes: dict[str, Obj | None] = {
            name: self.caches.classes.store.get(("", orders.ordered_class(claim)))
            for name, claim in serving.items()
        }
        why = migrations.refusal(vmi, claim_names, serving, classes)
        if why:
            log.debug("no transient hold", reason="NotMigratable", vmim=migration.name, why=why)
            return False
        claims = [serving[name] for name in claim_names]
        if any(self.ledger.unconfirmed(key_of(c)) for c in claims):
            return True
        holds = [migrations.transient_hold(c) for c in claims]
        if all(h is not None and h.uid == migration.uid for h in holds):
            return False  # held already
        if any(h is not None and h.uid != migration.uid for h in holds):
            return False  # an earlier migration's holds are still to be ended
        placed = {h.target_node for h in holds if h is not None}
        missing = [c for c, h in zip(claims, holds, strict=True) if h is None]
        by_class = {
            orders.ordered_class(c): cls
            for c in claims
            if (cls := classes[key_of(c)[1]]) is not None
        }
        now = self.clock.now()
        source = migrations.vmi_node(vmi)
        target = self.ledger.migration_target(
            missing,
            by_class,
            self.settings.placement_policy,
            now,
            source=source,
            kept=self._kept(by_class, claims),
            only=next(iter(placed)) if placed else None,
        )
        if isinstance(target, binding.NoMigrationTarget):
            return self._cancel(migration, claims, target.message)
        hold = migrations.TransientHold(migration.uid, target.node)
        intended = [self.statuses.assume(c, claim_states.migrating(c, hold, now)) for c in missing]
        retry = False
        for claim in intended:
            written = self.statuses.send(
                claim,
                Announcement(
                    "transient hold written",
                    migrations.MIGRATING,
                    f"units held on node {target.node} for live migration {migration.name} "
                    f"from node {source}",
                    fields={"source": source, "node": target.node, "vmim": migration.name},
                ),
            )
            retry = retry or not written.ok
        return retry

    def _kept(self, classes: Mapping[str, Obj], migrating: list[Obj]) -> dict[str, binding.Kept]:
        """What the older waiting claims of each class keep (the binder's plan of them)."""
        kept: dict[str, binding.Kept] = {}
        for name, cls in classes.items():
            older = binding.older_waiting(self.ledger.claims_of_class(name), migrating)
            if not older:
                continue
            plan = self.ledger.plan(older, cls, self.settings.placement_policy, self.clock.now())
            kept[name] = binding.kept_by(plan, older)
        return kept

    def _cancel(self, migration: migrations.Migration, claims: list[Obj], why: str) -> bool:
        """No node takes the migration: delete it (KubeVirt aborts it), say why on each claim."""
        try:
            self.writer.delete(
                VirtualMachineInstanceMigration,
                migration.name,
                migration.namespace,
                uid=migration.uid,
            )
        except errors.NotFoundError:
            pass  # deleted already (by an earlier pass, whose watch event is on its way)
        except errors.ConflictError:
            return True  # another migration of that name: look again
        else:
            log.info(
                "migration cancelled: no target",
                reason=migrations.NO_TARGET_CAPACITY,
                vmim=migration.name,
                why=why,
            )
        message = f"{why} (migration {migration.name} was cancelled)"
        now = self.clock.now()
        retry = False
        for claim in claims:
            status = claim_states.migration_cleared(
                claim, migrations.NO_TARGET_CAPACITY, message, now
            )
            if status is None:
                continue  # it says so already
            written = self.statuses.write(
                claim,
                status,
                Announcement(
                    "live migration gets no target",
                    migrations.NO_TARGET_CAPACITY,
                    message,
                    event="Warning",
                    fields={"vmim": migration.name},
                ),
            )
            if written.ok:
                self._metrics.outcomes.labels(
                    orders.ordered_class(claim), migrations.NO_TARGET_CAPACITY
                ).inc()
            retry = retry or not written.ok
        return retry


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    statuses: ClaimStatus,
    settings: Settings,
) -> Controller[Key]:
    reconciler = Migrations(
        caches,
        ledger,
        statuses,
        manager.writer,
        settings,
        clock=manager.clock,
        registry=manager.registry,
    )

    def seed() -> list[Key]:
        keys = {
            (m.namespace, m.vmi_name)
            for obj in caches.migrations.store.values()
            if (m := migrations.migration(obj)) is not None
        }
        keys |= {k for c in caches.claims.store.values() for k in from_claim(c)}
        return sorted(keys)

    def from_migration(obj: Obj) -> list[Key]:
        found = migrations.migration(obj)
        return [(found.namespace, found.vmi_name)] if found is not None else []

    def from_claim(claim: Obj) -> list[Key]:
        ref = gpuclaims.user(claim)
        return [(key_of(claim)[0], ref.name)] if ref is not None else []

    def from_pod(pod: Obj) -> list[Key]:
        owner = gpuclaims.controlling_vmi(pod)
        if not pods.migration_job(pod) or owner is None:
            return []
        return [(key_of(pod)[0], owner.name)]

    controller = manager.controller(NAME, reconciler, workers=1, seed=seed)
    manager.add_controller(
        controller,
        [
            (caches.migrations, from_migration),
            (caches.vmis, lambda vmi: [key_of(vmi)]),
            (caches.claims, from_claim),
            (caches.pods, from_pod),
        ],
    )
    return controller
