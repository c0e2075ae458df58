"""The pacer: a key's changes gathered for one interval from the first, then written once."""

from __future__ import annotations

import pytest

from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.pacing import Pacer


def test_the_first_change_waits_one_interval_and_later_ones_count_down_with_it() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(2.0, clock=clock)
    assert pacer.delay("a") == 2.0
    clock.advance(0.5)
    assert pacer.delay("a") == 1.5  # a second change joins the first one's wait
    assert pacer.delay("b") == 2.0  # another key waits on its own
    clock.advance(1.5)
    assert pacer.delay("a") == 0.0


def test_waiting_counts_down_a_change_already_waiting_and_starts_none() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(2.0, clock=clock)
    assert pacer.waiting("a") == 0.0
    assert pacer.delay("a") == 2.0  # asking waiting() first started nothing
    clock.advance(0.5)
    assert pacer.waiting("a") == 1.5
    pacer.wrote("a")
    assert pacer.waiting("a") == 0.0


def test_after_a_write_the_next_change_waits_a_whole_interval_again() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(2.0, clock=clock)
    pacer.delay("a")
    clock.advance(2.0)
    pacer.wrote("a")
    clock.advance(0.5)
    assert pacer.delay("a") == 2.0  # so two writes of a key are an interval apart at least
    clock.advance(10.0)
    assert pacer.delay("a") == 0.0


def test_a_forgotten_key_starts_afresh_and_an_interval_of_zero_never_waits() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(5.0, clock=clock)
    pacer.delay("gone")
    clock.advance(4.0)
    pacer.forget("gone")
    assert pacer.delay("gone") == 5.0
    never: Pacer[str] = Pacer(0.0, clock=clock)
    never.delay("a")
    assert never.delay("a") == 0.0


def test_dropping_old_keys_keeps_those_still_waiting() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(1.0, clock=clock)
    for key in range(4095):
        pacer.delay(f"old-{key}")
    clock.advance(2.0)
    pacer.delay("recent")
    clock.advance(0.5)
    pacer.delay("newest")  # one key too many: those long due are dropped
    assert pacer.delay("recent") == 0.5
    assert pacer.delay("newest") == 1.0
    assert len(pacer._pending) == 2


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Pacer(-1.0)
