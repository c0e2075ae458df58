"""The stream benchmark's pure parts: objects created on an open-loop schedule, and the
time from each one's create to its done."""

from __future__ import annotations

import math
import threading

import pytest
from bench import latency


class FakeClock:
    """Time that moves only when someone sleeps or a create takes time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_each_object_is_created_at_its_own_time() -> None:
    clock = FakeClock()
    started: dict[int, float] = {}

    def create(i: int) -> str:
        started[i] = clock()
        return f"o-{i}"

    created = latency.stream(10, 5.0, create, threads=1, clock=clock, sleep=clock.sleep)
    assert sorted(created) == [f"o-{i}" for i in range(10)]
    for i in range(10):  # 5 per second: object i at 100 + i/5
        assert started[i] == pytest.approx(100.0 + i / 5)


def test_a_slow_create_does_not_push_the_schedule_back() -> None:
    clock = FakeClock()
    started: dict[int, float] = {}

    def create(i: int) -> str:
        started[i] = clock()
        if i == 0:
            clock.sleep(1.0)  # the first create takes a second: five slots
        return f"o-{i}"

    latency.stream(8, 5.0, create, threads=1, clock=clock, sleep=clock.sleep)
    # open loop: the ones that fell due meanwhile go at once, then the pace resumes
    assert started[4] == pytest.approx(101.0)
    assert started[6] == pytest.approx(101.2)
    assert started[7] == pytest.approx(101.4)


def test_a_failed_create_fails_the_stream() -> None:
    def create(i: int) -> str:
        if i == 3:
            raise RuntimeError("refused")
        return str(i)

    clock = FakeClock()
    with pytest.raises(RuntimeError, match="refused"):
        latency.stream(6, 100.0, create, threads=2, clock=clock, sleep=clock.sleep)


def test_latency_runs_from_created_to_done_and_leaves_out_the_undone() -> None:
    created = {"a": 10.0, "b": 11.0, "c": 12.0}
    done = {"a": 10.5, "b": 10.9, "x": 1.0}  # b seen done before its create was answered
    assert latency.latencies(created, done) == [0.5, 0.0]


def test_achieved_rate() -> None:
    assert latency.achieved_rate({"a": 0.0, "b": 0.5, "c": 1.0}) == 2.0
    rate = latency.achieved_rate({"a": 0.0})
    assert math.isnan(rate)
