"""`hack/build-tools.sh` builds a tool once into the cache even when two callers ask at the
same moment (two makes, a test run beside a bench): the second waits for the first and
returns the cached binary instead of racing it for the same temporary file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "build-tools.sh"


def test_two_concurrent_builds_of_a_tool_both_succeed(tmp_path: Path) -> None:
    assert shutil.which("go") is not None, "Go is not installed"
    env = {**os.environ, "GPUOP_CACHE": str(tmp_path / "cache")}
    builds = [
        subprocess.Popen(
            ["bash", str(SCRIPT), "nullwebhook"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = [(b.wait(timeout=300), *b.communicate()) for b in builds]
    for rc, _out, err in results:
        assert rc == 0, err
    paths = {out.strip().splitlines()[-1] for _, out, _ in results}
    assert len(paths) == 1, paths
    built = Path(paths.pop())
    assert os.access(built, os.X_OK)
    # exactly one of the two built it; the other found it cached
    assert sum("built" in err for _, _, err in results) == 1, [err for *_, err in results]
    assert not list(built.parent.glob("*.tmp"))
