"""Clocks, injected everywhere time matters so tests can run on fake time.

Two readings, never mixed: ``monotonic()`` for durations and deadlines (immune to wall-clock
steps) and ``now()`` for timestamps written into objects (UTC wall time).
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""

    def now(self) -> datetime.datetime:
        """The current UTC wall time (timezone-aware)."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of this clock's time."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly.

    Thread-safe; ``advance`` wakes callers of ``wait_until``.
    """

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self._mono = 1000.0
        self._wall = start or datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        self._cond = threading.Condition()

    def monotonic(self) -> float:
        with self._cond:
            return self._mono

    def now(self) -> datetime.datetime:
        with self._cond:
            return self._wall

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._mono += seconds
            self._wall += datetime.timedelta(seconds=seconds)
            self._cond.notify_all()

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def step_wall(self, seconds: float) -> None:
        """Move only the wall clock (as an NTP step would); monotonic time is unaffected."""
        with self._cond:
            self._wall += datetime.timedelta(seconds=seconds)


SYSTEM = SystemClock()
