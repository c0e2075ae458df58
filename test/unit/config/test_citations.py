"""Code, manifests and docs cite the behaviour contract as it is in the repository,
``docs/design.md §n``, and say what a thing is instead of citing an issue number: a reader
can open neither the old contract file at the top of the tree (it is not in the repository)
nor an issue tracker.

Every tracked file is checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Built in pieces so that this file does not match itself.
STALE = re.compile(
    "|".join(
        (
            r"\b" + "DES" + "IGN" + r"(\.md)?\b",
            r"\b[Dd]esign " + "card" + r"s?\b",
            r"\b[Ii]ssues? " + r"#?[0-9]+",
        )
    )
)


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_cites_a_contract_or_an_issue_that_is_not_in_the_repository() -> None:
    stale = []
    for path in _tracked():
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary, or deleted in the work tree
        for number, line in enumerate(text.splitlines(), 1):
            if STALE.search(line):
                stale.append(f"{path}:{number}: {line.strip()}")
    assert not stale, "cite docs/design.md §n, or say what it is:\n" + "\n".join(stale)
