"""Waiting with a deadline: poll (or re-read after each watch event) until a condition
holds, and on timeout say what was last seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """The condition did not hold in time; the message carries the last observation."""


class HopelessWaitError(AssertionError):
    """Raised by a probe when waiting longer cannot help (the process it waits for exited):
    :func:`wait_for` lets it through at once."""


def wait_for(
    what: str,
    probe: Callable[[], T],
    until: Callable[[T], bool] = bool,
    timeout: float = 30.0,
    interval: float = 0.1,
) -> T:
    """Call ``probe`` until ``until(value)`` is true and return that value.

    Exceptions from ``probe`` count as "not yet" and are reported if time runs out, but
    :class:`HopelessWaitError`, which ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: object = "<nothing observed>"
    while True:
        try:
            value = probe()
        except HopelessWaitError:
            raise
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; last saw: {last!r}"
            )
        time.sleep(interval)
