"""Device health of DRA holds (docs/design.md §5 "DRA classes"): which held devices are
unhealthy and why, which claims are movable or serve a VM, and where a movable one goes
(its own healthy devices count free for it; refused and ineligible nodes are passed over).
The oracle is the hand-written slices and claims."""

from __future__ import annotations

import datetime
from typing import Any

from gpuoperator.model import claim_states, conditions, dra_devices, dra_health, dra_holds
from gpuoperator.model.draining import Role
from harness import objects

Obj = dict[str, Any]
DRIVER = objects.DRA_DRIVER
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
ALL = {"metadata": {"name": "all.example.com"}, "spec": {}}
CLASS = objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "all.example.com"}})


def ref(device: str, node: str = "n1") -> dra_devices.DeviceRef:
    return dra_devices.DeviceRef(DRIVER, node, device)


def slice_of(node: str, devices: list[str], tainted: tuple[str, ...] = ()) -> Obj:
    obj = objects.resource_slice(node, {d: {} for d in devices})
    for d in obj["spec"]["devices"]:
        if d["name"] in tainted:
            d["taints"] = [{"key": "bad", "effect": "NoExecute"}]
    return obj


def bound(name: str, *devices: str, node: str = "n1", **status: Any) -> Obj:
    base = objects.claim(name, namespace="t", class_name="dra-a10", count=len(devices))
    state = claim_states.dra_bound(base, node, name, [ref(d, node) for d in devices], NOW)
    return {**base, "status": {**state, **status}}


def inventory(*slices: Obj, claims: tuple[Obj, ...] = ()) -> dra_devices.Inventory:
    found = dra_devices.inventory(slices, ALL, [])
    return dra_holds.counted_inventory(found, dra_holds.claimed(claims))


def test_tainted_and_vanished_devices_are_unhealthy_and_an_incomplete_pool_says_nothing() -> None:
    claim = bound("c", "gpu-0", "gpu-1", "gpu-2")
    inv = inventory(slice_of("n1", ["gpu-0", "gpu-1"], tainted=("gpu-1",)), claims=(claim,))
    assert dra_health.bad_devices(claim, inv) == (
        (ref("gpu-1"), dra_health.TAINTED),
        (ref("gpu-2"), dra_health.GONE),
    )
    partial = slice_of("n1", ["gpu-0"])
    partial["spec"]["pool"]["resourceSliceCount"] = 2
    assert dra_health.bad_devices(claim, inventory(partial)) == ()
    assert dra_health.bad_devices(bound("p", "gpu-0", node="n9"), inv) == ()  # pool absent


def test_an_idle_claim_is_movable_and_an_attached_one_blocks() -> None:
    idle = bound("idle", "gpu-0")
    serving = bound("serving", "gpu-1", attachment={"vmi": "vm", "uid": "u"})
    healthy = bound("healthy", "gpu-2")
    inv = inventory(
        slice_of("n1", ["gpu-0", "gpu-1", "gpu-2"], tainted=("gpu-0", "gpu-1")),
        claims=(idle, serving, healthy),
    )
    sick = dra_health.sick_holds([serving, idle, healthy], inv, {})
    assert [(s.key[1], s.role, s.cause) for s in sick] == [
        ("idle", Role.MOVABLE, dra_health.TAINTED),
        ("serving", Role.BLOCKING, dra_health.TAINTED),
    ]
    assert "t/vm" in dra_health.serving_message(sick[1])


def test_a_move_keeps_the_claims_healthy_devices_when_its_node_has_room() -> None:
    claim = bound("pair", "gpu-0", "gpu-1")
    inv = inventory(
        slice_of("n1", ["gpu-0", "gpu-1", "gpu-2"], tainted=("gpu-0",)),
        slice_of("n2", ["gpu-0", "gpu-1", "gpu-2"]),
        claims=(claim,),
    )
    nodes = [objects.node("n1", {}), objects.node("n2", {})]
    # binpack: n1 has 2 for this claim (its own gpu-1 and the free gpu-2), n2 has 3.
    assert dra_health.move_target(claim, CLASS, nodes, inv, "binpack", NOW) == (
        "n1",
        (ref("gpu-1"), ref("gpu-2")),
    )
    assert dra_health.move_target(claim, CLASS, nodes, inv, "spread", NOW) == (
        "n2",
        (ref("gpu-0", "n2"), ref("gpu-1", "n2")),
    )
    # A cordoned n2 and no room left on n1: nowhere.
    crowded = inventory(
        slice_of("n1", ["gpu-0", "gpu-1"], tainted=("gpu-0",)),
        slice_of("n2", ["gpu-0", "gpu-1", "gpu-2"]),
        claims=(claim,),
    )
    cordoned = [objects.node("n1", {}), objects.node("n2", {}, cordoned=True)]
    assert dra_health.move_target(claim, CLASS, cordoned, crowded, "binpack", NOW) is None


def test_a_refused_node_is_passed_over() -> None:
    until = conditions.stamp(NOW + datetime.timedelta(minutes=5))
    claim = bound("c", "gpu-0", refusedNodes=[{"nodeName": "n2", "until": until}])
    inv = inventory(
        slice_of("n1", ["gpu-0"], tainted=("gpu-0",)), slice_of("n2", ["gpu-0"]), claims=(claim,)
    )
    nodes = [objects.node("n1", {}), objects.node("n2", {})]
    assert dra_health.move_target(claim, CLASS, nodes, inv, "binpack", NOW) is None
