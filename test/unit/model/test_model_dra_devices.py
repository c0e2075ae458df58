"""The devices of a DRA class per node, from hand-made ResourceSlices, a DeviceClass and
ResourceClaims' allocations (docs/design.md §5 "DRA classes"). The oracle is counting what
the test itself generated, never the module's own walk of the slices."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import dra_devices

Obj = dict[str, Any]
DRIVER = "gpu.example.com"
A10_SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "A10"'


def device(name: str, model: str = "A10", *, root: str = "pci0", taint: str | None = None) -> Obj:
    obj: Obj = {
        "name": name,
        "attributes": {
            "model": {"string": model},
            f"{DRIVER}/pcieRoot": {"string": root},
            "numa": {"int": 0},
        },
        "capacity": {"memory": {"value": "24Gi"}},
    }
    if taint is not None:
        obj["taints"] = [{"key": "gpu.example.com/unhealthy", "effect": taint}]
    return obj


def slice_of(
    node: str | None,
    devices: list[Obj],
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    name: str | None = None,
    **where: Any,
) -> Obj:
    spec: Obj = {
        "driver": DRIVER,
        "pool": {
            "name": pool or node or "shared",
            "generation": generation,
            "resourceSliceCount": count,
        },
        "devices": devices,
        **where,
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name or f"{node}-{DRIVER}-{generation}"}, "spec": spec}


def device_class(*expressions: str) -> Obj:
    return {
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


def allocated(*refs: tuple[str, str, str]) -> Obj:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": d, "pool": p, "device": n} for d, p, n in refs
                    ]
                }
            }
        }
    }


def free_counts(inv: dra_devices.Inventory) -> dict[str, int]:
    return {node: view.free for node, view in inv.nodes.items()}


def test_the_kubernetes_selector_shape_picks_the_model() -> None:
    slices = [slice_of("n1", [device("gpu-0"), device("gpu-1", "L40S"), device("gpu-2")])]
    inv = dra_devices.inventory(slices, device_class(A10_SELECTOR), [])
    assert [d.ref.device for d in inv.nodes["n1"].devices] == ["gpu-0", "gpu-2"]
    assert inv.free == 2 and inv.reasons == ()


def test_an_allocation_and_a_blocking_taint_take_a_device_but_prefer_no_schedule_does_not() -> None:
    slices = [
        slice_of(
            "n1",
            [
                device("gpu-0"),
                device("gpu-1", taint="NoSchedule"),
                device("gpu-2", taint="NoExecute"),
                device("gpu-3", taint="PreferNoSchedule"),
                device("gpu-4"),
            ],
        )
    ]
    claims = [allocated((DRIVER, "n1", "gpu-0")), {"status": {}}, {}]
    inv = dra_devices.inventory(slices, device_class(A10_SELECTOR), claims)
    assert sorted(d.ref.device for d in inv.nodes["n1"].devices if d.free) == ["gpu-3", "gpu-4"]
    held = [d.ref.device for d in inv.nodes["n1"].devices if d.held]
    assert held == ["gpu-0"]


def test_a_class_without_selectors_takes_every_device() -> None:
    slices = [slice_of("n1", [device("a"), device("b", "L40S")])]
    assert dra_devices.inventory(slices, {"spec": {}}, []).free == 2


def test_topology_values_are_counted_per_value_with_a_bare_name_in_the_driver_domain() -> None:
    slices = [
        slice_of("n1", [device("a", root="r0"), device("b", root="r0"), device("c", root="r1")])
    ]
    claims = [allocated((DRIVER, "n1", "a"))]
    for attribute in (f"{DRIVER}/pcieRoot", "pcieRoot"):
        inv = dra_devices.inventory(slices, {}, claims, topology_attribute=attribute)
        assert inv.nodes["n1"].free_by_topology() == {"r0": 1, "r1": 1}
    inv = dra_devices.inventory(slices, {}, claims, topology_attribute="other.com/pcieRoot")
    assert inv.nodes["n1"].free_by_topology() == {None: 2}
    numa = dra_devices.inventory(slices, {}, [], topology_attribute="numa")
    assert numa.nodes["n1"].free_by_topology() == {"0": 3}


def test_only_the_newest_complete_generation_of_a_pool_counts() -> None:
    old = slice_of("n1", [device("a"), device("b")], generation=1)
    new = slice_of("n1", [device("a")], generation=2)
    assert free_counts(dra_devices.inventory([old, new], {}, [])) == {"n1": 1}
    half = slice_of("n1", [device("a")], generation=3, count=2, name="n1-part-0")
    inv = dra_devices.inventory([old, new, half], {}, [])
    assert inv.nodes == {}
    assert any("1 of 2 ResourceSlices" in r and f"{DRIVER}/n1" in r for r in inv.reasons)
    other = slice_of("n1", [device("b")], generation=3, count=2, name="n1-part-1")
    assert free_counts(dra_devices.inventory([old, half, other], {}, [])) == {"n1": 2}


def test_slices_not_local_to_one_node_are_left_out_with_a_reason() -> None:
    shared = slice_of(None, [device("a")], pool="fabric", allNodes=True, name="fabric-0")
    inv = dra_devices.inventory([shared, slice_of("n1", [device("b")])], {}, [])
    assert free_counts(inv) == {"n1": 1}
    assert any("fabric-0" in r and "not local to one node" in r for r in inv.reasons)


def test_an_unknown_attribute_domain_reads_as_an_empty_map() -> None:
    slices = [slice_of("n1", [device("a")])]
    guarded = device_class('"model" in device.attributes["other.com"]')
    inv = dra_devices.inventory(slices, guarded, [])
    assert inv.free == 0 and inv.reasons == ()


def test_a_selector_that_fails_to_evaluate_matches_nothing_and_says_why() -> None:
    slices = [slice_of("n1", [device("a"), device("b")])]
    missing = device_class(f'device.attributes["{DRIVER}"].vendor == "nvidia"')
    inv = dra_devices.inventory(slices, missing, [])
    assert inv.free == 0
    (reason,) = inv.reasons
    for fragment in ("spec.selectors[0]", "failed to evaluate", f"{DRIVER}/a", "vendor"):
        assert fragment in reason, reason
    not_bool = dra_devices.inventory(slices, device_class("device.driver"), [])
    assert not_bool.free == 0 and "returned" in not_bool.reasons[0]


def test_quantity_is_out_of_scope_and_says_so() -> None:
    slices = [slice_of("n1", [device("a")])]
    cls = device_class(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0')
    inv = dra_devices.inventory(slices, cls, [])
    assert inv.free == 0
    (reason,) = inv.reasons
    assert "undeclared reference" in reason and "quantity()" in reason, reason
    assert len(reason) < 400, "celpy's activation dump is left out"


def test_a_selector_that_does_not_compile_matches_nothing_and_says_why() -> None:
    slices = [slice_of("n1", [device("a")])]
    inv = dra_devices.inventory(slices, device_class("device.driver =="), [])
    assert inv.free == 0
    assert "does not compile" in inv.reasons[0] and "spec.selectors[0]" in inv.reasons[0]


def test_evaluating_selectors_leaves_the_recursion_limit_alone() -> None:
    import sys

    dra_devices._environment.cache_clear()  # so this test makes the environment anew
    limit = sys.getrecursionlimit()
    dra_devices.inventory([slice_of("n1", [device("a")])], device_class(A10_SELECTOR), [])
    assert sys.getrecursionlimit() == limit


MODELS = ("A10", "L40S")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(MODELS), st.booleans(), st.booleans()),
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_free_is_the_matching_devices_less_the_held_and_tainted(
    nodes: list[list[tuple[str, bool, bool]]],
) -> None:
    slices, claims, expected = [], [], {}
    for i, devices in enumerate(nodes):
        node = f"n{i}"
        made = [
            device(f"gpu-{j}", model, taint="NoSchedule" if tainted else None)
            for j, (model, _, tainted) in enumerate(devices)
        ]
        slices.append(slice_of(node, made))
        claims += [
            allocated((DRIVER, node, f"gpu-{j}")) for j, (_, h, _) in enumerate(devices) if h
        ]
        matching = [d for d in devices if d[0] == "A10"]
        if matching:
            expected[node] = sum(1 for _, held, tainted in matching if not held and not tainted)
    inv = dra_devices.inventory(slices, device_class(A10_SELECTOR), claims)
    assert free_counts(inv) == expected


def test_a_stored_slice_version_is_judged_by_the_selectors_once_and_a_new_one_again(
    monkeypatch: Any,
) -> None:
    """Evaluating CEL is the inventory's cost (about a millisecond per device), and the
    inventory is computed on every binder pass: a slice version the API server stored (uid
    and resourceVersion) is judged once per DeviceClass's expressions, with the same
    figures; a new version, other expressions or an unstored slice are judged anew."""
    evaluated: list[str] = []
    real = dra_devices._matches

    def counting(compiled: Any, driver: str, dev: Obj, failures: dict[int, str]) -> bool:
        evaluated.append(str(dev.get("name")))
        return real(compiled, driver, dev, failures)

    monkeypatch.setattr(dra_devices, "_matches", counting)
    stored = slice_of("n1", [device("gpu-0"), device("gpu-1", "T4")])
    stored["metadata"] |= {"uid": "uid-judged-once", "resourceVersion": "7"}
    a10 = device_class(A10_SELECTOR)
    first = dra_devices.inventory([stored], a10, [])
    assert evaluated == ["gpu-0", "gpu-1"]
    assert dra_devices.inventory([stored], a10, []) == first
    assert evaluated == ["gpu-0", "gpu-1"]  # not evaluated again
    assert [d.ref.device for d in first.nodes["n1"].devices] == ["gpu-0"]

    newer = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "8"}}
    newer["spec"] = {**stored["spec"], "devices": [device("gpu-0", "T4"), device("gpu-1")]}
    assert [d.ref.device for d in dra_devices.inventory([newer], a10, []).nodes["n1"].devices] == [
        "gpu-1"
    ]
    dra_devices.inventory([stored], device_class(f'device.driver == "{DRIVER}"'), [])
    unstored = slice_of("n1", [device("gpu-0")])
    dra_devices.inventory([unstored], a10, [])
    dra_devices.inventory([unstored], a10, [])
    assert evaluated[2:] == ["gpu-0", "gpu-1", "gpu-0", "gpu-1", "gpu-0", "gpu-0"]


def test_a_remembered_failure_still_gives_its_reason() -> None:
    stored = slice_of("n1", [device("gpu-0")])
    stored["metadata"] |= {"uid": "uid-failing", "resourceVersion": "3"}
    failing = device_class('device.attributes["gpu.example.com"].nothere == "x"')
    first = dra_devices.inventory([stored], failing, [])
    again = dra_devices.inventory([stored], failing, [])
    assert first.reasons and again.reasons == first.reasons
    assert "gpu.example.com/gpu-0" in first.reasons[0]


def taint_rule(effect: str, selector: Obj | None) -> Obj:
    """A DeviceTaintRule (``resource.k8s.io/v1beta2``) with ``selector`` as its
    ``spec.deviceSelector`` (none when ``None``)."""
    spec: Obj = {"taint": {"key": "example.com/maintenance", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": "rule"}, "spec": spec}


def tainted_by(*rules: Obj) -> dict[str, list[str]]:
    slices = [
        slice_of("n1", [device("gpu-0"), device("gpu-1")]),
        slice_of("n2", [device("gpu-0"), device("gpu-1")]),
    ]
    inv = dra_devices.inventory(slices, device_class(A10_SELECTOR), [], taint_rules=rules)
    return {n: [d.ref.device for d in v.devices if d.tainted] for n, v in inv.nodes.items()}


def test_a_device_taint_rule_taints_the_devices_its_selector_selects() -> None:
    one = {"driver": DRIVER, "pool": "n1", "device": "gpu-1"}
    assert tainted_by(taint_rule("NoSchedule", one)) == {"n1": ["gpu-1"], "n2": []}
    assert tainted_by(taint_rule("NoExecute", {"pool": "n2"})) == {
        "n1": [],
        "n2": ["gpu-0", "gpu-1"],
    }
    assert tainted_by(taint_rule("NoSchedule", {"device": "gpu-0"})) == {
        "n1": ["gpu-0"],
        "n2": ["gpu-0"],
    }
    # The empty selector selects every device; a rule without one selects none.
    assert tainted_by(taint_rule("NoSchedule", {})) == {
        "n1": ["gpu-0", "gpu-1"],
        "n2": ["gpu-0", "gpu-1"],
    }
    assert tainted_by(taint_rule("NoSchedule", None)) == {"n1": [], "n2": []}


def test_a_rule_of_another_driver_or_a_non_blocking_effect_taints_nothing() -> None:
    assert tainted_by(taint_rule("NoSchedule", {"driver": "other.example.com"})) == {
        "n1": [],
        "n2": [],
    }
    assert tainted_by(taint_rule("None", {}), taint_rule("PreferNoSchedule", {})) == {
        "n1": [],
        "n2": [],
    }
