"""Exponential backoff with jitter, for one retried operation (an informer's lists and
watches): unlike the work queue's rate limiters (``ratelimiting``), it tracks no items, only
the next delay of one loop."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter: ``initial`` doubling up to ``cap``; ``reset`` after
    a success."""

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        jitter: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.initial, self.cap, self.jitter = initial, cap, jitter
        self._next = initial
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return min(self.cap, delay * (1 + self._rng.random() * self.jitter))

    def reset(self) -> None:
        self._next = self.initial
