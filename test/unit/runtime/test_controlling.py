"""The controller's contract: each reconcile outcome becomes the right queue step, one
log line per result, keys never reconciled twice at once."""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Controller, Result, TerminalError
from gpuoperator.runtime.queueing import WorkQueue
from gpuoperator.runtime.ratelimiting import default_controller_rate_limiter

Key = tuple[str, str]


class Scripted:
    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[Key] = []

    def reconcile(self, key: Key) -> Result | None:
        self.calls.append(key)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is None or isinstance(outcome, Result)
        return outcome


def run_once(outcome: object) -> tuple[WorkQueue[Key], FakeClock, list[MutableMapping[str, Any]]]:
    clock = FakeClock()
    registry = CollectorRegistry()
    queue: WorkQueue[Key] = WorkQueue(
        "q", default_controller_rate_limiter(clock), clock=clock, registry=registry
    )
    c: Controller[Key] = Controller("test", Scripted(outcome), clock=clock, registry=registry)
    key = ("ns", "a")
    queue.add(key)
    got = queue.get(timeout=1)
    assert got == key
    capture = structlog.testing.LogCapture()
    saved = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    try:
        c.process(queue, key)
    finally:
        structlog.configure(**saved)  # the suite's own routing, not structlog's stdout default
    queue.done(key)
    return queue, clock, capture.entries


def result_line(logs: list[MutableMapping[str, Any]]) -> MutableMapping[str, Any]:
    (line,) = [entry for entry in logs if entry["event"] == "reconciled"]
    return line


def test_success_forgets_the_key_and_logs_one_line_with_controller_key_and_id() -> None:
    queue, _, logs = run_once(None)
    assert queue.num_requeues(("ns", "a")) == 0 and len(queue) == 0
    line = result_line(logs)
    assert line["result"] == "success"
    assert line["controller"] == "test" and line["key"] == "ns/a"
    assert isinstance(line["reconcile_id"], str) and line["reconcile_id"]


def test_an_error_requeues_with_backoff_and_logs_the_reason() -> None:
    queue, clock, logs = run_once(errors.ApiError(500, "InternalError", "etcd timeout"))
    assert queue.num_requeues(("ns", "a")) == 1
    assert len(queue) == 0, "not before its backoff"
    clock.advance(0.006)
    queue.promote_ready()
    assert len(queue) == 1
    line = result_line(logs)
    assert (line["result"], line["reason"]) == ("error", "InternalError")
    assert "etcd timeout" in str(line["error"])


def test_a_conflict_is_retried_quietly() -> None:
    queue, _, logs = run_once(errors.ConflictError(409, "Conflict", "object was modified"))
    assert queue.num_requeues(("ns", "a")) == 1
    assert result_line(logs)["log_level"] == "debug"


@pytest.mark.parametrize(
    ("outcome", "level"),
    [
        (None, "debug"),
        (Result(requeue_after=30), "debug"),
        (errors.NotLeaderError("lost the lease"), "info"),
        (errors.ApiError(500, "InternalError", "etcd timeout"), "error"),
    ],
    ids=["success", "requeue", "fenced", "error"],
)
def test_routine_reconciles_log_at_debug_and_only_fencing_and_errors_above(
    outcome: object, level: str
) -> None:
    _, _, logs = run_once(outcome)
    assert result_line(logs)["log_level"] == level
    assert [e for e in logs if e["log_level"] == "info" and e["event"] == "reconciled"] == (
        [result_line(logs)] if level == "info" else []
    )


def test_requeue_after_forgets_the_backoff_and_looks_again_later() -> None:
    queue, clock, logs = run_once(Result(requeue_after=30))
    assert queue.num_requeues(("ns", "a")) == 0
    clock.advance(29)
    queue.promote_ready()
    assert len(queue) == 0
    clock.advance(1)
    queue.promote_ready()
    assert len(queue) == 1
    assert result_line(logs)["requeue_after"] == 30


@pytest.mark.parametrize(
    ("outcome", "result"),
    [
        (TerminalError("spec.count above maxCount"), "terminal"),
        (errors.NotLeaderError("lost the lease"), "fenced"),
    ],
)
def test_terminal_and_fenced_outcomes_are_not_retried(outcome: Exception, result: str) -> None:
    queue, clock, logs = run_once(outcome)
    clock.advance(3600)
    queue.promote_ready()
    assert len(queue) == 0 and queue.num_requeues(("ns", "a")) == 0
    assert result_line(logs)["result"] == result


def test_started_controller_reconciles_seeded_and_enqueued_keys_once_each() -> None:
    seen: list[Key] = []
    done = threading.Event()
    lock = threading.Lock()
    concurrent = 0
    peak = 0

    class Counting:
        def reconcile(self, key: Key) -> None:
            nonlocal concurrent, peak
            with lock:
                concurrent += 1
                peak = max(peak, concurrent)
                seen.append(key)
                if len(seen) == 3:
                    done.set()
            with lock:
                concurrent -= 1

    c: Controller[Key] = Controller(
        "seeded",
        Counting(),
        workers=3,
        seed=lambda: [("", "a"), ("", "b")],
        registry=CollectorRegistry(),
    )
    c.enqueue(("", "dropped-while-stopped"))
    c.start()
    c.enqueue(("", "c"))
    assert done.wait(10)
    assert c.stop(5)
    assert sorted(seen) == [("", "a"), ("", "b"), ("", "c")]
    assert not c.running
