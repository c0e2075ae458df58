"""Claim metrics, computed on each scrape from the claims cache (``model.tallies``): no
per-event bookkeeping that could drift from what the cluster holds.

* ``gpuoperator_claims{gpuclass,phase,reason}``: claims per class, phase and the reason
  of their ``Bound`` condition;
* ``gpuoperator_claim_oldest_pending_seconds{gpuclass}``: seconds since the creation of
  the class's oldest claim that waits for a node (only classes that have one).

Only the replica that leads exports samples; the others expose the two families empty.
Every replica's cache holds every claim, but the phases and reasons are the leader's
decisions, and one exporter keeps sums across replicas right. Because the figures are
computed at scrape time, a replica that stops leading exports nothing from its next scrape
on: no stale figures of a former leader remain, and queries still read them ``and on
(instance) gpuoperator_leader_is_leader == 1`` as they read the inventory gauges.

Samples appear and disappear with the combinations that occur: a class with no pending
claim has no ``oldest_pending`` sample (Prometheus marks the series stale), so an alert on
it goes quiet once the claim is bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuoperator.caches import Caches
from gpuoperator.model import tallies
from gpuoperator.runtime import managing
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock


class ClaimMetrics:
    """A collector over ``claims()`` (the claims cache's objects), exporting samples only
    while ``is_leader()`` holds."""

    def __init__(
        self,
        claims: Callable[[], Iterable[Obj]],
        is_leader: Callable[[], bool],
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.claims = claims
        self.is_leader = is_leader
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        """The families without samples (so registering does not read the cache)."""
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        claims, oldest = self._families()
        if self.is_leader():
            tally = tallies.of_claims(self.claims(), self.clock.now())
            for (cls, phase, reason), n in sorted(tally.counts.items()):
                claims.add_metric([cls, phase, reason], n)
            for cls, age in sorted(tally.oldest_pending.items()):
                oldest.add_metric([cls], age)
        return [claims, oldest]

    @staticmethod
    def _families() -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "gpuoperator_claims",
            "GPU claims per class, phase and reason of their Bound condition (leader only)",
            labels=["gpuclass", "phase", "reason"],
        )
        yield GaugeMetricFamily(
            "gpuoperator_claim_oldest_pending_seconds",
            "Seconds since the creation of the class's oldest claim waiting for a node "
            "(leader only)",
            labels=["gpuclass"],
        )


class ManagerAccess(managing.Leads, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager."""


def register(manager: ManagerAccess, caches: Caches) -> ClaimMetrics:
    """Register the collector in the manager's registry, over the shared claims cache."""
    collector = ClaimMetrics(caches.claims.store.values, manager.is_leader, clock=manager.clock)
    manager.registry.register(collector)
    return collector
