"""The cyclic garbage collector's pauses, timed per generation.

A collection runs in whichever thread allocated past a threshold, holding the GIL: every
other thread of the process, the webhook server's event loop included, waits for it. Its
pauses are therefore part of any request's tail latency, and this histogram shows how much
(``gpuoperator_gc_pause_seconds{generation}``). The caches are moved to the permanent
generation once synced (``Manager._start_caches``), so a pause walks only what is young.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from gpuoperator.runtime.metrics import per_registry

BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


@per_registry
def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "gpuoperator_gc_pause_seconds",
        "Pauses of the cyclic garbage collector (every thread waits), by generation",
        ["generation"],
        buckets=BUCKETS,
        registry=registry,
    )


def install(registry: CollectorRegistry | None = None) -> Callable[[], None]:
    """Time every collection from now on; returns the function that stops it."""
    histogram = _histogram(registry)
    children = {g: histogram.labels(str(g)) for g in range(3)}
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            children[int(info["generation"])].observe(time.perf_counter() - started[0])

    gc.callbacks.append(callback)

    def uninstall() -> None:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)

    return uninstall
