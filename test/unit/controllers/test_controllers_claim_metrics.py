"""The claim metrics as a scrape shows them: computed from the claims cache at scrape time,
exported by the leader only, and gone from a replica the moment it stops leading."""

from __future__ import annotations

import datetime
import threading
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from controllers import claim_metrics
from gpuoperator import caches as cachesmod
from gpuoperator.runtime.client import Kind
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.informing import Informer, InformerOptions
from harness.offline import NoApiServer

Obj = dict[str, Any]
START = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)


class _FakeManager:
    """What ``claim_metrics.register`` and the caches read of a manager."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.clock = FakeClock(START)
        self.leading = threading.Event()
        self.leading.set()

    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        return Informer(NoApiServer(), kind, options, name=name)

    def is_leader(self) -> bool:
        return self.leading.is_set()


def claim(name: str, cls: str, created: str, phase: str, reason: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "tenant", "creationTimestamp": created},
        "spec": {"className": cls, "count": 1},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Bound", "status": str(phase == "Bound"), "reason": reason}],
        },
    }


def scrape(manager: _FakeManager) -> list[str]:
    text = generate_latest(manager.registry).decode()
    return [line for line in text.splitlines() if line.startswith("gpuoperator_claim")]


def wired() -> tuple[_FakeManager, cachesmod.Caches]:
    manager = _FakeManager()
    caches = cachesmod.register(manager)
    claim_metrics.register(manager, caches)
    return manager, caches


def test_a_scrape_counts_the_cached_claims_and_ages_the_oldest_pending_one() -> None:
    manager, caches = wired()
    for c in (
        claim("a", "a10", "2026-03-01T11:00:00Z", "Bound", "Bound"),
        claim("b", "a10", "2026-03-01T11:50:00Z", "Pending", "NoCapacity"),
        claim("c", "a10", "2026-03-01T11:55:00Z", "Pending", "NoCapacity"),
        claim("d", "l40s", "2026-03-01T11:59:00Z", "Pending", "NotEntitled"),
    ):
        caches.claims.store.put(c)
    assert scrape(manager) == [
        'gpuoperator_claims{gpuclass="a10",phase="Bound",reason="Bound"} 1.0',
        'gpuoperator_claims{gpuclass="a10",phase="Pending",reason="NoCapacity"} 2.0',
        'gpuoperator_claims{gpuclass="l40s",phase="Pending",reason="NotEntitled"} 1.0',
        'gpuoperator_claim_oldest_pending_seconds{gpuclass="a10"} 600.0',
        'gpuoperator_claim_oldest_pending_seconds{gpuclass="l40s"} 60.0',
    ]


def test_every_scrape_reads_the_cache_and_the_clock_afresh() -> None:
    manager, caches = wired()
    caches.claims.store.put(claim("b", "a10", "2026-03-01T11:50:00Z", "Pending", "NoCapacity"))
    manager.clock.advance(300)
    assert 'gpuoperator_claim_oldest_pending_seconds{gpuclass="a10"} 900.0' in scrape(manager)
    caches.claims.store.put(claim("b", "a10", "2026-03-01T11:50:00Z", "Bound", "Bound"))
    assert scrape(manager) == [
        'gpuoperator_claims{gpuclass="a10",phase="Bound",reason="Bound"} 1.0',
    ]
    caches.claims.store.remove(("tenant", "b"))
    assert scrape(manager) == []


def test_a_replica_that_does_not_lead_exports_no_claim_figures() -> None:
    manager, caches = wired()
    caches.claims.store.put(claim("b", "a10", "2026-03-01T11:50:00Z", "Pending", "NoCapacity"))
    assert len(scrape(manager)) == 2
    manager.leading.clear()  # leadership lost: the next scrape has nothing stale to show
    assert scrape(manager) == []
    text = generate_latest(manager.registry).decode()
    assert "# TYPE gpuoperator_claims gauge" in text
    assert "# TYPE gpuoperator_claim_oldest_pending_seconds gauge" in text
    manager.leading.set()
    assert len(scrape(manager)) == 2


def test_registering_reads_no_claim() -> None:
    manager = _FakeManager()
    read: list[int] = []

    def claims() -> list[Obj]:
        read.append(1)
        return []

    manager.registry.register(
        claim_metrics.ClaimMetrics(claims, manager.is_leader, clock=manager.clock)
    )
    assert read == []
    generate_latest(manager.registry)
    assert read == [1]
