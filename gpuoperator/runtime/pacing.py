"""Pacing writes: at most one write per object per interval, each change written within one.

The status figures of a GPUNode or a GPUClass change with every claim bound there; written at
each change, a burst of bindings costs one status write per binding and node, and as many
per class. A :class:`Pacer` gathers an object's changes: the first change seen since the
object was last written waits ``interval`` seconds (the controller asks for another look
after that delay, ``Result(requeue_after=...)``), and whatever the figures are by then is
written once. So a burst of changes to one object costs one write, every change is written
at most ``interval`` after it was first seen, and one object is written at most once per
interval (its next change is seen after the write, and waits ``interval`` again).

Times are the injected clock's monotonic seconds. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

from gpuoperator.runtime.clock import SYSTEM, Clock

K = TypeVar("K", bound=Hashable)

#: Keys remembered before those whose interval has long passed are dropped.
_MAX_KEYS = 4096


class Pacer(Generic[K]):
    """Remembers, per key, since when a change waits to be written. Invariant: the first
    ``delay(k)`` after ``wrote(k)`` (or ever) at time s answers ``interval``, and later ones
    count down to 0 at ``s + interval``; ``wrote(k)`` starts the next wait afresh. An
    interval of 0 never delays."""

    def __init__(self, interval: float, *, clock: Clock = SYSTEM) -> None:
        if interval < 0:
            raise ValueError(f"interval must not be negative, got {interval}")
        self.interval = interval
        self._clock = clock
        #: key -> when its oldest unwritten change was first seen
        self._pending: dict[K, float] = {}
        self._lock = threading.Lock()

    def delay(self, key: K) -> float:
        """Seconds before ``key``'s changed figures may be written (0: now). The caller asks
        only when its figures differ from the object's; the first ask starts the wait."""
        if self.interval == 0:
            return 0.0
        now = self._clock.monotonic()
        with self._lock:
            since = self._pending.setdefault(key, now)
            if len(self._pending) > _MAX_KEYS:  # changes long due whose key went quiet
                horizon = now - self.interval
                self._pending = {k: t for k, t in self._pending.items() if t > horizon}
                self._pending[key] = since
        return max(0.0, since + self.interval - now)

    def waiting(self, key: K) -> float:
        """Seconds before a change of ``key`` already waiting may be written; 0 when none
        waits (this starts no wait). While it is positive, any newer change joins the one
        waiting: a caller may skip working its figures out until then."""
        with self._lock:
            since = self._pending.get(key)
        if since is None:
            return 0.0
        return max(0.0, since + self.interval - self._clock.monotonic())

    def wrote(self, key: K) -> None:
        """Record a write of ``key`` now: its next change waits a whole interval. Callers
        must call it after each write they make."""
        with self._lock:
            self._pending.pop(key, None)

    def forget(self, key: K) -> None:
        """The object is gone: nothing of it waits any more."""
        with self._lock:
            self._pending.pop(key, None)
