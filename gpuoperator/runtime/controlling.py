"""Controllers: a work queue of keys, N workers, and a level-triggered ``reconcile``.

The contract, as controller-runtime states it:

* A request carries a key only, never the event: ``reconcile(key)`` reads the caches and
  makes the world match, whatever happened in between. It must be idempotent.
* Its result decides what happens next: an exception means "retry with backoff"
  (per-key exponential, 5 ms → 1000 s, combined with a 10 qps / 100 burst bucket);
  ``Result(requeue_after=s)`` means "look again in s seconds" (backoff forgotten);
  ``None`` or ``Result()`` means done (backoff forgotten). ``TerminalError`` is logged and
  not retried. ``NotLeaderError`` means this replica stopped leading: the key is dropped,
  the new leader will see it.
* A key is never reconciled by two workers at once (the queue guarantees it).

Each reconcile gets its own ``reconcile_id``; every log line it writes carries
``controller``, ``key`` and ``reconcile_id``. The line per result ("reconciled") is at
debug for the routine outcomes (success, requeue, a conflict retried), at info the first
time a term's reconcile finds this replica fenced (the rest of that term's fenced keys at
debug: a lost leadership fences every key in flight, thousands at scale), at error for
errors: on-call reads one info line per decision or change
of state, written by the reconciler itself. Durations and results are metrics
(``gpuoperator_reconcile_duration_seconds``, ``gpuoperator_reconcile_total``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.runtime.queueing import WorkQueue
from gpuoperator.runtime.ratelimiting import default_controller_rate_limiter

log = structlog.get_logger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next: nothing, or another look after ``requeue_after`` s."""

    requeue_after: float | None = None


class TerminalError(Exception):
    """A failure retrying cannot fix (bad input the user must change); not requeued."""


class Reconciler(Protocol[K_contra]):
    def reconcile(self, key: K_contra) -> Result | None: ...


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.total = Counter(
            "gpuoperator_reconcile_total", "Reconciles by result", ["controller", "result"], **kw
        )
        self.duration = Histogram(
            "gpuoperator_reconcile_duration_seconds",
            "Time spent in reconcile",
            ["controller"],
            **kw,
        )


_metrics = per_registry(_Metrics)


class Controller(Generic[K]):
    """Runs ``reconciler`` over keys with ``workers`` threads, while started.

    ``enqueue`` may be called at any time (from informer handlers); keys arriving while the
    controller is stopped are dropped: ``start`` asks ``seed()`` for every key that may need
    work, so a replica that becomes leader catches up from the caches.
    """

    def __init__(
        self,
        name: str,
        reconciler: Reconciler[K],
        *,
        workers: int = 2,
        seed: Callable[[], Iterable[K]] = tuple,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.seed = seed
        self._clock = clock
        self._registry = registry
        self._metrics = _metrics(registry)
        self._lock = threading.Lock()
        self._queue: WorkQueue[K] | None = None
        self._threads: list[threading.Thread] = []
        self._log = log.bind(controller=name)
        #: this controller's metric children, looked up once, not on every reconcile
        self._duration = self._metrics.duration.labels(name)
        self._totals: dict[str, Any] = {}
        #: whether this term (since the last ``start``) has logged a fenced reconcile at info
        self._fenced_told = False

    @property
    def running(self) -> bool:
        return self._queue is not None

    def enqueue(self, key: K) -> None:
        queue = self._queue
        if queue is not None:
            queue.add(key)

    def enqueue_many(self, keys: Iterable[K]) -> None:
        queue = self._queue
        if queue is not None:
            for key in keys:
                queue.add(key)

    def start(self) -> None:
        with self._lock:
            if self._queue is not None:
                return
            queue: WorkQueue[K] = WorkQueue(
                self.name,
                default_controller_rate_limiter(self._clock),
                clock=self._clock,
                registry=self._registry,
            )
            for key in self.seed():
                queue.add(key)
            self._queue = queue
            self._fenced_told = False
            self._threads = [
                threading.Thread(
                    target=self._work, args=(queue,), name=f"{self.name}-{i}", daemon=True
                )
                for i in range(self.workers)
            ]
            for t in self._threads:
                t.start()
        self._log.info("controller started", workers=self.workers, queued=len(queue))

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop taking keys and let in-flight reconciles finish: waits at most ``timeout``
        real seconds in all, for the reconciles and then for the workers to end. Returns
        whether every reconcile handed out finished in time (a worker still running one is
        a daemon thread: it never holds up process exit)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            queue, threads = self._queue, self._threads
            self._queue, self._threads = None, []
        if queue is None:
            return True
        drained = queue.shutdown_with_drain(timeout)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._log.info("controller stopped", drained=drained)
        return drained

    def _work(self, queue: WorkQueue[K]) -> None:
        while True:
            key = queue.get()
            if key is None:
                return
            try:
                self.process(queue, key)
            finally:
                queue.done(key)

    def process(self, queue: WorkQueue[K], key: K) -> None:
        """Reconcile one key and turn its outcome into the queue's next step."""
        rid = os.urandom(6).hex()  # 12 hex digits, as uuid4().hex[:12] gave, at a tenth of its cost
        shown = "/".join(p for p in key if p) if isinstance(key, tuple) else str(key)
        tokens = structlog.contextvars.bind_contextvars(
            controller=self.name, key=shown, reconcile_id=rid
        )
        try:
            self._process(queue, key)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)

    def _process(self, queue: WorkQueue[K], key: K) -> None:
        """The reconcile itself, inside the log context :meth:`process` binds."""
        start = time.monotonic()
        try:
            result = self.reconciler.reconcile(key)
        except errors.NotLeaderError as exc:
            queue.forget(key)
            level = "debug" if self._fenced_told else "info"
            self._fenced_told = True
            self._outcome("fenced", start, level=level, reason="NotLeader", error=str(exc))
        except TerminalError as exc:
            queue.forget(key)
            self._outcome(
                "terminal", start, level="error", reason=type(exc).__name__, error=str(exc)
            )
        except errors.ConflictError as exc:
            queue.add_rate_limited(key)
            self._outcome(
                "conflict",
                start,
                reason="Conflict",
                error=exc.message,
                retries=queue.num_requeues(key),
            )
        except Exception as exc:
            queue.add_rate_limited(key)
            reason = exc.reason if isinstance(exc, errors.ApiError) else type(exc).__name__
            self._outcome(
                "error",
                start,
                level="error",
                reason=reason,
                error=str(exc),
                retries=queue.num_requeues(key),
                exc_info=True,
            )
        else:
            queue.forget(key)
            if result is not None and result.requeue_after:
                queue.add_after(key, result.requeue_after)
                self._outcome("requeue", start, requeue_after=result.requeue_after)
            else:
                self._outcome("success", start)

    def _outcome(self, result: str, start: float, level: str = "debug", **fields: Any) -> None:
        took = time.monotonic() - start
        total = self._totals.get(result)
        if total is None:
            total = self._totals[result] = self._metrics.total.labels(self.name, result)
        total.inc()
        self._duration.observe(took)
        getattr(log, level)(
            "reconciled", result=result, duration_ms=round(took * 1000, 2), **fields
        )
