"""`make help` is generated from the Makefile (a `## text` on each rule line) and lists every
public target, so a target added without its line shows up here rather than nowhere."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

#: .PHONY targets that are steps of other targets rather than entry points (none today).
INTERNAL: frozenset[str] = frozenset()


def phony_targets() -> set[str]:
    text = REPO.joinpath("Makefile").read_text()
    return {t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()}


def help_lines() -> dict[str, str]:
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    # The venv variables point at the running interpreter's environment and -s keeps make
    # quiet: `make help` must print its list without building or installing anything.
    venv = Path(sys.prefix)
    proc = subprocess.run(
        [make, "-s", "-C", str(REPO), "help", f"VENV={venv}", f"BIN={venv / 'bin'}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^  (\S+)\s+(\S.*)$", line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} is listed twice"
            out[m.group(1)] = m.group(2)
    return out


def test_make_help_lists_every_public_target_with_its_text() -> None:
    listed = help_lines()
    missing = phony_targets() - INTERNAL - set(listed)
    assert not missing, f"targets without a `## text` on their rule line: {sorted(missing)}"


def test_make_help_lists_only_phony_targets() -> None:
    assert set(help_lines()) <= phony_targets()
