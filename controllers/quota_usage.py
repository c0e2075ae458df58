"""Quota usage: the GPU budget keys of every ResourceQuota show what is used, so tenants
read their budgets with ``kubectl describe quota`` (docs/design.md §3).

Key = a ResourceQuota ``(namespace, name)``; woken by the quota itself and by every claim
of its namespace. The used values are ``model.quota_usage`` (the budget usage the order
webhook and the binder judge by); only the budget keys of ``spec.hard`` that differ are
written.

Why a merge patch of the status subresource, without a resourceVersion: the patch names
only our keys, so it can never overwrite a key Kubernetes computes (pods, cpu, ``count/*``),
and the API server applies it to the stored object (it retries its own conflicts), so no
409 reaches us. The quota controller and quota admission write the whole status with their
resourceVersion: when our patch lands between their read and their write, theirs is the one
refused, and they retry on the stored status, which carries our keys (the quota controller
keeps ``used`` entries of keys it cannot compute and drops only keys no longer in
``spec.hard``). Values come from the claims cache; a value written from a cache a moment
behind is corrected by the claim event that follows.
"""

from __future__ import annotations

from typing import Protocol

import pykube
import structlog
from prometheus_client import CollectorRegistry, Counter

from gpuoperator.caches import BY_NAMESPACE, Caches, own_key
from gpuoperator.model import quota_usage
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

NAME = "quota-usage"


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.writes = Counter(
            "gpuoperator_quota_usage_writes_total",
            "ResourceQuota status writes of GPU budget usage, by outcome (Written, Gone)",
            ["outcome"],
            registry=registry,
        )


_metrics = per_registry(_Metrics)


class ApiAccess(protocols.Patches, Protocol):
    """What quota usage asks of the API server: merge patches of ResourceQuota status."""


class QuotaUsage:
    def __init__(
        self, caches: Caches, writer: ApiAccess, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.caches = caches
        self.writer = writer
        self._metrics = _metrics(registry)

    def reconcile(self, key: Key) -> Result | None:
        namespace, name = key
        rq = self.caches.quotas.store.get(key)
        if rq is None:
            return None
        claims = self.caches.claims.store.by_index(BY_NAMESPACE, namespace)
        changed = quota_usage.used_patch(rq, claims)
        if not changed:
            return None
        try:
            self.writer.patch(
                pykube.ResourceQuota,
                name,
                {"status": {"used": changed}},
                namespace,
                subresource="status",
            )
        except errors.NotFoundError:
            self._metrics.writes.labels("Gone").inc()
            return None
        self._metrics.writes.labels("Written").inc()
        log.info(
            "quota usage written",
            reason="UsageChanged",
            quota=f"{namespace}/{name}",
            used=changed,
        )
        return None


class ManagerAccess(managing.Controls, managing.Measured, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


def register(manager: ManagerAccess, caches: Caches) -> Controller[Key]:
    def budget_quotas() -> list[Key]:
        return [key_of(rq) for rq in caches.quotas.store.values() if quota_usage.budget_keys(rq)]

    controller = manager.controller(
        NAME,
        QuotaUsage(caches, manager.writer, registry=manager.registry),
        workers=2,
        seed=budget_quotas,
    )

    def own_budget_quota(rq: Obj) -> list[Key]:
        return own_key(rq) if quota_usage.budget_keys(rq) else []

    def quotas_of_claim(claim: Obj) -> list[Key]:
        namespace = (claim.get("metadata") or {}).get("namespace") or ""
        return [
            key_of(rq)
            for rq in caches.quotas.store.by_index(BY_NAMESPACE, namespace)
            if quota_usage.budget_keys(rq)
        ]

    manager.add_controller(
        controller, [(caches.quotas, own_budget_quota), (caches.claims, quotas_of_claim)]
    )
    return controller
