"""Prometheus collectors are registered once per registry; a component's collectors are
made by a factory memoised per registry (the global one by default, a fresh one in tests)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

T = TypeVar("T")


def per_registry(
    factory: Callable[[CollectorRegistry], T],
) -> Callable[[CollectorRegistry | None], T]:
    """``factory(registry)`` called once per registry; ``None`` means the global registry."""
    made: dict[int, tuple[CollectorRegistry, T]] = {}
    lock = threading.Lock()

    @functools.wraps(factory)
    def get(registry: CollectorRegistry | None = None) -> T:
        registry = REGISTRY if registry is None else registry
        with lock:
            hit = made.get(id(registry))
            if hit is None or hit[0] is not registry:
                hit = (registry, factory(registry))
                made[id(registry)] = hit
            return hit[1]

    return get
