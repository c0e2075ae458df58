"""The ledger's DRA figures (docs/design.md §5 "DRA classes"): a DRA class's devices per
node from the cached ResourceSlices, DeviceClass and ResourceClaims, with an assumed bind
holding its devices before its allocation is watched, and each device held once."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuoperator.ledger import Ledger
from gpuoperator.model import capacity, claim_states, dra_devices, dra_holds
from gpuoperator.runtime.informing import Handlers
from harness import objects

Obj = dict[str, Any]
DRIVER = objects.DRA_DRIVER
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def slice_of(node: str, *devices: str) -> Obj:
    return objects.resource_slice(node, {d: {"model": {"string": "A10"}} for d in devices})


def ref(device: str, node: str = "n1") -> dra_devices.DeviceRef:
    return dra_devices.DeviceRef(DRIVER, node, device)


def world() -> tuple[Ledger, list[Obj]]:
    ledger = Ledger()
    notices: list[Obj] = []
    ledger.changes.add_handlers(Handlers(on_add=notices.append))
    ledger.apply_class(
        objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "a10.example.com"}})
    )
    ledger.apply_class(objects.gpuclass("a10"))
    ledger.apply_device_class(
        {
            "metadata": {"name": "a10.example.com"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    ledger.apply_resource_slice(slice_of("n1", "gpu-0", "gpu-1", "gpu-2"))
    ledger.apply_resource_slice(slice_of("n2", "gpu-0"))
    return ledger, notices


def free(ledger: Ledger) -> dict[str, int]:
    inv = ledger.dra_inventory("dra-a10")
    assert inv is not None
    return {node: view.free for node, view in inv.nodes.items()}


def dra_claim(rv: int, *devices: str, uid: str = "u-1") -> Obj:
    """t/hold of the DRA class at ``rv``: Bound on n1 holding ``devices``, else Pending."""
    base = objects.claim(namespace="t", class_name="dra-a10", rv=rv, uid=uid, status={})
    if not devices:
        return {**base, "status": {"phase": "Pending"}}
    name = dra_holds.resource_claim_name(base)
    held = [ref(d) for d in devices]
    return {**base, "status": claim_states.dra_bound(base, "n1", name, held, NOW)}


def test_a_dra_class_counts_the_devices_of_its_device_class_and_others_have_none() -> None:
    ledger, _ = world()
    assert free(ledger) == {"n1": 3, "n2": 1}
    assert ledger.dra_inventory("a10") is None  # a device-plugin class
    assert ledger.dra_inventory("missing") is None
    ledger.delete_device_class({"metadata": {"name": "a10.example.com"}})
    inv = ledger.dra_inventory("dra-a10")
    assert inv is not None and inv.nodes == {}
    assert inv.reasons == ("DeviceClass a10.example.com not found",)


def test_an_assumed_bind_holds_its_devices_until_forgotten() -> None:
    ledger, _ = world()
    ledger.apply_claim(dra_claim(10))
    ledger.assume(dra_claim(10, "gpu-1", "gpu-2"))
    assert free(ledger) == {"n1": 1, "n2": 1}
    inv = ledger.dra_inventory("dra-a10")
    assert inv is not None
    assert dra_holds.choose(inv.nodes["n1"], 1) == (ref("gpu-0"),)
    ledger.forget(("t", "hold"))
    assert free(ledger) == {"n1": 3, "n2": 1}


def test_a_device_the_claim_and_its_allocation_both_name_is_held_once() -> None:
    ledger, _ = world()
    ledger.apply_claim(dra_claim(10))
    ledger.assume(dra_claim(10, "gpu-1"))
    hold = dra_holds.resource_claim(dra_claim(10), "a10.example.com", 1)
    hold["status"] = dra_holds.allocation([ref("gpu-1")], "n1", NOW)
    ledger.apply_resource_claim(hold)
    assert free(ledger) == {"n1": 2, "n2": 1}
    ledger.apply_claim(dra_claim(11, "gpu-1"))  # the watch supersedes the assumption
    assert free(ledger) == {"n1": 2, "n2": 1}
    # The claim is gone, its ResourceClaim not yet collected: the allocation still holds it.
    ledger.delete_claim(dra_claim(11, "gpu-1"))
    assert free(ledger) == {"n1": 2, "n2": 1}
    ledger.delete_resource_claim(hold)
    assert free(ledger) == {"n1": 3, "n2": 1}


def test_a_device_some_other_allocation_holds_is_used_whoever_wrote_it() -> None:
    ledger, _ = world()
    tenants = {
        "metadata": {"namespace": "t", "name": "own"},
        "status": dra_holds.allocation([ref("gpu-0", "n2")], "n2", NOW),
    }
    ledger.apply_resource_claim(tenants)
    assert free(ledger) == {"n1": 3, "n2": 0}


def test_a_dra_change_names_the_slices_node_and_every_dra_class() -> None:
    ledger, notices = world()
    notices.clear()
    ledger.apply_resource_slice(slice_of("n2", "gpu-0", "gpu-1"))
    assert notices == [{"nodes": ["n2"], "classes": ["dra-a10"]}]
    notices.clear()
    ledger.apply_resource_claim({"metadata": {"namespace": "t", "name": "own"}})
    assert notices == [{"nodes": [], "classes": ["dra-a10"]}]


def test_a_dra_class_publishes_its_free_devices_on_eligible_nodes_as_its_figures() -> None:
    ledger, _ = world()
    ledger.apply_node(objects.node("n1"))
    ledger.apply_node(objects.node("n2"))
    assert ledger.class_figures("dra-a10") == capacity.ClassFigures(4, 3, 2)
    assert ledger.class_allocatable("dra-a10") == 4
    # An assumed bind takes two of n1's; a tainted device is neither free nor allocatable.
    ledger.apply_claim(dra_claim(10))
    ledger.assume(dra_claim(10, "gpu-0", "gpu-1"))
    tainted = slice_of("n1", "gpu-0", "gpu-1", "gpu-2")
    tainted["spec"]["devices"][2]["taints"] = [{"key": "bad", "effect": "NoSchedule"}]
    ledger.apply_resource_slice(tainted)
    assert ledger.class_figures("dra-a10") == capacity.ClassFigures(1, 1, 2)
    assert ledger.largest_allocatable("dra-a10") == 2
    # A cordoned node serves nothing.
    ledger.apply_node(objects.node("n2", cordoned=True))
    assert ledger.class_figures("dra-a10") == capacity.ClassFigures(0, 0, 1)
    # A device-plugin class keeps the catalog's figures (4 A10 units on n1; n2 is cordoned).
    assert ledger.class_figures("a10") == capacity.ClassFigures(4, 4, 1)  # n1 only


def test_an_allocation_names_its_node_and_a_device_class_change_names_every_node() -> None:
    ledger, notices = world()
    ledger.apply_node(objects.node("n1"))
    ledger.apply_node(objects.node("n2"))
    hold = {
        "metadata": {"namespace": "t", "name": "own"},
        "status": dra_holds.allocation([ref("gpu-0", "n2")], "n2", NOW),
    }
    notices.clear()
    ledger.apply_resource_claim(hold)
    assert notices == [{"nodes": ["n2"], "classes": ["dra-a10"]}]
    notices.clear()
    ledger.delete_resource_claim(hold)  # the node it held devices on is told it freed them
    assert notices == [{"nodes": ["n2"], "classes": ["dra-a10"]}]
    notices.clear()
    ledger.apply_device_class({"metadata": {"name": "a10.example.com"}, "spec": {}})
    assert notices == [{"nodes": ["n1", "n2"], "classes": ["dra-a10"]}]


def test_a_node_view_lists_its_dra_devices_with_held_and_tainted_ones_and_follows_changes() -> None:
    ledger, _ = world()
    ledger.apply_node(objects.node("n3", {}))  # no GPU resource, no device: no view
    assert ledger.node("n3") is None
    ledger.apply_node(objects.node("n2", {}))  # no GPU resource, but a DRA device
    view = ledger.node("n2")
    assert view is not None and view.devices == []
    assert view.dra == [
        {
            "name": "dra-a10",
            "deviceClassName": "a10.example.com",
            "count": 1,
            "allocated": 0,
            "tainted": 0,
            "free": 1,
        }
    ]
    ledger.apply_node(objects.node("n1", {}))
    ledger.apply_claim(dra_claim(10))
    ledger.assume(dra_claim(10, "gpu-0"))  # counted before its allocation is watched
    tainted = slice_of("n1", "gpu-0", "gpu-1", "gpu-2")
    tainted["spec"]["devices"][0]["taints"] = [{"key": "bad", "effect": "NoExecute"}]
    ledger.apply_resource_slice(tainted)
    view = ledger.node("n1")
    assert view is not None
    [entry] = view.dra
    assert (entry["count"], entry["allocated"], entry["tainted"], entry["free"]) == (3, 1, 1, 2)
    ledger.forget(("t", "hold"))
    view = ledger.node("n1")
    assert view is not None and view.dra[0]["allocated"] == 0


def test_the_selectors_run_once_per_slice_change_and_allocations_are_laid_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, _ = world()
    runs: list[int] = []
    real = dra_devices.inventory

    def counting(*args: Any, **kwargs: Any) -> dra_devices.Inventory:
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("gpuoperator.ledger.dra_devices.inventory", counting)
    assert free(ledger) == {"n1": 3, "n2": 1}
    assert free(ledger) == {"n1": 3, "n2": 1}
    assert len(runs) == 1
    # An allocation changes the figures without running the selectors again.
    hold = {
        "metadata": {"namespace": "t", "name": "own"},
        "status": dra_holds.allocation([ref("gpu-0")], "n1", NOW),
    }
    ledger.apply_resource_claim(hold)
    assert free(ledger) == {"n1": 2, "n2": 1}
    ledger.delete_resource_claim(hold)
    assert free(ledger) == {"n1": 3, "n2": 1}
    assert len(runs) == 1
    # A slice change does.
    ledger.apply_resource_slice(slice_of("n2", "gpu-0", "gpu-1"))
    assert free(ledger) == {"n1": 3, "n2": 2}
    assert len(runs) == 2
