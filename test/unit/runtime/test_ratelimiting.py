"""The rate limiters keep client-go's schedule: 5 ms doubling to 1000 s per item, and a
10 qps / 100 burst bucket shared by all items. All on fake time."""

from __future__ import annotations

import threading
from collections.abc import Hashable

import pytest

from gpuoperator.runtime import clock as clocks
from gpuoperator.runtime import ratelimiting

# Conformance, checked by mypy (client-go's `var _ RateLimiter = &BucketRateLimiter{}`).
_EXPONENTIAL: ratelimiting.RateLimiter[str] = ratelimiting.ItemExponentialFailureRateLimiter[str]()
_BUCKET: ratelimiting.RateLimiter[tuple[str, str]] = ratelimiting.BucketRateLimiter(
    clock=clocks.FakeClock()
)
_DEFAULT: ratelimiting.RateLimiter[tuple[str, str]] = ratelimiting.default_controller_rate_limiter(
    clocks.FakeClock()
)


def test_exponential_backoff_doubles_from_the_base_delay_per_failure() -> None:
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[str](base_delay=0.005)

    delays = [limiter.when("a") for _ in range(5)]

    assert delays == pytest.approx([0.005, 0.010, 0.020, 0.040, 0.080])
    assert limiter.num_requeues("a") == 5


def test_exponential_backoff_is_capped_at_the_max_delay_even_for_huge_exponents() -> None:
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[str](0.005, 1000.0)

    delays = [limiter.when("a") for _ in range(3000)]  # 2.0**3000 overflows a float

    # 0.005 * 2**17 = 655.36 s is the last step under the cap; 2**18 would be 1310.72 s.
    assert delays[17] == pytest.approx(655.36)
    assert delays[18:] == [1000.0] * (3000 - 18)
    assert limiter.num_requeues("a") == 3000


def test_forget_resets_the_backoff_and_the_requeue_count() -> None:
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[str](0.005, 1000.0)
    for _ in range(4):
        limiter.when("a")

    limiter.forget("a")

    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == pytest.approx(0.005)


def test_items_back_off_independently() -> None:
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[str](0.005, 1000.0)
    for _ in range(3):
        limiter.when("a")

    assert limiter.when("b") == pytest.approx(0.005)
    assert limiter.when("a") == pytest.approx(0.040)
    limiter.forget("b")
    assert (limiter.num_requeues("a"), limiter.num_requeues("b")) == (4, 0)


def test_exponential_counts_every_concurrent_failure_exactly_once() -> None:
    limiter = ratelimiting.ItemExponentialFailureRateLimiter[str](1.0, 1e9)
    threads, per_thread = 8, 50
    start = threading.Barrier(threads)
    delays: list[float] = []
    delays_lock = threading.Lock()

    def fail_repeatedly() -> None:
        start.wait()
        mine = [limiter.when("a") for _ in range(per_thread)]
        with delays_lock:
            delays.extend(mine)

    workers = [threading.Thread(target=fail_repeatedly) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=10)

    total = threads * per_thread
    assert limiter.num_requeues("a") == total
    # Each failure count 0..total-1 was handed out once: no lost or doubled increments.
    assert sorted(delays) == [min(2.0**n, 1e9) for n in range(total)]


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        ratelimiting.ItemExponentialFailureRateLimiter[str](base_delay=-1.0)


def test_bucket_lets_the_burst_through_at_once_then_spaces_items_at_qps() -> None:
    limiter = ratelimiting.BucketRateLimiter(qps=10.0, burst=100, clock=clocks.FakeClock())

    burst = [limiter.when(("ns", f"o{i}")) for i in range(100)]
    after = [limiter.when(("ns", f"late{i}")) for i in range(3)]

    assert burst == [0.0] * 100
    assert after == pytest.approx([0.1, 0.2, 0.3])


def test_bucket_is_shared_by_all_items_including_repeats_of_one() -> None:
    limiter = ratelimiting.BucketRateLimiter(qps=1.0, burst=2, clock=clocks.FakeClock())

    assert [limiter.when("a"), limiter.when("a"), limiter.when("b")] == [0.0, 0.0, 1.0]


def test_bucket_refills_with_time_up_to_the_burst() -> None:
    clock = clocks.FakeClock()
    limiter = ratelimiting.BucketRateLimiter(qps=10.0, burst=100, clock=clock)
    for i in range(103):  # the burst, then three reservations of future tokens
        limiter.when(i)

    clock.advance(1.0)  # ten tokens refill; three of them pay for the reservations

    refilled = [limiter.when(i) for i in range(8)]
    assert refilled[:7] == [0.0] * 7
    assert refilled[7] == pytest.approx(0.1)

    clock.advance(3600.0)  # a long idle time refills only up to the burst
    assert [limiter.when(i) for i in range(100)] == [0.0] * 100
    assert limiter.when("one more") == pytest.approx(0.1)


def test_bucket_never_counts_requeues_and_forget_changes_nothing() -> None:
    limiter = ratelimiting.BucketRateLimiter(qps=1.0, burst=1, clock=clocks.FakeClock())
    limiter.when("a")

    limiter.forget("a")

    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == pytest.approx(1.0)  # forget did not give the token back


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 10), (-1.0, 10), (10.0, 0)])
def test_bucket_refuses_a_rate_or_burst_that_could_never_pass(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        ratelimiting.BucketRateLimiter(qps=qps, burst=burst, clock=clocks.FakeClock())


def test_bucket_with_infinite_qps_never_delays() -> None:
    limiter = ratelimiting.BucketRateLimiter(qps=float("inf"), burst=1, clock=clocks.FakeClock())

    assert [limiter.when("a") for _ in range(5)] == [0.0] * 5


def test_max_of_picks_the_larger_delay() -> None:
    limiter = ratelimiting.MaxOfRateLimiter[str](
        ratelimiting.ItemExponentialFailureRateLimiter[str](0.005, 1000.0),
        ratelimiting.BucketRateLimiter(qps=1.0, burst=1, clock=clocks.FakeClock()),
    )

    assert limiter.when("a") == pytest.approx(0.005)  # the backoff beats an idle bucket
    assert limiter.when("b") == pytest.approx(1.0)  # the empty bucket beats a first failure


def test_max_of_asks_every_limiter_even_when_one_dominates() -> None:
    exponential = ratelimiting.ItemExponentialFailureRateLimiter[str](100.0, 1000.0)
    bucket = ratelimiting.BucketRateLimiter(qps=1.0, burst=1, clock=clocks.FakeClock())
    limiter = ratelimiting.MaxOfRateLimiter[str](exponential, bucket)

    assert limiter.when("a") == pytest.approx(100.0)

    assert bucket.when("b") == pytest.approx(1.0)  # the bucket's token was spent anyway


def test_max_of_reports_the_most_requeues_and_forgets_everywhere() -> None:
    fast = ratelimiting.ItemExponentialFailureRateLimiter[str](0.001, 1.0)
    slow = ratelimiting.ItemExponentialFailureRateLimiter[str](0.1, 10.0)
    limiter = ratelimiting.MaxOfRateLimiter[str](fast, slow)
    fast.when("a")
    for _ in range(3):
        limiter.when("a")

    assert limiter.num_requeues("a") == 4

    limiter.forget("a")
    assert (fast.num_requeues("a"), slow.num_requeues("a")) == (0, 0)


def test_default_controller_rate_limiter_combines_backoff_and_bucket() -> None:
    limiter = ratelimiting.default_controller_rate_limiter(clocks.FakeClock())

    first_failures = [limiter.when(("ns", f"o{i}")) for i in range(100)]
    assert first_failures == pytest.approx([0.005] * 100)
    assert limiter.when(("ns", "o100")) == pytest.approx(0.1)  # the burst is spent

    key: Hashable = ("ns", "o0")
    delays = [limiter.when(key) for _ in range(30)]
    assert delays[-1] == pytest.approx(1000.0)
    assert limiter.num_requeues(key) == 31
