"""Leader election on fake time: every pause of the loop advances a ``FakeClock`` (the
elector's ``wait`` hook), so no test sleeps and every timing is exact."""

from __future__ import annotations

import dataclasses
import datetime
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from gpuoperator import names
from gpuoperator.runtime import errors, leading, leases
from gpuoperator.runtime.clock import FakeClock
from harness.leases import InMemoryLeaseStore

NS = "gpu-system"


# --- helpers ---------------------------------------------------------------------------------


class Recorder:
    """Callbacks, with the elapsed fake time at which each was called."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.start = clock.monotonic()
        self.calls: list[tuple[str, float]] = []
        self.leaders: list[str] = []
        self.elector: leading.LeaderElector | None = None
        self.is_leader_when_stopped: list[bool] = []

    def elapsed(self) -> float:
        return self.clock.monotonic() - self.start

    def started(self) -> None:
        self.calls.append(("started", self.elapsed()))

    def stopped(self) -> None:
        assert self.elector is not None
        self.is_leader_when_stopped.append(self.elector.is_leader())
        self.calls.append(("stopped", self.elapsed()))

    def new_leader(self, identity: str) -> None:
        self.leaders.append(identity)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Driver:
    """The elector's ``wait`` hook: advances the fake clock(s) instead of sleeping, runs the
    scripted actions whose time has come, and stops the loop after ``limit`` pauses."""

    def __init__(self, stop: threading.Event, *clocks: FakeClock, limit: int = 200) -> None:
        self.stop = stop
        self.clocks = clocks
        self.start = clocks[0].monotonic()
        self.limit = limit
        self.pauses: list[float] = []
        self.actions: list[tuple[float, Callable[[], None]]] = []

    def at(self, elapsed: float, action: Callable[[], None]) -> None:
        self.actions.append((elapsed, action))
        self.actions.sort(key=lambda a: a[0])

    def stop_at(self, elapsed: float) -> None:
        self.at(elapsed, self.stop.set)

    def elapsed(self) -> float:
        return self.clocks[0].monotonic() - self.start

    def __call__(self, seconds: float) -> bool:
        self.pauses.append(seconds)
        if len(self.pauses) > self.limit:
            raise AssertionError("the elector never stopped")
        for c in self.clocks:
            c.advance(seconds)
        while self.actions and self.actions[0][0] <= self.elapsed():
            _, action = self.actions.pop(0)
            action()
        return self.stop.is_set()


class FlakyStore:
    """Wraps a store: ``down`` makes every call fail as an unreachable API server would;
    ``before_update`` runs just before each update (to let a rival write first);
    ``crash`` raises a non-API error (a bug)."""

    def __init__(self, inner: leases.LeaseStore) -> None:
        self.inner = inner
        self.down = False
        self.crash = False
        self.before_update: Callable[[leases.LeaderElectionRecord], None] | None = None

    def _check(self) -> None:
        if self.crash:
            raise RuntimeError("bug")
        if self.down:
            raise errors.ApiError(503, "ServiceUnavailable", "etcd is down")

    def get(self, namespace: str, name: str) -> tuple[leases.LeaderElectionRecord, str] | None:
        self._check()
        return self.inner.get(namespace, name)

    def create(self, namespace: str, name: str, record: leases.LeaderElectionRecord) -> str:
        self._check()
        return self.inner.create(namespace, name, record)

    def update(
        self,
        namespace: str,
        name: str,
        record: leases.LeaderElectionRecord,
        resource_version: str,
    ) -> str:
        self._check()
        if self.before_update is not None:
            self.before_update(record)
        return self.inner.update(namespace, name, record, resource_version)


def make(
    identity: str,
    store: leases.LeaseStore,
    clock: FakeClock,
    *,
    registry: CollectorRegistry | None = None,
    wait: Callable[[float], bool] | None = None,
    jitter: float = 0.0,
    **config: Any,
) -> tuple[leading.LeaderElector, Recorder]:
    rec = Recorder(clock)
    elector = leading.LeaderElector(
        leading.LeaderElectionConfig(
            NS, **{"name": names.LEADER_LEASE, **config}, identity=identity
        ),
        store,
        on_started_leading=rec.started,
        on_stopped_leading=rec.stopped,
        on_new_leader=rec.new_leader,
        clock=clock,
        registry=registry if registry is not None else CollectorRegistry(),
        wait=wait,
        jitter=lambda: jitter,
    )
    rec.elector = elector
    return elector, rec


def record(store: leases.LeaseStore) -> leases.LeaderElectionRecord:
    got = store.get(NS, names.LEADER_LEASE)
    assert got is not None
    return got[0]


def at(start: datetime.datetime, seconds: float) -> datetime.datetime:
    return start + datetime.timedelta(seconds=seconds)


T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


# --- one attempt -----------------------------------------------------------------------------


def test_an_absent_lease_is_created_with_us_as_holder() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)

    assert store.get(NS, names.LEADER_LEASE) is None
    assert a.try_acquire_or_renew()

    assert record(store) == leases.LeaderElectionRecord(
        holder_identity="a",
        lease_duration_seconds=15,
        acquire_time=T0,
        renew_time=T0,
        lease_transitions=0,
    )
    assert a.is_leader()
    assert a.leader() == "a"


def test_a_second_candidate_cannot_acquire_while_the_holder_renews() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    b, _ = make("b", store, clock)
    assert a.try_acquire_or_renew()

    for _ in range(30):  # a minute, far beyond lease_duration
        assert not b.try_acquire_or_renew()
        assert not b.is_leader()
        clock.advance(2)
        assert a.try_acquire_or_renew()

    assert record(store).holder_identity == "a"
    assert record(store).renew_time == at(T0, 60)
    assert b.leader() == "a"


def test_takeover_waits_lease_duration_from_the_candidates_own_observation() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    b, _ = make("b", store, clock)
    assert a.try_acquire_or_renew()  # t=0, then a stops renewing

    clock.advance(5)
    assert not b.try_acquire_or_renew()  # b first sees the record at t=5
    clock.advance(10)
    assert not b.try_acquire_or_renew()  # t=15: expired by a's renewTime, not by b's clock
    clock.advance(4.875)
    assert not b.try_acquire_or_renew()  # one tick before 5 + 15
    clock.advance(0.125)
    assert b.try_acquire_or_renew()  # t=20

    got = record(store)
    assert (got.holder_identity, got.lease_transitions) == ("b", 1)
    assert got.acquire_time == got.renew_time == at(T0, 20)
    assert b.is_leader()
    assert not a.try_acquire_or_renew()  # b's lease is fresh to a as well
    assert not a.is_leader()


@pytest.mark.parametrize("skew_days", [-365, 365], ids=["renewTime-in-the-past", "in-the-future"])
def test_takeover_ignores_the_timestamps_in_the_record(skew_days: int) -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    clock_a.step_wall(skew_days * 86400)  # a's wall clock is a year off; monotonic time is not
    store = InMemoryLeaseStore()
    a, _ = make("a", store, clock_a)
    b, _ = make("b", store, clock_b)
    assert a.try_acquire_or_renew()
    assert record(store).renew_time == at(T0, skew_days * 86400)

    def tick(seconds: float) -> None:
        clock_a.advance(seconds)
        clock_b.advance(seconds)

    assert not b.try_acquire_or_renew()  # a timestamp check would take over a "stale" lease here
    tick(14.875)
    assert not b.try_acquire_or_renew()
    tick(0.125)
    assert b.try_acquire_or_renew()  # a timestamp check would wait a year here
    assert record(store).holder_identity == "b"


def test_the_holders_lease_duration_in_the_record_decides_not_the_candidates() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock, lease_duration=30)
    b, _ = make("b", store, clock)  # b itself would hold for 15 s
    assert a.try_acquire_or_renew()
    assert record(store).lease_duration_seconds == 30

    assert not b.try_acquire_or_renew()
    clock.advance(29.875)
    assert not b.try_acquire_or_renew()
    clock.advance(0.125)
    assert b.try_acquire_or_renew()


def test_a_conflict_on_update_fails_the_attempt() -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    a, _ = make("a", store, clock)
    b, _ = make("b", inner, clock)
    holder, _ = make("h", inner, clock)
    assert holder.try_acquire_or_renew()
    assert holder.release()  # a free lease both may take

    def rival_writes_first(_: leases.LeaderElectionRecord) -> None:
        store.before_update = None
        assert b.try_acquire_or_renew()

    store.before_update = rival_writes_first
    assert not a.try_acquire_or_renew()  # a read rv N; b wrote N+1 first; a's PUT is a 409

    assert not a.is_leader()
    got = record(inner)
    assert (got.holder_identity, got.lease_transitions) == ("b", 1)
    assert not a.try_acquire_or_renew()  # and on the next attempt a sees b's valid lease
    assert a.leader() == "b"


def test_transitions_count_only_changes_of_holder() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    b, _ = make("b", store, clock)
    assert a.try_acquire_or_renew()
    for _ in range(3):
        clock.advance(2)
        assert a.try_acquire_or_renew()
    got = record(store)
    assert got.lease_transitions == 0
    assert (got.acquire_time, got.renew_time) == (T0, at(T0, 6))  # acquireTime kept on renew

    assert not b.try_acquire_or_renew()
    clock.advance(15)
    assert b.try_acquire_or_renew()  # a -> b
    clock.advance(2)
    assert b.try_acquire_or_renew()  # b renews
    got = record(store)
    assert got.lease_transitions == 1
    assert got.acquire_time == at(T0, 21)

    assert b.release()  # b -> "": a release is not a transition
    assert record(store).lease_transitions == 1
    assert a.try_acquire_or_renew()  # "" -> a
    assert record(store).lease_transitions == 2


def test_a_released_lease_is_taken_at_the_next_attempt() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    b, _ = make("b", store, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.advance(1)

    assert a.release()
    assert not a.is_leader()
    assert record(store) == leases.LeaderElectionRecord(
        holder_identity="",
        lease_duration_seconds=1,
        acquire_time=at(T0, 1),
        renew_time=at(T0, 1),
        lease_transitions=0,
    )
    assert b.try_acquire_or_renew()  # no waiting for a's 15 s
    assert record(store).holder_identity == "b"
    assert b.release()
    released = store.get(NS, names.LEADER_LEASE)
    assert b.release()  # nothing left to release: no second write
    assert a.release()  # a does not hold it: no write either
    assert store.get(NS, names.LEADER_LEASE) == released


def test_release_never_clobbers_a_new_holder() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    b, _ = make("b", store, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.advance(15)
    assert b.try_acquire_or_renew()  # a has not looked since

    assert not a.release()  # a still thinks it holds it, but its resourceVersion is stale
    assert record(store).holder_identity == "b"
    assert not a.is_leader()


def test_is_leader_turns_false_when_renews_stall_even_before_the_loop_runs() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    assert not a.is_leader()
    assert a.try_acquire_or_renew()
    clock.advance(9.875)
    assert a.is_leader()
    clock.advance(0.125)  # renew_deadline after the last successful renew; nobody else wrote
    assert not a.is_leader()
    assert record(store).holder_identity == "a"
    assert a.try_acquire_or_renew()  # a renew restores it
    assert a.is_leader()


def test_is_leader_is_false_once_another_holder_is_observed() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    assert a.try_acquire_or_renew()
    rival = dataclasses.replace(record(store), holder_identity="x")
    got = store.get(NS, names.LEADER_LEASE)
    assert got is not None
    store.update(NS, names.LEADER_LEASE, rival, got[1])

    assert a.is_leader()  # nothing read yet
    assert not a.try_acquire_or_renew()
    assert not a.is_leader()


def test_api_errors_fail_the_attempt_without_raising() -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    a, _ = make("a", store, clock)
    store.down = True
    assert not a.try_acquire_or_renew()
    assert inner.get(NS, names.LEADER_LEASE) is None
    store.down = False
    assert a.try_acquire_or_renew()


def test_on_new_leader_is_told_each_change_of_holder() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, rec_a = make("a", store, clock)
    b, rec_b = make("b", store, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew()
    assert a.release()
    assert b.try_acquire_or_renew()

    assert rec_a.leaders == ["a", ""]
    assert rec_b.leaders == ["a", "", "b"]


# --- the loop --------------------------------------------------------------------------------


def test_run_leads_and_on_stop_releases_then_stops_leading() -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    stop = threading.Event()
    driver = Driver(stop, clock)
    a, rec = make("a", store, clock, wait=driver)
    b, _ = make("b", inner, clock)
    writes: list[tuple[str, bool]] = []  # (holder written, a.is_leader() at that moment)
    store.before_update = lambda r: writes.append((r.holder_identity, a.is_leader()))
    b_attempts: list[bool] = []
    driver.at(2, lambda: b_attempts.append(b.try_acquire_or_renew()))
    driver.stop_at(4)

    a.run(stop)

    assert rec.calls == [("started", 0), ("stopped", 4)]
    assert driver.pauses == [2, 2]  # renews every retry_period, no jitter
    assert b_attempts == [False]
    # a renewed at t=2 as leader, and was fenced before the release was written at t=4.
    assert writes == [("a", True), ("", False)]
    assert rec.is_leader_when_stopped == [False]
    got = record(inner)
    assert (got.holder_identity, got.lease_duration_seconds) == ("", 1)
    assert got.renew_time == got.acquire_time == at(T0, 4)
    assert b.try_acquire_or_renew()  # b saw a valid lease at t=2, takes it at once at t=4
    assert record(inner).lease_transitions == 1


def test_on_stop_the_lease_is_released_only_after_the_controllers_stopped() -> None:
    """As client-go's ReleaseOnCancel requires: what the lease guards stops (and its writes
    finish) before another replica can take over."""
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    holders_while_stopping: list[str] = []

    def stopped() -> None:
        holders_while_stopping.append(record(store).holder_identity)

    a = leading.LeaderElector(
        leading.LeaderElectionConfig(NS, name=names.LEADER_LEASE, identity="a"),
        store,
        on_started_leading=lambda: None,
        on_stopped_leading=stopped,
        clock=clock,
        registry=CollectorRegistry(),
        wait=driver,
    )
    driver.stop_at(4)

    a.run(stop)

    assert holders_while_stopping == ["a"], "the lease was released before controllers stopped"
    assert record(store).holder_identity == ""


def test_on_stop_a_lease_whose_controllers_did_not_drain_is_left_to_expire() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    a = leading.LeaderElector(
        leading.LeaderElectionConfig(NS, name=names.LEADER_LEASE, identity="a"),
        store,
        on_started_leading=lambda: None,
        on_stopped_leading=lambda: False,  # a reconcile is still writing
        clock=clock,
        registry=CollectorRegistry(),
        wait=driver,
    )
    b, _ = make("b", store, clock)
    driver.stop_at(4)

    with structlog.testing.capture_logs() as logs:
        a.run(stop)

    assert record(store).holder_identity == "a"
    assert not b.try_acquire_or_renew(), "b must wait for the lease to expire"
    assert any(e.get("reason") == leading.REASON_NOT_DRAINED for e in logs)


def test_lease_remaining_counts_down_to_when_another_candidate_may_take_over() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    a, _ = make("a", store, clock)
    assert a.lease_remaining() == 0.0
    assert a.try_acquire_or_renew()
    clock.advance(4)
    assert a.lease_remaining() == pytest.approx(15 - 4)
    clock.advance(6)  # the renew deadline passed: fenced, nothing left
    assert a.lease_remaining() == 0.0


def test_run_without_release_on_cancel_leaves_the_lease_to_expire() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    a, rec = make("a", store, clock, wait=driver, release_on_cancel=False)
    b, _ = make("b", store, clock)
    driver.stop_at(4)

    a.run(stop)

    assert rec.names() == ["started", "stopped"]
    assert not a.is_leader()
    assert record(store).holder_identity == "a"
    assert not b.try_acquire_or_renew()


@pytest.mark.parametrize(
    ("retry_period", "down_at", "last_renew", "last_failed", "lost_at"),
    [(2.0, 3.0, 2.0, 10.0, 12.0), (3.0, 1.0, 0.0, 9.0, 10.0)],
    ids=["retry-2s", "retry-3s-wakes-at-the-deadline"],
)
def test_renews_failing_past_renew_deadline_lose_leadership(
    retry_period: float, down_at: float, last_renew: float, last_failed: float, lost_at: float
) -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    stop = threading.Event()
    driver = Driver(stop, clock)
    a, rec = make("a", store, clock, wait=driver, retry_period=retry_period)
    still_leader: list[bool] = []
    driver.at(down_at, lambda: setattr(store, "down", True))
    driver.at(last_failed - 0.5, lambda: still_leader.append(a.is_leader()))
    renewed: list[datetime.datetime | None] = []
    driver.at(lost_at, lambda: renewed.append(record(inner).renew_time))
    driver.at(lost_at + 4, lambda: setattr(store, "down", False))
    driver.stop_at(lost_at + 12)

    a.run(stop)

    assert still_leader == [True]  # the last failed attempt is within renew_deadline
    assert renewed == [at(T0, last_renew)]
    started, stopped, started_again, stopped_again = rec.calls
    assert started == ("started", 0)
    assert stopped == ("stopped", lost_at)  # last_renew + renew_deadline, not later
    assert rec.is_leader_when_stopped == [False, False]
    # Back to acquiring; once the API answers, the lease (still ours) is taken again.
    assert started_again[0] == "started"
    assert lost_at + 4 <= started_again[1] <= lost_at + 4 + retry_period
    assert stopped_again == ("stopped", lost_at + 12)
    assert record(inner).holder_identity == ""


def test_observing_another_holder_loses_leadership_at_once() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    a, rec = make("a", store, clock, wait=driver)

    def intrude() -> None:  # a rival writes itself as holder (say, after a long pause of a)
        got = store.get(NS, names.LEADER_LEASE)
        assert got is not None
        store.update(
            NS, names.LEADER_LEASE, dataclasses.replace(got[0], holder_identity="x"), got[1]
        )

    driver.at(3, intrude)
    driver.stop_at(12)

    a.run(stop)

    assert rec.calls == [("started", 0), ("stopped", 4)]  # the next renew, not after 10 s
    assert rec.is_leader_when_stopped == [False]
    assert rec.leaders == ["a", "x"]
    assert record(store).holder_identity == "x"  # loss is not a release


def test_acquire_retries_with_jitter_when_the_attempt_fails_for_another_reason() -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    store.down = True
    stop = threading.Event()
    driver = Driver(stop, clock, limit=3)
    b, rec = make("b", store, clock, wait=driver, jitter=0.5)
    driver.stop_at(9)

    b.run(stop)

    assert driver.pauses == pytest.approx([2 * (1 + 0.5 * 1.2)] * 3)
    assert rec.calls == []  # stopped while acquiring: no callbacks


def test_while_another_lease_runs_attempts_come_every_period_and_at_its_expiry() -> None:
    """No jitter while a live holder is watched: a renew is seen at most one period late,
    and the expired lease is taken the moment it expires (lease_duration + retry_period
    after the holder's last renew at worst)."""
    clock, store = FakeClock(), InMemoryLeaseStore()
    holder, _ = make("h", store, clock)
    assert holder.try_acquire_or_renew()
    clock.advance(1.0)
    stop = threading.Event()
    driver = Driver(stop, clock, limit=20)
    b, rec = make("b", store, clock, wait=driver, jitter=0.5)
    driver.stop_at(30)

    b.run(stop)

    # Observed at t=1 (lease 15 s from then): seven periods of 2 s, then 1 s to expiry.
    assert driver.pauses[:8] == pytest.approx([2.0] * 7 + [1.0])
    assert rec.calls[0][0] == "started"
    assert rec.calls[0][1] == pytest.approx(15.0)  # from b's start, which observed it at once


def test_stop_set_before_run_returns_at_once() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    stop.set()
    driver = Driver(stop, clock)
    a, rec = make("a", store, clock, wait=driver)
    a.run(stop)
    assert rec.calls == []
    assert store.get(NS, names.LEADER_LEASE) is None


def test_a_bug_while_leading_fences_stops_leading_and_propagates() -> None:
    clock, inner = FakeClock(), InMemoryLeaseStore()
    store = FlakyStore(inner)
    stop = threading.Event()
    driver = Driver(stop, clock)
    registry = CollectorRegistry()
    a, rec = make("a", store, clock, wait=driver, registry=registry)
    driver.at(3, lambda: setattr(store, "crash", True))

    with pytest.raises(RuntimeError, match="bug"):
        a.run(stop)

    assert rec.calls == [("started", 0), ("stopped", 4)]
    assert not a.is_leader()
    assert (
        registry.get_sample_value(
            "gpuoperator_leader_is_leader", {"lease": f"{NS}/{names.LEADER_LEASE}"}
        )
        == 0
    )


def test_run_with_the_default_wait_returns_when_stop_is_set() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    calls: list[str] = []

    def started() -> None:
        calls.append("started")
        stop.set()  # the renew loop's stop.wait(2) must return at once

    a = leading.LeaderElector(
        leading.LeaderElectionConfig(NS, name=names.LEADER_LEASE, identity="a"),
        store,
        on_started_leading=started,
        on_stopped_leading=lambda: calls.append("stopped"),
        clock=clock,
        registry=CollectorRegistry(),
    )
    thread = threading.Thread(target=a.run, args=(stop,))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert calls == ["started", "stopped"]
    assert record(store).holder_identity == ""


# --- metrics and logs ------------------------------------------------------------------------


def test_metrics_follow_leadership() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    registry = CollectorRegistry()
    a, _ = make("a", store, clock, wait=driver, registry=registry)
    labels = {"lease": f"{NS}/{names.LEADER_LEASE}"}

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    seen: list[float | None] = []
    driver.at(1, lambda: seen.append(sample("gpuoperator_leader_is_leader")))
    driver.stop_at(3)
    assert sample("gpuoperator_leader_is_leader") == 0
    a.run(stop)

    assert seen == [1]
    assert sample("gpuoperator_leader_is_leader") == 0
    assert sample("gpuoperator_leader_transitions_total") == 2  # became, then stopped
    # A second elector on the same registry shares the collectors instead of clashing.
    make("b", store, clock, registry=registry)


def test_one_log_event_per_transition() -> None:
    clock, store = FakeClock(), InMemoryLeaseStore()
    stop = threading.Event()
    driver = Driver(stop, clock)
    a, _ = make("a", store, clock, wait=driver)
    driver.stop_at(2)

    with structlog.testing.capture_logs() as logs:
        a.run(stop)

    events = [(e["event"], e.get("holder"), e.get("reason")) for e in logs]
    assert events == [
        ("new leader observed", "a", "HolderChanged"),
        ("became leader", "a", "LeaseCreated"),
        ("lost leadership", "a", "Stopped"),
        ("new leader observed", "", "HolderChanged"),
        ("released lease", "", "Stopped"),
    ]
    assert all(e["lease"] == f"{NS}/{names.LEADER_LEASE}" and e["identity"] == "a" for e in logs)


# --- configuration ---------------------------------------------------------------------------


def test_config_defaults_are_client_go_s() -> None:
    cfg = leading.LeaderElectionConfig(NS, name=names.LEADER_LEASE, identity="a")
    assert (cfg.name, cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == (
        names.LEADER_LEASE,
        15.0,
        10.0,
        2.0,
    )
    assert cfg.release_on_cancel
    leading.LeaderElectionConfig(
        NS, name=names.LEADER_LEASE, identity="a", renew_deadline=2.5
    )  # just above 1.2 * 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"identity": ""}, "identity"),
        ({"namespace": ""}, "namespace"),
        ({"name": ""}, "name"),
        ({"lease_duration": 10.0}, "lease_duration"),  # not greater than renew_deadline
        ({"lease_duration": 15.5}, "lease_duration"),  # not whole seconds
        ({"lease_duration": -1.0}, "lease_duration"),
        ({"renew_deadline": 2.4}, "renew_deadline"),  # not greater than 1.2 * retry_period
        ({"renew_deadline": math.nan}, "renew_deadline"),
        ({"retry_period": 0.0}, "retry_period"),
        ({"lease_duration": math.inf}, "lease_duration"),
    ],
)
def test_bad_config_raises_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    kwargs: dict[str, Any] = {
        "namespace": NS,
        "name": names.LEADER_LEASE,
        "identity": "a",
        **overrides,
    }
    with pytest.raises(ValueError, match=rf"^{field} "):
        leading.LeaderElectionConfig(**kwargs)


def test_unique_identity_differs_per_process_even_with_one_pod_name() -> None:
    one, two = leading.unique_identity("pod-0"), leading.unique_identity("pod-0")
    assert one.startswith("pod-0_") and two.startswith("pod-0_")
    assert one != two
