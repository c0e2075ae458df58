"""Fixtures and settings shared by every test tree (unit, e2e, chaos).

Product code logs through structlog. Its default logger writes to the ``sys.stdout`` of the
moment structlog was imported, which is past pytest's capture, so a warning from a
background thread (an informer retrying while a test partitions it) would land in the
middle of a green run's output. Tests route structlog through the standard library
instead: pytest captures those records per test and shows them only with a failure.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

import pluggy
import pytest
import structlog


def pytest_configure(config: pytest.Config) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tell the helpers that run Go-built binaries (test/unit/config/manifests.py) whether this
    test is marked ``needs_tools``: they refuse a test that is not, so ``make unit``, which
    deselects the marker, keeps running on a checkout where nothing is built."""
    manifests = sys.modules.get("unit.config.manifests")
    if manifests is not None:
        marked = item.get_closest_marker("needs_tools") is not None
        vars(manifests)["current_test_needs_tools"] = marked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A failed e2e or chaos test's report carries the last lines of every operator replica
    (process or container) still running (their logs stay in the test's temporary
    directory, which a CI run does not keep)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for module in ("harness.operator", "harness.replicas"):
            found = sys.modules.get(module)
            if found is not None:
                report.sections.extend(found.log_tails())


def _stop_leftovers() -> list[str]:
    """Stop every child process still running that this interpreter started, and name
    each (its first arguments)."""
    import gc
    import subprocess

    # Product code run in-process (a Manager) freezes what exists after its caches synced
    # (gc.freeze); frozen objects are not in get_objects() until unfrozen.
    gc.unfreeze()
    leftovers = [
        o for o in gc.get_objects() if isinstance(o, subprocess.Popen) and o.poll() is None
    ]
    for proc in leftovers:
        proc.kill()
        proc.wait(10)
    return [
        " ".join(map(str, proc.args[:4])) if isinstance(proc.args, list) else str(proc.args)
        for proc in leftovers
    ]


def _stop_leftovers_at_exit() -> None:
    """The same once more as the interpreter exits, for a child a background thread started
    after the session ended: named on stderr instead of a ResourceWarning traceback."""
    import sys

    stopped = _stop_leftovers()
    if stopped:
        print(
            f"stopped {len(stopped)} process(es) started after the session: {', '.join(stopped)}",
            file=sys.stderr,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop child processes a test left running (a replica or a component whose owner did
    not stop it), naming each, so none outlives the session and the interpreter's exit
    prints no ResourceWarning traceback for it."""
    import atexit

    stopped = _stop_leftovers()
    atexit.register(_stop_leftovers_at_exit)
    if stopped:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"stopped {len(stopped)} process(es) left running: {', '.join(stopped)}"
            )
