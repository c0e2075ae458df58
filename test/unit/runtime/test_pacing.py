"""The pacer: one write per key per interval, the next one told how long to wait."""

from __future__ import annotations

import pytest

from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.pacing import Pacer


def test_a_key_written_waits_out_the_interval_and_other_keys_do_not() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(2.0, clock=clock)
    assert pacer.delay("a") == 0.0
    pacer.wrote("a")
    clock.advance(0.5)
    assert pacer.delay("a") == 1.5
    assert pacer.delay("b") == 0.0
    clock.advance(1.5)
    assert pacer.delay("a") == 0.0


def test_a_forgotten_key_is_not_delayed_and_an_interval_of_zero_never_is() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(5.0, clock=clock)
    pacer.wrote("gone")
    pacer.forget("gone")
    assert pacer.delay("gone") == 0.0
    never: Pacer[str] = Pacer(0.0, clock=clock)
    never.wrote("a")
    assert never.delay("a") == 0.0


def test_dropping_old_keys_keeps_those_still_within_their_interval() -> None:
    clock = FakeClock()
    pacer: Pacer[str] = Pacer(1.0, clock=clock)
    for key in range(4095):
        pacer.wrote(f"old-{key}")
    clock.advance(2.0)
    pacer.wrote("recent")
    clock.advance(0.5)
    pacer.wrote("newest")  # one key too many: those past their interval are dropped
    assert pacer.delay("recent") == 0.5
    assert pacer.delay("newest") == 1.0


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Pacer(-1.0)
