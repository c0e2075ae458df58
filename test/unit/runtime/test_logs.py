"""The operator's log configuration (``runtime.logs``), run in a child interpreter: it
configures structlog and the standard library's logging for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

PROGRAM = textwrap.dedent(
    """
    import structlog
    from gpuoperator.runtime import logs

    logs.configure("json", "info")
    log = structlog.get_logger("demo")

    def write_license(token):
        body = {"token": token}
        raise RuntimeError("403 Forbidden: the namespace is being terminated")

    try:
        write_license("tok-0123456789")
    except RuntimeError:
        log.exception("reconciled", reason="Forbidden")
    """
)


def run() -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == ""
    return [json.loads(line) for line in done.stderr.splitlines()]


def test_an_exception_is_logged_as_one_json_line_with_its_frames_and_without_their_locals() -> None:
    [line] = run()
    assert (line["event"], line["reason"], line["level"]) == ("reconciled", "Forbidden", "error")
    [exc] = line["exception"]
    assert exc["exc_type"] == "RuntimeError"
    assert "being terminated" in exc["exc_value"]
    assert [f["name"] for f in exc["frames"]] == ["<module>", "write_license"]
    assert all("locals" not in frame for frame in exc["frames"])
    assert "tok-0123456789" not in json.dumps(line)


def test_an_unknown_level_is_refused_by_name() -> None:
    from gpuoperator.runtime import logs

    with pytest.raises(ValueError, match="--log-level: 'loud' is not one of debug"):
        logs.configure("json", "loud")


LEVELS = textwrap.dedent(
    """
    import structlog.stdlib

    seen = []
    counted = structlog.stdlib.add_log_level

    def counting(logger, method, event):
        seen.append(event["event"])
        return counted(logger, method, event)

    structlog.stdlib.add_log_level = counting
    from gpuoperator.runtime import logs

    logs.configure("json", "info")
    log = structlog.get_logger("demo")
    log.debug("reconciled", result="success")
    log.info("claim bound", reason="Bound")
    print(" ".join(seen))
    """
)


def test_a_line_below_the_level_is_dropped_before_the_processors_run() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEVELS], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["claim", "bound"]
    [line] = [json.loads(text) for text in done.stderr.splitlines()]
    assert (line["event"], line["reason"], line["level"]) == ("claim bound", "Bound", "info")
