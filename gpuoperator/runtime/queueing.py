"""The controllers' work queue: client-go's ``workqueue`` with its delaying and rate-limiting
layers, in one class.

Event handlers put object keys in (never events: reconcile is level-triggered, so all a
handler says is "look at this object again"); N worker threads take them out, reconcile,
and call ``done``. The queue is what makes that safe and cheap: the same key queued many
times is handled once, and one key is never reconciled by two workers at the same time.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import prometheus_client

from gpuoperator.runtime import clock as clocks
from gpuoperator.runtime import ratelimiting

T = TypeVar("T", bound=Hashable)

# client-go's buckets: 10 ns to 10 s, a decade apart.
_DURATION_BUCKETS = tuple(10.0**exponent for exponent in range(-8, 2))


@dataclass(frozen=True)
class _Metrics:
    depth: prometheus_client.Gauge
    adds: prometheus_client.Counter
    queue_duration: prometheus_client.Histogram
    work_duration: prometheus_client.Histogram
    retries: prometheus_client.Counter
    longest_running: prometheus_client.Gauge
    unfinished_work: prometheus_client.Gauge


_metrics_by_registry: weakref.WeakKeyDictionary[prometheus_client.CollectorRegistry, _Metrics] = (
    weakref.WeakKeyDictionary()
)
_metrics_lock = threading.Lock()


def _metrics_for(registry: prometheus_client.CollectorRegistry) -> _Metrics:
    """The work-queue metrics of ``registry``, created on first use: a registry refuses a
    second metric of the same name, so all queues share these and differ by ``name``."""
    with _metrics_lock:
        metrics = _metrics_by_registry.get(registry)
        if metrics is None:
            labels = ("name",)
            metrics = _Metrics(
                depth=prometheus_client.Gauge(
                    "gpuoperator_workqueue_depth",
                    "Keys waiting to be handed to a worker (including keys re-added while "
                    "being processed).",
                    labels,
                    registry=registry,
                ),
                adds=prometheus_client.Counter(
                    "gpuoperator_workqueue_adds_total",
                    "Keys added to the queue (adds of a key already waiting are not counted).",
                    labels,
                    registry=registry,
                ),
                queue_duration=prometheus_client.Histogram(
                    "gpuoperator_workqueue_queue_duration_seconds",
                    "Seconds a key waits in the queue between being added and handed out.",
                    labels,
                    buckets=_DURATION_BUCKETS,
                    registry=registry,
                ),
                work_duration=prometheus_client.Histogram(
                    "gpuoperator_workqueue_work_duration_seconds",
                    "Seconds a worker holds a key, from get to done.",
                    labels,
                    buckets=_DURATION_BUCKETS,
                    registry=registry,
                ),
                retries=prometheus_client.Counter(
                    "gpuoperator_workqueue_retries_total",
                    "Rate-limited adds (retries after a failure).",
                    labels,
                    registry=registry,
                ),
                longest_running=prometheus_client.Gauge(
                    "gpuoperator_workqueue_longest_running_processor_seconds",
                    "Seconds the longest-held key currently in processing has been held.",
                    labels,
                    registry=registry,
                ),
                unfinished_work=prometheus_client.Gauge(
                    "gpuoperator_workqueue_unfinished_work_seconds",
                    "Sum of the seconds every key currently in processing has been held; "
                    "a value that keeps growing means stuck workers.",
                    labels,
                    registry=registry,
                ),
            )
            _metrics_by_registry[registry] = metrics
        return metrics


class WorkQueue(Generic[T]):
    """A deduplicating FIFO of keys with delayed and rate-limited adds.

    Invariants (client-go's ``queue.go``), kept under one lock:

    - A key is in the queue at most once: every queued key is in the *dirty* set, and an add
      of a dirty key does nothing.
    - A key handed to a worker is in the *processing* set until ``done``; it is never handed
      to a second worker meanwhile. Every queued key is dirty and not processing.
    - A key added while it is processing is marked dirty but not queued; ``done`` queues it
      then, so the change that prompted the add is seen by a reconcile that starts after it.
    - Otherwise keys come out in the order they went in.
    - A delayed key waits outside the queue, at most once per key (the earliest ready time
      wins), and enters through a plain add when its time comes.

    Time: delays and the metrics follow the injected ``clock``. The ``timeout`` arguments of
    ``get`` and ``shutdown_with_drain`` are real seconds, because they bound how long the
    calling thread blocks. There is no background thread: a delayed key is moved in
    whenever the queue is called, and a blocked ``get`` sleeps no longer than until the
    earliest ready time, which is exact with the system clock. A ``FakeClock`` cannot wake
    a sleeping thread, so after ``advance`` call ``promote_ready()`` to wake getters that
    are already blocked; calls made after ``advance`` see the new time without it.

    Keys must be hashable and not ``None`` (``get`` uses ``None`` for "nothing").
    """

    def __init__(
        self,
        name: str,
        rate_limiter: ratelimiting.RateLimiter[T] | None = None,
        *,
        clock: clocks.Clock = clocks.SYSTEM,
        registry: prometheus_client.CollectorRegistry | None = None,
    ) -> None:
        """``name`` labels the metrics and should be unique per registry (two queues of one
        name share their counters, and the scrape-time gauges report the later one).
        ``rate_limiter`` defaults to ``default_controller_rate_limiter(clock)``; give each
        queue its own, since the limiter's bucket and counters are per queue in client-go.
        ``registry`` defaults to prometheus-client's global one."""
        self.name = name
        self._clock = clock
        self._rate_limiter: ratelimiting.RateLimiter[T] = (
            rate_limiter
            if rate_limiter is not None
            else ratelimiting.default_controller_rate_limiter(clock)
        )

        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # a key was queued, or shutdown
        self._idle = threading.Condition(self._lock)  # processing emptied, or drain aborted

        self._queue: collections.deque[T] = collections.deque()
        self._dirty: set[T] = set()
        self._processing: dict[T, float] = {}  # key -> when it was handed out
        self._added_at: dict[T, float] = {}  # dirty key -> when it was added

        # Delayed keys: a heap of (ready time, sequence, key) with lazy deletion; an entry is
        # live only while _waiting[key] holds its (ready time, sequence).
        self._heap: list[tuple[float, int, T]] = []
        self._waiting: dict[T, tuple[float, int]] = {}
        self._sequence = itertools.count()

        self._shutting_down = False
        self._draining = False

        metrics = _metrics_for(registry if registry is not None else prometheus_client.REGISTRY)
        self._depth = metrics.depth.labels(name)
        self._adds = metrics.adds.labels(name)
        self._queue_duration = metrics.queue_duration.labels(name)
        self._work_duration = metrics.work_duration.labels(name)
        self._retries = metrics.retries.labels(name)
        # Computed at scrape time through a weak reference, so the registry does not keep
        # a dropped queue alive.
        self_ref = weakref.ref(self)
        metrics.longest_running.labels(name).set_function(
            _scrape(self_ref, lambda queue: queue._longest_running_seconds())
        )
        metrics.unfinished_work.labels(name).set_function(
            _scrape(self_ref, lambda queue: queue._unfinished_work_seconds())
        )

    # -- adding -------------------------------------------------------------------------

    def add(self, item: T) -> None:
        """Queue ``item`` unless it is already waiting; ignored after shutdown."""
        with self._lock:
            self._promote_locked()
            if not self._shutting_down:
                self._add_locked(item)

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds of the clock have passed.

        If ``item`` is already waiting with an earlier ready time, this does nothing; with a
        later one, the ready time moves earlier (client-go's rule: a delayed add never
        postpones a key). A pending delayed add is independent of the queue: a plain
        ``add`` in the meantime does not cancel it. ``delay <= 0`` is a plain ``add``.
        Ignored after shutdown.
        """
        with self._lock:
            self._promote_locked()
            if self._shutting_down:
                return
            if delay <= 0:
                self._add_locked(item)
                return
            ready_at = self._clock.monotonic() + delay
            current = self._waiting.get(item)
            if current is not None and current[0] <= ready_at:
                return
            entry = (ready_at, next(self._sequence))
            self._waiting[item] = entry
            heapq.heappush(self._heap, (*entry, item))
            if self._heap[0][1] == entry[1]:
                # A new earliest ready time: blocked getters recompute how long to wait.
                self._ready.notify_all()

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the rate limiter's delay; this counts as one retry of it.

        Remember to ``forget(item)`` once it is handled successfully, or its next failure
        backs off from where this streak stopped. Ignored after shutdown (the limiter is not
        consulted then, so no retry is counted).
        """
        if self.shutting_down:
            return
        delay = self._rate_limiter.when(item)
        self._retries.inc()
        self.add_after(item, delay)

    def forget(self, item: T) -> None:
        """Reset ``item``'s backoff: call it when ``item`` is handled successfully (or given
        up on). It does not remove a pending delayed add."""
        self._rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many rate-limited adds ``item`` has had since it was last forgotten."""
        return self._rate_limiter.num_requeues(item)

    def promote_ready(self) -> None:
        """Move delayed keys whose time has come into the queue, waking getters for them.

        The queue does this on every call and when a blocked ``get`` reaches the earliest
        ready time, so with the system clock nobody needs to call it; with a fake clock,
        call it after ``advance`` to wake getters that are already blocked.
        """
        with self._lock:
            self._promote_locked()

    # -- taking -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T | None:
        """Hand out the next key, blocking until there is one.

        Returns ``None`` after ``timeout`` real seconds (``None``: wait as long as needed),
        or once the queue is shut down and empty: keys already queued are still handed out
        after ``shutdown``, as in client-go, so a worker that must stop at once checks
        ``shutting_down`` itself.

        The caller must call ``done(key)`` for every key it gets, whatever the outcome
        (use ``try``/``finally``): until then the key is in processing, never handed out
        again, and a drain waits for it.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                self._promote_locked()
                if self._queue:
                    break
                if self._shutting_down:
                    return None
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return None
                if self._heap:
                    until_ready = self._heap[0][0] - self._clock.monotonic()
                    wait = until_ready if wait is None else min(wait, until_ready)
                self._ready.wait(wait)
            item = self._queue.popleft()
            now = self._clock.monotonic()
            self._dirty.discard(item)
            self._processing[item] = now
            added_at = self._added_at.pop(item, now)
            self._depth.set(len(self._dirty))
        self._queue_duration.observe(max(0.0, now - added_at))
        return item

    def done(self, item: T) -> None:
        """Finish processing ``item``: if it was added meanwhile it is queued again now.

        A ``done`` for a key that is not being processed (a second ``done``, or a key never
        got) does nothing, so it cannot queue a key twice.
        """
        with self._lock:
            self._promote_locked()
            started = self._processing.pop(item, None)
            if started is None:
                return
            now = self._clock.monotonic()
            if item in self._dirty:
                self._queue.append(item)
                self._ready.notify()
            elif not self._processing:
                self._idle.notify_all()
        self._work_duration.observe(max(0.0, now - started))

    def len(self) -> int:
        """Keys ready to be handed out now (not counting keys waiting for their delay or for
        their current processing to finish)."""
        with self._lock:
            self._promote_locked()
            return len(self._queue)

    def __len__(self) -> int:
        return self.len()

    # -- stopping -----------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def shutdown(self) -> None:
        """Stop accepting keys and wake every blocked ``get``.

        Delayed keys not yet due are dropped; keys already queued are still handed out.
        A ``shutdown_with_drain`` in progress returns ``False`` at once.
        """
        with self._lock:
            self._stop_locked()
            self._draining = False
            self._idle.notify_all()

    def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down as ``shutdown`` does, then wait up to ``timeout`` real seconds until
        every key handed out has been ``done``.

        Returns whether it drained: ``False`` on timeout or if a plain ``shutdown`` came
        meanwhile. Keys still queued (not yet handed out) are not waited for; workers that
        keep calling ``get`` take them.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._stop_locked()
            self._draining = True
            while self._processing and self._draining:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    break
                self._idle.wait(wait)
            drained = not self._processing
            self._draining = False
            return drained

    # -- internals (call with the lock held) --------------------------------------------

    def _add_locked(self, item: T) -> None:
        if item in self._dirty:
            return
        self._dirty.add(item)
        self._added_at[item] = self._clock.monotonic()
        self._adds.inc()
        self._depth.set(len(self._dirty))
        if item in self._processing:
            return  # done() queues it
        self._queue.append(item)
        self._ready.notify()

    def _promote_locked(self) -> None:
        if not self._heap:
            return
        now = self._clock.monotonic()
        while self._heap:
            ready_at, sequence, item = self._heap[0]
            if self._waiting.get(item) != (ready_at, sequence):
                heapq.heappop(self._heap)  # superseded by an earlier ready time
                continue
            if ready_at > now:
                return
            heapq.heappop(self._heap)
            del self._waiting[item]
            self._add_locked(item)

    def _stop_locked(self) -> None:
        self._shutting_down = True
        self._heap.clear()
        self._waiting.clear()
        self._ready.notify_all()

    def _longest_running_seconds(self) -> float:
        with self._lock:
            now = self._clock.monotonic()
            return max((now - started for started in self._processing.values()), default=0.0)

    def _unfinished_work_seconds(self) -> float:
        with self._lock:
            now = self._clock.monotonic()
            return sum(now - started for started in self._processing.values())


def _scrape(
    queue_ref: weakref.ReferenceType[WorkQueue[T]], read: Callable[[WorkQueue[T]], float]
) -> Callable[[], float]:
    def value() -> float:
        queue = queue_ref()
        return 0.0 if queue is None else read(queue)

    return value
