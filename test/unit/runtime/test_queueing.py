"""The work queue keeps client-go's guarantees: a key queued at most once, never processed by
two workers at a time, re-queued on done if added meanwhile, FIFO, delayed adds on the
injected clock, and a shutdown that wakes getters and can drain."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import prometheus_client
import pytest

from gpuoperator.runtime import clock as clocks
from gpuoperator.runtime import queueing, ratelimiting

Key = tuple[str, str]
A: Key = ("ns", "a")
B: Key = ("ns", "b")
C: Key = ("ns", "c")


def make_queue(
    clock: clocks.Clock | None = None,
    rate_limiter: ratelimiting.RateLimiter[Key] | None = None,
    registry: prometheus_client.CollectorRegistry | None = None,
    name: str = "test",
) -> queueing.WorkQueue[Key]:
    return queueing.WorkQueue[Key](
        name,
        clock=clock or clocks.FakeClock(),
        rate_limiter=rate_limiter,
        registry=registry or prometheus_client.CollectorRegistry(),
    )


def run_in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# -- the queue ---------------------------------------------------------------------------


def test_key_added_twice_while_queued_is_handed_out_once() -> None:
    queue = make_queue()
    queue.add(A)
    queue.add(A)

    assert len(queue) == 1
    assert queue.get(timeout=0) == A
    assert queue.get(timeout=0) is None


def test_keys_come_out_in_the_order_they_went_in() -> None:
    queue = make_queue()
    for key in (B, A, C, A):
        queue.add(key)

    assert [queue.get(timeout=0) for _ in range(3)] == [B, A, C]


def test_add_while_processing_requeues_after_done() -> None:
    queue = make_queue()
    queue.add(A)
    assert queue.get(timeout=0) == A

    queue.add(A)
    queue.add(A)

    assert queue.len() == 0  # held back: A is being processed
    assert queue.get(timeout=0) is None
    queue.done(A)
    assert queue.len() == 1
    assert queue.get(timeout=0) == A
    queue.done(A)
    assert queue.get(timeout=0) is None  # the two adds during processing made one


def test_done_without_an_add_during_processing_does_not_requeue() -> None:
    queue = make_queue()
    queue.add(A)
    assert queue.get(timeout=0) == A

    queue.done(A)

    assert queue.get(timeout=0) is None


def test_done_for_a_key_not_being_processed_changes_nothing() -> None:
    queue = make_queue()
    queue.add(A)

    queue.done(A)  # a caller bug: A was never handed out

    assert queue.len() == 1
    assert queue.get(timeout=0) == A
    assert queue.get(timeout=0) is None


def test_key_being_processed_is_not_handed_to_a_second_worker() -> None:
    queue = make_queue()
    queue.add(A)
    first_has_it = threading.Event()
    release_first = threading.Event()
    got: dict[str, Key | None] = {}

    def first_worker() -> None:
        got["first"] = queue.get(timeout=5)
        first_has_it.set()
        release_first.wait(timeout=5)
        queue.done(A)

    first = run_in_thread(first_worker)
    assert first_has_it.wait(timeout=5)
    queue.add(A)  # dirty while processing

    got["second"] = queue.get(timeout=0.05)  # must not receive A while the first holds it
    release_first.set()
    first.join(timeout=5)
    got["third"] = queue.get(timeout=5)

    assert got == {"first": A, "second": None, "third": A}


def test_many_workers_never_process_one_key_concurrently() -> None:
    queue = make_queue()
    keys = [("ns", f"k{i}") for i in range(4)]
    readds = 25  # each processing re-adds its key until it has been processed readds+1 times
    workers = 8
    lock = threading.Lock()
    in_flight: set[Key] = set()
    processed = dict.fromkeys(keys, 0)
    overlaps: list[Key] = []
    all_done = threading.Event()
    start = threading.Barrier(workers + 1)

    def worker() -> None:
        start.wait(timeout=5)
        while (key := queue.get()) is not None:
            with lock:
                if key in in_flight:
                    overlaps.append(key)
                in_flight.add(key)
                processed[key] += 1
                again = processed[key] <= readds
            if again:
                queue.add(key)  # added while processing: must wait for done
            with lock:
                in_flight.discard(key)
                if all(count == readds + 1 for count in processed.values()):
                    all_done.set()
            queue.done(key)

    threads = [run_in_thread(worker) for _ in range(workers)]
    start.wait(timeout=5)
    for key in keys:
        queue.add(key)

    assert all_done.wait(timeout=10)
    queue.shutdown()
    for thread in threads:
        thread.join(timeout=5)

    assert overlaps == []
    assert processed == dict.fromkeys(keys, readds + 1)  # every add during processing kept
    assert not any(thread.is_alive() for thread in threads)


def test_get_with_a_timeout_returns_none_when_nothing_comes() -> None:
    queue = make_queue()

    assert queue.get(timeout=0.01) is None


# -- delayed adds ------------------------------------------------------------------------


def test_delayed_add_is_not_visible_before_its_time_and_is_after_advance() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)

    queue.add_after(A, 1.0)

    assert queue.len() == 0
    assert queue.get(timeout=0) is None
    clock.advance(0.5)
    assert queue.get(timeout=0) is None
    clock.advance(0.5)
    assert queue.get(timeout=0) == A


def test_delayed_add_wakes_a_getter_already_blocked_once_promoted() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)
    queue.add_after(A, 1000.0)  # a blocked getter would wait 1000 real seconds unwoken
    getter_started = threading.Event()
    got: list[Key | None] = []

    def getter() -> None:
        getter_started.set()
        got.append(queue.get(timeout=30))

    thread = run_in_thread(getter)
    assert getter_started.wait(timeout=5)
    clock.advance(1000.0)
    queue.promote_ready()
    thread.join(timeout=5)

    assert got == [A]


def test_delayed_add_on_the_system_clock_arrives_at_its_time() -> None:
    queue = make_queue(clocks.SystemClock())
    started = time.monotonic()

    queue.add_after(A, 0.05)

    assert queue.get(timeout=5) == A  # the getter's own wait reaches the ready time
    waited = time.monotonic() - started
    assert 0.05 <= waited < 5


def test_earlier_ready_time_wins_when_a_key_is_delayed_twice() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)

    queue.add_after(A, 4.0)
    queue.add_after(A, 1.0)  # moves A earlier
    queue.add_after(B, 1.0)
    queue.add_after(B, 4.0)  # does not postpone B

    clock.advance(1.0)
    assert {queue.get(timeout=0), queue.get(timeout=0)} == {A, B}
    queue.done(A)
    queue.done(B)
    clock.advance(3.0)
    assert queue.get(timeout=0) is None  # each key was waiting once, not twice


def test_delayed_keys_enter_in_ready_time_order() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)
    queue.add_after(C, 3.0)
    queue.add_after(A, 1.0)
    queue.add_after(B, 2.0)

    clock.advance(3.0)

    assert [queue.get(timeout=0) for _ in range(3)] == [A, B, C]


def test_delay_of_zero_or_less_is_a_plain_add() -> None:
    queue = make_queue()

    queue.add_after(A, 0.0)
    queue.add_after(B, -1.0)

    assert [queue.get(timeout=0), queue.get(timeout=0)] == [A, B]


def test_delayed_add_of_a_queued_key_is_deduplicated_when_it_arrives() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)
    queue.add(A)
    queue.add_after(A, 1.0)

    clock.advance(1.0)

    assert queue.len() == 1


# -- rate-limited adds -------------------------------------------------------------------


def test_rate_limited_add_follows_the_backoff_schedule_and_forget_resets_it() -> None:
    clock = clocks.FakeClock()
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[Key](base_delay=0.25, max_delay=1.0)
    queue = make_queue(clock, rate_limiter=limiter)

    def retry_arrives_after(expected: float) -> bool:
        queue.add_rate_limited(A)
        clock.advance(expected / 2)
        early = queue.get(timeout=0)
        clock.advance(expected / 2)
        on_time = queue.get(timeout=0)
        if on_time is not None:
            queue.done(on_time)
        return early is None and on_time == A

    assert [retry_arrives_after(d) for d in (0.25, 0.5, 1.0, 1.0)] == [True] * 4
    assert queue.num_requeues(A) == 4

    queue.forget(A)

    assert queue.num_requeues(A) == 0
    assert retry_arrives_after(0.25)


def test_default_rate_limiter_starts_at_five_milliseconds() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)  # the default controller limiter, on the queue's clock

    queue.add_rate_limited(A)

    assert queue.get(timeout=0) is None
    clock.advance(0.005)
    assert queue.get(timeout=0) == A
    assert queue.num_requeues(A) == 1


# -- shutdown ----------------------------------------------------------------------------


def test_shutdown_wakes_a_blocked_getter() -> None:
    queue = make_queue()
    getter_started = threading.Event()
    got: list[Key | None] = []

    def getter() -> None:
        getter_started.set()
        got.append(queue.get())  # no timeout: only shutdown can end this

    thread = run_in_thread(getter)
    assert getter_started.wait(timeout=5)
    queue.shutdown()
    thread.join(timeout=5)

    assert not thread.is_alive()
    assert got == [None]
    assert queue.shutting_down


def test_adds_after_shutdown_are_ignored() -> None:
    clock = clocks.FakeClock()
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[Key]()
    queue = make_queue(clock, rate_limiter=limiter)
    queue.shutdown()

    queue.add(A)
    queue.add_after(B, 0.0)
    queue.add_after(C, 1.0)
    queue.add_rate_limited(A)
    clock.advance(10.0)

    assert queue.len() == 0
    assert queue.get() is None  # returns at once rather than blocking
    assert limiter.num_requeues(A) == 0


def test_keys_queued_before_shutdown_are_still_handed_out_then_none() -> None:
    queue = make_queue()
    queue.add(A)

    queue.shutdown()

    assert queue.get() == A
    assert queue.get() is None


def test_shutdown_drops_delayed_keys_not_yet_due() -> None:
    clock = clocks.FakeClock()
    queue = make_queue(clock)
    queue.add_after(A, 1.0)

    queue.shutdown()
    clock.advance(1.0)

    assert queue.get() is None


def test_drain_waits_for_keys_handed_out_to_be_done() -> None:
    queue = make_queue()
    queue.add(A)
    assert queue.get(timeout=0) == A
    done_called = threading.Event()
    drain_returned = threading.Event()
    outcome: dict[str, bool] = {}

    def drainer() -> None:
        outcome["drained"] = queue.shutdown_with_drain(timeout=10)
        outcome["after_done"] = done_called.is_set()
        drain_returned.set()

    thread = run_in_thread(drainer)
    assert not drain_returned.wait(timeout=0.1)  # still waiting for A
    done_called.set()
    queue.done(A)
    thread.join(timeout=5)

    assert outcome == {"drained": True, "after_done": True}
    assert queue.shutting_down


def test_drain_times_out_when_a_key_is_never_done() -> None:
    queue = make_queue()
    queue.add(A)
    assert queue.get(timeout=0) == A

    assert queue.shutdown_with_drain(timeout=0.05) is False
    assert queue.shutting_down
    queue.add(B)
    assert queue.len() == 0


def test_drain_with_nothing_handed_out_returns_at_once() -> None:
    queue = make_queue()

    assert queue.shutdown_with_drain(timeout=None) is True


def test_plain_shutdown_cuts_a_drain_short() -> None:
    queue = make_queue()
    queue.add(A)
    assert queue.get(timeout=0) == A
    outcome: list[bool] = []
    drainer_started = threading.Event()

    def drainer() -> None:
        drainer_started.set()
        outcome.append(queue.shutdown_with_drain(timeout=None))

    thread = run_in_thread(drainer)
    assert drainer_started.wait(timeout=5)
    # Wait until the drain has begun (it sets shutting_down first); get(timeout) is the
    # only blocking primitive needed: it returns None at once after shutdown with no keys.
    while not queue.shutting_down:
        assert queue.get(timeout=0.01) is None
    queue.shutdown()
    thread.join(timeout=5)

    assert outcome == [False]


# -- metrics -----------------------------------------------------------------------------


def sample(registry: prometheus_client.CollectorRegistry, metric: str, name: str) -> float:
    value = registry.get_sample_value(metric, {"name": name})
    assert value is not None, metric
    return value


def test_metrics_follow_adds_gets_dones_and_retries() -> None:
    clock = clocks.FakeClock()
    registry = prometheus_client.CollectorRegistry()
    queue = make_queue(clock, registry=registry, name="claims")

    def value(metric: str) -> float:
        return sample(registry, f"gpuoperator_workqueue_{metric}", "claims")

    queue.add(A)
    queue.add(A)
    queue.add(B)
    assert (value("adds_total"), value("depth")) == (2.0, 2.0)

    clock.advance(0.5)
    assert queue.get(timeout=0) == A
    assert value("depth") == 1.0
    assert value("queue_duration_seconds_count") == 1.0
    assert value("queue_duration_seconds_sum") == pytest.approx(0.5)

    clock.advance(2.0)
    assert queue.get(timeout=0) == B
    clock.advance(1.0)
    assert value("longest_running_processor_seconds") == pytest.approx(3.0)
    assert value("unfinished_work_seconds") == pytest.approx(3.0 + 1.0)

    queue.done(A)
    assert value("work_duration_seconds_count") == 1.0
    assert value("work_duration_seconds_sum") == pytest.approx(3.0)
    assert value("longest_running_processor_seconds") == pytest.approx(1.0)

    queue.add_rate_limited(C)
    queue.add_rate_limited(C)
    assert value("retries_total") == 2.0

    queue.done(B)
    assert value("unfinished_work_seconds") == 0.0


def test_two_queues_share_a_registry_without_colliding() -> None:
    registry = prometheus_client.CollectorRegistry()
    first = make_queue(registry=registry, name="first")
    second = make_queue(registry=registry, name="second")

    first.add(A)
    first.add(B)
    second.add(A)

    assert sample(registry, "gpuoperator_workqueue_adds_total", "first") == 2.0
    assert sample(registry, "gpuoperator_workqueue_adds_total", "second") == 1.0


def test_metrics_default_to_the_global_registry() -> None:
    queue = queueing.WorkQueue[Key]("test-queueing-global-registry", clock=clocks.FakeClock())
    before = prometheus_client.REGISTRY.get_sample_value(
        "gpuoperator_workqueue_adds_total", {"name": "test-queueing-global-registry"}
    )

    queue.add(A)

    after = sample(
        prometheus_client.REGISTRY,
        "gpuoperator_workqueue_adds_total",
        "test-queueing-global-registry",
    )
    assert after == (before or 0.0) + 1.0
