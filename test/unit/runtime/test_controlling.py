"""The controller's contract: each reconcile outcome becomes the right queue step, one
log line per result, keys never reconciled twice at once."""

from __future__ import annotations

import threading
import time
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
        structlog.configure(**saved)
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


def test_only_the_first_fenced_reconcile_of_a_term_logs_at_info() -> None:
    """A lost leadership fences every key in flight: one info line per controller and term
    says so, the other keys' lines are at debug (and all are counted)."""
    clock = FakeClock()
    registry = CollectorRegistry()
    queue: WorkQueue[Key] = WorkQueue(
        "q", default_controller_rate_limiter(clock), clock=clock, registry=registry
    )
    fenced = errors.NotLeaderError("lost the lease")
    c: Controller[Key] = Controller(
        "test", Scripted(fenced, fenced, fenced, fenced), clock=clock, registry=registry
    )
    capture = structlog.testing.LogCapture()
    saved = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])

    def reconcile(name: str) -> None:
        queue.add(("ns", name))
        key = queue.get(timeout=1)
        assert key is not None
        c.process(queue, key)
        queue.done(key)

    try:
        for name in ("a", "b", "c"):
            reconcile(name)
        c.start()  # a new term (leadership regained)
        assert c.stop()
        reconcile("d")
    finally:
        structlog.configure(**saved)
    levels = [(e["key"], e["log_level"]) for e in capture.entries if e["event"] == "reconciled"]
    assert levels == [("ns/a", "info"), ("ns/b", "debug"), ("ns/c", "debug"), ("ns/d", "info")]
    assert (
        registry.get_sample_value(
            "gpuoperator_reconcile_total", {"controller": "test", "result": "fenced"}
        )
        == 4
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


WAIT = 10.0  # seconds a step may wait for another thread (a deadline, not a pause)


def test_started_controller_reconciles_seeded_and_enqueued_keys_once_each() -> None:
    seen: list[Key] = []
    done = threading.Event()
    lock = threading.Lock()

    class Counting:
        def reconcile(self, key: Key) -> None:
            with lock:
                seen.append(key)
                if len(seen) == 3:
                    done.set()

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
    assert done.wait(WAIT)
    assert c.stop(5)
    assert sorted(seen) == [("", "a"), ("", "b"), ("", "c")]
    assert not c.running


class Journal:
    """Reconciles that write ``("start", key)`` and ``("end", key)`` and keep the most
    reconciles of one key, and of all keys, that ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, Key]] = []
        self.active: dict[Key, int] = {}
        self.peak_per_key = 0
        self.peak = 0

    def start(self, key: Key) -> None:
        with self.lock:
            self.entries.append(("start", key))
            self.active[key] = self.active.get(key, 0) + 1
            self.peak_per_key = max(self.peak_per_key, self.active[key])
            self.peak = max(self.peak, sum(self.active.values()))

    def end(self, key: Key) -> None:
        with self.lock:
            self.entries.append(("end", key))
            self.active[key] -= 1

    def of(self, key: Key) -> list[str]:
        with self.lock:
            return [step for step, k in self.entries if k == key]


def test_a_key_added_again_while_it_is_reconciled_runs_again_only_after_the_first_returned() -> (
    None
):
    """The first reconcile of "a" blocks; "a" is added again, then "b". A free worker takes
    "b", never the second "a" (the queue hands out a key only once it is done), and the second
    "a" starts after the first returned."""
    a, b = ("", "a"), ("", "b")
    journal = Journal()
    first_started, release = threading.Event(), threading.Event()
    b_done, second_a_done = threading.Event(), threading.Event()

    class Blocking:
        def reconcile(self, key: Key) -> None:
            journal.start(key)
            try:
                if key == a and not first_started.is_set():
                    first_started.set()
                    assert release.wait(WAIT)
            finally:
                journal.end(key)
                if key == b:
                    b_done.set()
                elif journal.of(a).count("end") == 2:
                    second_a_done.set()

    c: Controller[Key] = Controller("stingy", Blocking(), workers=2, registry=CollectorRegistry())
    c.start()
    try:
        c.enqueue(a)
        assert first_started.wait(WAIT)
        c.enqueue(a)  # dirty while processing
        c.enqueue(b)
        assert b_done.wait(WAIT)
        assert journal.of(a) == ["start"], "the second reconcile of a started while the first ran"
        release.set()
        assert second_a_done.wait(WAIT)
    finally:
        release.set()
        assert c.stop(5)
    assert journal.of(a) == ["start", "end", "start", "end"]
    assert journal.peak_per_key == 1


def test_different_keys_are_reconciled_at_once_by_several_workers() -> None:
    """Each reconcile waits at a barrier for the other: both pass only if two workers run
    them at the same time."""
    journal = Journal()
    both = threading.Barrier(2, timeout=WAIT)
    passed: list[Key] = []
    finished = threading.Event()

    class Meeting:
        def reconcile(self, key: Key) -> None:
            journal.start(key)
            try:
                both.wait()
                with journal.lock:
                    passed.append(key)
            finally:
                journal.end(key)
                with journal.lock:
                    if len(journal.entries) == 4:
                        finished.set()

    c: Controller[Key] = Controller("parallel", Meeting(), workers=2, registry=CollectorRegistry())
    c.start()
    try:
        c.enqueue(("", "a"))
        c.enqueue(("", "b"))
        assert finished.wait(WAIT)
    finally:
        both.abort()
        assert c.stop(5)
    assert sorted(passed) == [("", "a"), ("", "b")]
    assert journal.peak == 2


def test_stop_waits_at_most_its_timeout_in_all_for_a_reconcile_that_does_not_end() -> None:
    """A reconcile stuck past the timeout: stop gives up once, at the timeout, instead of
    waiting for the drain and then again as long for the workers."""
    running, release = threading.Event(), threading.Event()

    class Stuck:
        def reconcile(self, key: Key) -> None:
            running.set()
            release.wait(WAIT)

    c: Controller[Key] = Controller("stuck", Stuck(), workers=1, registry=CollectorRegistry())
    c.start()
    try:
        c.enqueue(("", "a"))
        assert running.wait(WAIT)
        timeout = 1.0
        began = time.monotonic()
        assert not c.stop(timeout)
        took = time.monotonic() - began
    finally:
        release.set()
    assert timeout <= took < 1.9 * timeout  # waiting twice would take at least 2 * timeout
