"""Binding claims of a DRA class (docs/design.md §5 "Binding", "DRA classes"): the plan's
rules on the class's free devices per eligible node, then the devices each binding takes.
Figures are counted by the test from the devices it lays out."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import binding, capacity, dra_devices, dra_holds
from harness import objects

Obj = dict[str, Any]
DRIVER = "gpu.example.com"
NOW = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
CLASS = objects.gpuclass(
    "dra-a10",
    source={"dra": {"deviceClassName": "a10.example.com", "topologyAttribute": "pcieRoot"}},
)


def inventory(layout: dict[str, list[tuple[str, bool]]]) -> dra_devices.Inventory:
    """``{node: [(topology, free), …]}``: device ``gpu-<i>`` of each node in order."""
    return dra_devices.Inventory(
        nodes={
            node: dra_devices.NodeDevices(
                node,
                tuple(
                    dra_devices.Device(
                        dra_devices.DeviceRef(DRIVER, node, f"gpu-{i}"), node, root, not free, False
                    )
                    for i, (root, free) in enumerate(devices)
                ),
            )
            for node, devices in layout.items()
        },
        reasons=(),
    )


def claim(name: str, count: int, created: int, **kw: Any) -> Obj:
    return objects.claim(
        name,
        class_name="dra-a10",
        count=count,
        created=f"2026-01-01T00:00:{created:02d}Z",
        uid=f"u-{name}",
        **kw,
    )


def plan(claims: list[Obj], inv: dra_devices.Inventory, nodes: list[Obj], **kw: Any) -> Any:
    return binding.plan(
        claims, CLASS, nodes, capacity.Ledger(), kw.get("policy", "binpack"), NOW, devices=inv
    )


def test_without_an_inventory_a_dra_claim_waits_saying_dra_binding_is_not_built() -> None:
    result = binding.plan(
        [claim("a", 1, 1)], CLASS, [objects.node("n1")], capacity.Ledger(), "binpack", NOW
    )
    assert result.bindings == []
    assert "not built yet" in result.waiting[("tenant-a", "a")].message


def test_claims_bind_by_free_devices_binpack_then_take_disjoint_devices() -> None:
    inv = inventory(
        {
            "n1": [("r0", True)] * 4 + [("r1", True)] * 4,
            "n2": [("r0", True), ("r0", False)],
        }
    )
    nodes = [objects.node("n1"), objects.node("n2")]
    claims = [claim("big", 4, 1), claim("one", 1, 2), claim("two", 2, 3)]
    result = plan(claims, inv, nodes)
    # binpack: "big" only fits n1; "one" takes n2's single free device; "two" goes to n1.
    assert result.bindings == [
        (("tenant-a", "big"), "n1"),
        (("tenant-a", "one"), "n2"),
        (("tenant-a", "two"), "n1"),
    ]
    counts = {gpu["metadata"]["name"]: gpu["spec"]["count"] for gpu in claims}
    taken = dra_holds.assign([(key, node, counts[key[1]]) for key, node in result.bindings], inv)
    assert [r.device for r in taken[("tenant-a", "big")]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [r.device for r in taken[("tenant-a", "two")]] == ["gpu-4", "gpu-5"]
    assert [r.device for r in taken[("tenant-a", "one")]] == ["gpu-0"]
    assert taken[("tenant-a", "one")][0].pool == "n2"


def test_an_ineligible_node_and_a_refused_node_are_passed_over() -> None:
    inv = inventory({"n1": [("r0", True)] * 2, "n2": [("r0", True)] * 2, "n3": [("r0", True)]})
    nodes = [objects.node("n1", cordoned=True), objects.node("n2"), objects.node("n3")]
    refused = {"refusedNodes": [{"nodeName": "n2", "until": "2026-01-01T13:00:00Z"}]}
    result = plan([claim("a", 1, 1, status=refused)], inv, nodes)
    assert result.bindings == [(("tenant-a", "a"), "n3")]


def test_a_claim_that_fits_nowhere_nominates_and_says_what_it_waits_for_in_devices() -> None:
    inv = inventory({"n1": [("r0", True), ("r0", False), ("r0", False)], "n2": [("r0", True)]})
    nodes = [objects.node("n1"), objects.node("n2")]
    result = plan([claim("big", 3, 1), claim("small", 1, 2)], inv, nodes)
    assert result.nomination is not None and result.nomination.node == "n1"
    # The younger claim backfills n2, not the units kept on n1.
    assert result.bindings == [(("tenant-a", "small"), "n2")]
    message = result.waiting[("tenant-a", "big")].message
    assert "3 free units of DeviceClass a10.example.com" in message
    assert "most free on one node: 1" in message


def test_a_claim_larger_than_any_node_even_empty_says_so() -> None:
    inv = inventory({"n1": [("r0", False), ("r0", True)]})
    result = plan([claim("big", 3, 1)], inv, [objects.node("n1")])
    assert (
        "even when empty (the most on one node: 2)" in result.waiting[("tenant-a", "big")].message
    )
    assert result.nomination is None


layouts = st.dictionaries(
    st.sampled_from(["n1", "n2", "n3"]),
    st.lists(st.tuples(st.sampled_from(["r0", "r1"]), st.booleans()), max_size=6),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(layouts, st.lists(st.integers(min_value=1, max_value=4), max_size=6), st.booleans())
def test_a_plans_bindings_never_take_a_device_twice_nor_more_than_is_free(
    layout: dict[str, list[tuple[str, bool]]], counts: list[int], spread: bool
) -> None:
    inv = inventory(layout)
    nodes = [objects.node(n) for n in layout]
    claims = [claim(f"c{i}", c, i) for i, c in enumerate(counts)]
    result = plan(claims, inv, nodes, policy="spread" if spread else "binpack")
    count = {("tenant-a", f"c{i}"): c for i, c in enumerate(counts)}
    taken = dra_holds.assign([(k, n, count[k]) for k, n in result.bindings], inv)
    assert set(taken) == {k for k, _ in result.bindings}  # every binding got its devices
    refs = [r for chosen in taken.values() for r in chosen]
    assert len(refs) == len(set(refs))
    free = {(DRIVER, n, f"gpu-{i}") for n, ds in layout.items() for i, (_, f) in enumerate(ds) if f}
    assert {tuple(r) for r in refs} <= free
    for key, node in result.bindings:
        assert len(taken[key]) == count[key] and {r.pool for r in taken[key]} == {node}


def test_no_node_is_a_candidate_for_moving_a_dra_claim() -> None:
    """Moves (draining, placement's gathering) are not built for DRA claims: they find no
    candidate node, so a DRA claim stays where its devices are (docs/design.md §5)."""
    bound = claim("a", 1, 1, phase="Bound", node="n1")
    nodes = [objects.node("n1"), objects.node("n2")]
    assert binding.candidates(bound, CLASS, nodes, capacity.Ledger(), NOW) == []
