"""The bench suite's P4 sizes: the forms' sizes and targets, and the units per node that hold
every claim and GPU pod a size generates."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

#: Loaded by name: the suite is a script of the bench tools (``hack/bench``), not checked
#: as part of the package's typed code.
suite: Any = importlib.import_module("bench.suite")


def test_five_thousand_nodes_of_eight_hold_the_full_form() -> None:
    assert suite.units_per_node(5000, 40_000, 10_000, 20) == 8


def test_fifty_thousand_claims_get_more_units_than_eight_per_node() -> None:
    units = suite.units_per_node(5000, 150_000, 50_000, 50)
    assert units % 8 == 0
    assert 5000 * units >= 50_000 + 150_000 // 50
    assert units == 16


@pytest.mark.parametrize(
    ("argv", "size", "targets"),
    [
        ([], (500, 4000, 1000, 20), (400.0, 15.0)),
        (["--full"], (5000, 40_000, 10_000, 20), (400.0, 15.0)),
        (["--scale"], (5000, 150_000, 50_000, 50), (800.0, 30.0)),
    ],
)
def test_each_form_runs_p4_at_its_size_against_its_targets(
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    size: tuple[int, int, int, int],
    targets: tuple[float, float],
) -> None:
    seen: list[tuple[tuple[int, int, int, int], tuple[float, float], str]] = []

    def run_big(args: object, rows: object, notes: object) -> None:
        a = vars(args)
        shape = (a["big_nodes"], a["big_pods"], a["big_claims"], a["gpu_every"])
        seen.append((shape, a["p4_targets"], suite.p4_size(args)))

    monkeypatch.setattr(suite, "run_big", run_big)
    assert suite.main(["--only", "P4", *argv]) == 0
    ((shape, got_targets, label),) = seen
    assert shape == size
    assert got_targets == targets
    assert label == f"{size[0]} nodes, {size[1]} pods, {size[2]} claims"
