"""Every collection of the cyclic garbage collector is timed under its generation, until
the timing is uninstalled."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from gpuoperator.runtime import gcpauses


def _count(registry: CollectorRegistry, generation: int) -> float:
    value = registry.get_sample_value(
        "gpuoperator_gc_pause_seconds_count", {"generation": str(generation)}
    )
    return value or 0.0


def test_each_collection_is_one_pause_of_its_generation() -> None:
    registry = CollectorRegistry()
    uninstall = gcpauses.install(registry)
    try:
        before = _count(registry, 2)
        gc.collect(2)
        gc.collect(2)
        assert _count(registry, 2) >= before + 2
        total = registry.get_sample_value("gpuoperator_gc_pause_seconds_sum", {"generation": "2"})
        assert total is not None and total > 0
    finally:
        uninstall()
    after = _count(registry, 2)
    gc.collect(2)
    assert _count(registry, 2) == after
