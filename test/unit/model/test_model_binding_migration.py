"""A live migration's target follows docs/design.md §5 "Live migration": one node for all the
VM's claims, by the binding rules (eligible, free units, not refused, never the source), in
``placementPolicy`` order, never into what older waiting claims keep (their bindings and
their nomination), before younger ones."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuoperator.model import binding, capacity
from harness import objects

Obj = dict[str, Any]
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
V = objects.gpuclass("v", mode="vgpu", resource="nvidia.com/NVIDIA_A10-4Q")
RES = "nvidia.com/NVIDIA_A10-4Q"


def at(second: int) -> str:
    return f"2026-01-01T11:00:{second:02d}Z"


def vm_claim(name: str = "c", count: int = 1, *, created: int = 30, **status: Any) -> Obj:
    return objects.claim(
        name,
        class_name="v",
        count=count,
        phase="Bound",
        node="src",
        created=at(created),
        status=status or None,
    )


def waiting(name: str, count: int, created: int) -> Obj:
    return objects.claim(name, class_name="v", count=count, phase="Pending", created=at(created))


def world(
    frees: dict[str, int], cordoned: set[str], used: dict[str, int]
) -> tuple[capacity.Ledger, list[Obj]]:
    """Nodes with ``frees`` units free, ``used`` more held by other claims."""
    ledger = capacity.Ledger()
    nodes = [
        objects.node(n, {RES: units + used.get(n, 0)}, cordoned=n in cordoned)
        for n, units in frees.items()
    ]
    for obj in nodes:
        ledger.set_node(obj)
    for name, units in used.items():
        ledger.set_claim(objects.claim(f"other-{name}", count=units, phase="Bound", node=name), RES)
    return ledger, nodes


def target(
    migrating: list[Obj],
    frees: dict[str, int],
    *,
    queue: list[Obj] = (),  # type: ignore[assignment]
    policy: binding.Policy = "binpack",
    cordoned: set[str] = frozenset(),  # type: ignore[assignment]
    used: dict[str, int] | None = None,
) -> binding.MigrationTarget | binding.NoMigrationTarget:
    ledger, nodes = world(frees, cordoned, used or {})
    older = binding.older_waiting(queue, migrating)
    plan = binding.plan(older, V, nodes, ledger, policy, NOW)
    kept = {"v": binding.kept_by(plan, older)}
    return binding.migration_target(
        migrating, {"v": V}, nodes, ledger, policy, NOW, source="src", kept=kept
    )


@pytest.mark.parametrize(
    ("policy", "chosen"), [pytest.param("binpack", "small", id="binpack"), ("spread", "big")]
)
def test_the_placement_policy_picks_among_the_nodes_that_fit(policy: str, chosen: str) -> None:
    found = target([vm_claim()], {"src": 8, "small": 1, "big": 4}, policy=policy)  # type: ignore[arg-type]
    assert found == binding.MigrationTarget(chosen)


def test_never_the_source_however_much_it_has_free() -> None:
    found = target([vm_claim()], {"src": 8})
    assert isinstance(found, binding.NoMigrationTarget)
    assert "1 unit of nvidia.com/NVIDIA_A10-4Q" in found.message
    assert "class v" in found.message
    assert "source src" in found.message


def test_ineligible_and_refused_nodes_are_passed_over() -> None:
    refused = [{"nodeName": "refuser", "until": "2026-01-01T13:00:00Z"}]
    found = target(
        [vm_claim(refusedNodes=refused)],
        {"src": 0, "refuser": 1, "cordoned": 1, "ok": 4},
        cordoned={"cordoned"},
    )
    assert found == binding.MigrationTarget("ok")


def test_all_the_vms_claims_go_to_one_node_with_room_for_all() -> None:
    found = target([vm_claim("a"), vm_claim("b")], {"src": 0, "one": 1, "two": 2})
    assert found == binding.MigrationTarget("two")


def test_an_older_waiting_claims_nomination_keeps_its_node() -> None:
    # The older claim needs 3 and fits nowhere: it nominates "near" (2 free of 4, 1 missing).
    older = waiting("older", 3, created=10)
    frees = {"src": 0, "near": 2, "far": 1}
    found = target([vm_claim(created=30)], frees, queue=[older], used={"near": 2}, policy="spread")
    assert found == binding.MigrationTarget("far")
    alone = target([vm_claim(created=30)], {"src": 0, "near": 2}, queue=[older], used={"near": 2})
    assert isinstance(alone, binding.NoMigrationTarget)
    assert "kept for older waiting claims" in alone.message and "near" in alone.message


def test_a_younger_waiting_claims_nomination_keeps_nothing_from_a_migration() -> None:
    younger = waiting("younger", 3, created=50)
    found = target([vm_claim(created=30)], {"src": 0, "near": 2}, queue=[younger], used={"near": 2})
    assert found == binding.MigrationTarget("near")


def test_the_units_an_older_waiting_claim_is_about_to_be_bound_to_are_not_given_away() -> None:
    older = waiting("older", 1, created=10)
    found = target([vm_claim(created=30)], {"src": 0, "one": 1}, queue=[older])
    assert isinstance(found, binding.NoMigrationTarget)
    found = target([vm_claim(created=30)], {"src": 0, "one": 1, "two": 2}, queue=[older])
    # binpack: the older claim takes "one"; the migration gets "two".
    assert found == binding.MigrationTarget("two")


def test_older_is_judged_against_the_youngest_migrating_claim() -> None:
    between = waiting("between", 3, created=20)
    found = target(
        [vm_claim("a", created=10), vm_claim("b", created=30)],
        {"src": 0, "near": 2, "far": 2},
        queue=[between],
        used={"near": 2},
    )
    # "between" is older than claim b: its nomination (near: 1 missing) keeps that node.
    assert found == binding.MigrationTarget("far")
