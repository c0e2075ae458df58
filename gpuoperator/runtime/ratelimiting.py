"""Rate limiters for the work queue, with client-go's semantics (``default_rate_limiters.go``).

A limiter answers one question per failed item: how long to wait before it is added again.
The controllers combine a per-item exponential backoff (one object failing over and over
waits longer and longer, without slowing the others) with a token bucket shared by all
items (a storm of failures across many objects cannot exceed an overall retry rate).

Delays are seconds on the injected clock. Every limiter is thread-safe: one limiter serves
all the worker threads of a controller.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from gpuoperator.runtime import clock as clocks

T = TypeVar("T", bound=Hashable)
T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)


class RateLimiter(Protocol[T_contra]):
    """How long an item must wait before it is retried; the three methods of client-go's
    ``RateLimiter``."""

    def when(self, item: T_contra) -> float:
        """Record one more failure of ``item`` and return the seconds to wait before it may
        be added again. Calling it is itself the retry being counted."""

    def forget(self, item: T_contra) -> None:
        """Stop tracking ``item`` (it succeeded): its next failure starts the backoff over.
        Callers must call it when an item is handled successfully, or the backoff of the
        next failure, possibly hours later, starts where the last streak stopped."""

    def num_requeues(self, item: T_contra) -> int:
        """How many times ``item`` has been retried since it was last forgotten."""


class ItemExponentialFailureRateLimiter(Generic[T]):
    """Per-item exponential backoff: the n-th consecutive failure (counting from 0) waits
    ``base_delay * 2**n`` seconds, capped at ``max_delay``.

    Invariant: ``num_requeues(item)`` equals the number of ``when(item)`` calls since the
    last ``forget(item)``. The failure count keeps growing after the cap is reached (it is
    what ``num_requeues`` reports), so the delay is computed without ever overflowing.
    """

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        if base_delay < 0 or max_delay < 0:
            raise ValueError(f"delays must not be negative: base={base_delay} max={max_delay}")
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._failures: dict[T, int] = {}
        self._lock = threading.Lock()

    def when(self, item: T) -> float:
        with self._lock:
            exponent = self._failures.get(item, 0)
            self._failures[item] = exponent + 1
        if self._base_delay == 0:
            return 0.0
        try:
            backoff = self._base_delay * 2.0**exponent
        except OverflowError:  # 2.0**n is out of float range long after the cap is reached
            return self._max_delay
        return min(backoff, self._max_delay)

    def forget(self, item: T) -> None:
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        with self._lock:
            return self._failures.get(item, 0)


class BucketRateLimiter:
    """A token bucket shared by every item (``golang.org/x/time/rate``'s ``Reserve().Delay()``).

    The bucket holds at most ``burst`` tokens and refills at ``qps`` tokens per second; it
    starts full. Each ``when`` takes one token, even one that will only exist in the future:
    the returned delay is how long until that token is available. So after a burst the
    items are spaced ``1/qps`` apart, and the reservations pile up (the token count goes
    negative) rather than being refused.

    It knows nothing about items: ``num_requeues`` is always 0 and ``forget`` does nothing.
    """

    def __init__(
        self, qps: float = 10.0, burst: int = 100, *, clock: clocks.Clock = clocks.SYSTEM
    ) -> None:
        if not qps > 0:
            raise ValueError(f"qps must be positive, got {qps}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self._qps = qps
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.monotonic()
        self._lock = threading.Lock()

    def when(self, item: object) -> float:
        if math.isinf(self._qps):
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            last = min(self._last, now)  # as x/time/rate does if time appears to go back
            tokens = min(float(self._burst), self._tokens + (now - last) * self._qps)
            tokens -= 1.0
            self._tokens = tokens
            self._last = now
        return 0.0 if tokens >= 0 else -tokens / self._qps

    def forget(self, item: object) -> None:
        return

    def num_requeues(self, item: object) -> int:
        return 0


class MaxOfRateLimiter(Generic[T]):
    """The longest delay any of ``limiters`` asks for.

    Every limiter is asked on every ``when``, as client-go does, so each one records the
    failure (the per-item counter grows and the bucket spends a token) even when another
    limiter's delay wins.
    """

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        self._limiters = limiters

    def when(self, item: T) -> float:
        delays = [limiter.when(item) for limiter in self._limiters]
        return max(delays, default=0.0)

    def forget(self, item: T) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return max((limiter.num_requeues(item) for limiter in self._limiters), default=0)


def default_controller_rate_limiter(
    clock: clocks.Clock = clocks.SYSTEM,
) -> MaxOfRateLimiter[Hashable]:
    """client-go's ``DefaultControllerRateLimiter``: per-item backoff from 5 ms doubling up
    to 1000 s, and at most 10 retries per second overall after a burst of 100."""
    return MaxOfRateLimiter[Hashable](
        ItemExponentialFailureRateLimiter[Hashable](base_delay=0.005, max_delay=1000.0),
        BucketRateLimiter(qps=10.0, burst=100, clock=clock),
    )
