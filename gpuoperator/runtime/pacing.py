"""Pacing writes: at most one write per object per interval.

The status figures of a GPUNode or a GPUClass change with every claim bound there; written at
each change, a burst of bindings costs one status write per binding and node, and as many
per class. A :class:`Pacer` lets a controller write an object's figures at once when it has
not written them for ``interval`` seconds, and otherwise tells it how long to wait: the
controller then asks for another look after that delay (``Result(requeue_after=...)``) and
writes whatever the figures are by then, so every change is written, the last one at most
``interval`` late, and one object is written at most once per interval.

Times are the injected clock's monotonic seconds. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

from gpuoperator.runtime.clock import SYSTEM, Clock

K = TypeVar("K", bound=Hashable)


class Pacer(Generic[K]):
    """Remembers when each key was last written. Invariant: after ``wrote(k)`` at time t,
    ``delay(k)`` is positive until ``t + interval``. An interval of 0 never delays."""

    def __init__(self, interval: float, *, clock: Clock = SYSTEM) -> None:
        if interval < 0:
            raise ValueError(f"interval must not be negative, got {interval}")
        self.interval = interval
        self._clock = clock
        self._last: dict[K, float] = {}
        self._lock = threading.Lock()

    def delay(self, key: K) -> float:
        """Seconds before ``key`` may be written again (0: now)."""
        with self._lock:
            last = self._last.get(key)
        if last is None:
            return 0.0
        return max(0.0, last + self.interval - self._clock.monotonic())

    def wrote(self, key: K) -> None:
        """Record a write of ``key`` now. Callers must call it after each write they make."""
        now = self._clock.monotonic()
        with self._lock:
            self._last[key] = now
            if len(self._last) > 4096:  # drop keys whose interval has long passed
                horizon = now - self.interval
                self._last = {k: t for k, t in self._last.items() if t > horizon}

    def forget(self, key: K) -> None:
        """The object is gone: its next write, if any, is not delayed."""
        with self._lock:
            self._last.pop(key, None)
