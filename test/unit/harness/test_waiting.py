"""Waiting with a deadline (test/harness/waiting.py): a probe's failure means "not yet",
unless it says waiting cannot help."""

from __future__ import annotations

import pytest

from harness.waiting import HopelessWaitError, WaitTimeoutError, wait_for


def test_a_hopeless_probe_ends_the_wait_at_once() -> None:
    calls: list[int] = []

    def exited() -> bool:
        calls.append(1)
        raise HopelessWaitError("the process exited")

    with pytest.raises(HopelessWaitError, match="exited"):
        wait_for("a process that exited", exited, timeout=3600, interval=3600)
    assert len(calls) == 1


def test_another_failure_of_the_probe_counts_as_not_yet_and_is_reported_on_timeout() -> None:
    def failing() -> bool:
        raise ValueError("not listening yet")

    with pytest.raises(WaitTimeoutError, match="not listening yet"):
        wait_for("a server", failing, timeout=0, interval=0)
