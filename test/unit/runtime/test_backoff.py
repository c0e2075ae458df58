"""The informer's backoff between failed lists and watches."""

from __future__ import annotations

import random

from gpuoperator.runtime.backoff import Backoff


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.8, 30.0, jitter=0.0)
    assert [b.next() for _ in range(7)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]
    b.reset()
    assert b.next() == 0.8


def test_jitter_lengthens_a_delay_by_at_most_its_factor_and_never_past_the_cap() -> None:
    b = Backoff(1.0, 3.0, jitter=1.0, rng=random.Random(7))  # noqa: S311
    delays = [b.next() for _ in range(5)]
    assert 1.0 <= delays[0] <= 2.0
    assert 2.0 <= delays[1] <= 3.0
    assert all(d <= 3.0 for d in delays)
