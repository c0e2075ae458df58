"""Which devices a DRA claim takes on its node, and the ResourceClaim that holds them
(docs/design.md §5 "DRA classes", "Binding"). The properties are checked against counts the
test makes from the devices it generated, not from the module's own grouping."""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator import names
from gpuoperator.model import dra_devices, dra_holds
from harness import objects

Obj = dict[str, Any]
DRIVER = objects.DRA_DRIVER
NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
Ref = dra_devices.DeviceRef


def dev(
    name: str, topology: str | None = None, *, held: bool = False, tainted: bool = False
) -> dra_devices.Device:
    return dra_devices.Device(Ref(DRIVER, "n1", name), "n1", topology, held, tainted)


def node(*devices: dra_devices.Device) -> dra_devices.NodeDevices:
    return dra_devices.NodeDevices("n1", tuple(devices))


def eight_gpus(*, held: tuple[str, ...] = ()) -> dra_devices.NodeDevices:
    """An 8-GPU node, gpu-0..3 on PCIe root r0 and gpu-4..7 on r1."""
    return node(
        *(dev(f"gpu-{i}", "r0" if i < 4 else "r1", held=f"gpu-{i}" in held) for i in range(8))
    )


def names_of(chosen: tuple[Ref, ...] | None) -> list[str]:
    assert chosen is not None
    return [r.device for r in chosen]


# ---- choosing devices ----------------------------------------------------------------------


def test_a_four_gpu_claim_on_an_eight_gpu_node_takes_one_whole_half() -> None:
    assert names_of(dra_holds.choose(eight_gpus(), 4)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # With r0 partly used, the half that still fits whole is taken, not a mix.
    chosen = dra_holds.choose(eight_gpus(held=("gpu-1",)), 4)
    assert names_of(chosen) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]


def test_a_small_claim_fills_the_partly_used_group_and_keeps_the_whole_one_whole() -> None:
    # r0 has 3 free, r1 4: one device comes from r0, so a 4-device claim still fits in r1.
    assert names_of(dra_holds.choose(eight_gpus(held=("gpu-0",)), 1)) == ["gpu-1"]
    assert names_of(dra_holds.choose(eight_gpus(held=("gpu-0",)), 2)) == ["gpu-1", "gpu-2"]


def test_a_claim_larger_than_any_group_spans_the_fullest_groups_first() -> None:
    # r0: 1 free (gpu-3), r1: 4 free; a 5-device claim takes r1 whole and one of r0.
    chosen = dra_holds.choose(eight_gpus(held=("gpu-0", "gpu-1", "gpu-2")), 5)
    assert names_of(chosen) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7", "gpu-3"]


def test_devices_without_the_attribute_are_never_a_group_and_come_last() -> None:
    view = node(dev("a"), dev("b"), dev("c", "r0"), dev("d", "r1"), dev("e", "r1"))
    # Two untopologied devices are free, but r1 is the one value holding two.
    assert names_of(dra_holds.choose(view, 2)) == ["d", "e"]
    assert names_of(dra_holds.choose(view, 4)) == ["d", "e", "c", "a"]


def test_a_class_without_topology_takes_devices_in_reference_order() -> None:
    view = node(dev("c"), dev("a", held=True), dev("b"), dev("d", tainted=True), dev("e"))
    assert names_of(dra_holds.choose(view, 3)) == ["b", "c", "e"]


def test_too_few_free_devices_or_no_count_choose_nothing() -> None:
    view = node(dev("a", "r0"), dev("b", "r0", held=True), dev("c", "r1", tainted=True))
    assert dra_holds.choose(view, 2) is None
    assert dra_holds.choose(view, 0) is None
    assert names_of(dra_holds.choose(view, 1)) == ["a"]


devices_st = st.lists(
    st.tuples(st.sampled_from([None, "r0", "r1", "r2"]), st.booleans(), st.booleans()),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(devices_st, st.integers(min_value=1, max_value=13), st.randoms())
def test_a_choice_takes_free_devices_once_and_one_group_whenever_one_fits(
    specs: list[tuple[str | None, bool, bool]], count: int, rnd: Any
) -> None:
    made = [
        dev(f"gpu-{i:02d}", topology, held=held, tainted=tainted)
        for i, (topology, held, tainted) in enumerate(specs)
    ]
    shuffled = list(made)
    rnd.shuffle(shuffled)
    free = [d for d in made if not d.held and not d.tainted]
    per_value = Counter(d.topology for d in free if d.topology is not None)
    fitting = {v: n for v, n in per_value.items() if n >= count}

    chosen = dra_holds.choose(node(*shuffled), count)

    # The order the slices listed the devices in changes nothing.
    assert chosen == dra_holds.choose(node(*made), count)
    if len(free) < count:
        assert chosen is None
        return
    assert chosen is not None and len(chosen) == count
    assert len(set(chosen)) == count  # never a device twice
    by_ref = {d.ref: d for d in made}
    assert all(by_ref[r].free for r in chosen)  # never a held or tainted device
    values = {by_ref[r].topology for r in chosen}
    if fitting:
        smallest = min(fitting.values())
        assert len(values) == 1
        (value,) = values
        assert value is not None and fitting[value] == smallest


# ---- the ResourceClaim ---------------------------------------------------------------------


def gpuclaim(uid: str = "u-1") -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"namespace": "tenant", "name": "hold-a", "uid": uid},
        "spec": {"className": "a10", "count": 2},
    }


def test_the_resource_claim_asks_for_exactly_the_count_and_is_controlled_by_the_claim() -> None:
    made = dra_holds.resource_claim(gpuclaim(), "a10.gpu.example.com", 2)
    assert made["apiVersion"] == "resource.k8s.io/v1" and made["kind"] == "ResourceClaim"
    assert made["metadata"]["namespace"] == "tenant"
    assert made["metadata"]["name"] == "hold-a" == dra_holds.resource_claim_name(gpuclaim())
    assert made["metadata"]["labels"] == {"gpu.cozystack.io/hold": "true"}
    assert made["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "cozystack.io/v1alpha1",
            "kind": "GPUClaim",
            "name": "hold-a",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert made["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "a10.gpu.example.com",
                        "allocationMode": "ExactCount",
                        "count": 2,
                    },
                }
            ]
        }
    }
    assert "status" not in made  # the allocation goes through the status subresource


def test_a_resource_claim_needs_an_existing_claim_and_a_count_the_status_can_list() -> None:
    unsaved = gpuclaim()
    del unsaved["metadata"]["uid"]
    with pytest.raises(ValueError, match="uid"):
        dra_holds.resource_claim(unsaved, "a10", 1)
    for count in (0, 65):
        with pytest.raises(ValueError, match="1 to 64"):
            dra_holds.resource_claim(gpuclaim(), "a10", count)


def test_the_allocation_names_the_devices_the_node_by_name_and_the_time() -> None:
    chosen = (Ref(DRIVER, "n1", "gpu-4"), Ref(DRIVER, "n1", "gpu-5"))
    status = dra_holds.allocation(chosen, "n1", NOW)
    assert status == {
        "allocation": {
            "allocationTimestamp": "2024-05-01T12:00:00Z",
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-4"},
                    {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-5"},
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        }
    }
    assert dra_holds.allocated({"status": status}) == chosen
    assert dra_holds.allocated({"status": {}}) == () == dra_holds.allocated({})


def test_a_hold_is_recognised_by_its_controller_uid_never_by_its_name() -> None:
    made = dra_holds.resource_claim(gpuclaim(), "a10", 1)
    assert dra_holds.is_hold_of(made, gpuclaim())
    # A claim of the same name made again (another UID) does not own the old hold.
    assert not dra_holds.is_hold_of(made, gpuclaim("u-2"))
    # A tenant's ResourceClaim of that name, or one merely owned (not controlled), is not it.
    tenant = {"metadata": {"name": "hold-a", "namespace": "tenant"}}
    assert not dra_holds.is_hold_of(tenant, gpuclaim())
    owned = dra_holds.resource_claim(gpuclaim(), "a10", 1)
    owned["metadata"]["ownerReferences"][0]["controller"] = False
    assert not dra_holds.is_hold_of(owned, gpuclaim())


def test_an_allocated_hold_counts_as_used_and_is_never_chosen_again() -> None:
    """One allocator per device: what a hold's allocation names, the inventory marks held,
    whoever else then asks for devices on the node."""
    roots = {"gpu-0": "r0", "gpu-1": "r0", "gpu-2": "r1", "gpu-3": "r1"}
    slices = [
        objects.resource_slice("n1", {d: {"pcieRoot": {"string": r}} for d, r in roots.items()})
    ]
    device_class = {"metadata": {"name": "a10"}, "spec": {}}
    holds: list[Obj] = []
    taken: list[Ref] = []
    for count in (2, 1, 1):
        inv = dra_devices.inventory(
            slices, device_class, holds, topology_attribute=f"{DRIVER}/pcieRoot"
        )
        chosen = dra_holds.choose(inv.nodes["n1"], count)
        assert chosen is not None
        taken.extend(chosen)
        holds.append({"status": dra_holds.allocation(chosen, "n1", NOW)})
    assert sorted(r.device for r in taken) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    inv = dra_devices.inventory(slices, device_class, holds, topology_attribute="pcieRoot")
    assert inv.free == 0 and dra_holds.choose(inv.nodes["n1"], 1) is None


def test_only_bound_claims_hold_the_devices_their_status_names() -> None:
    bound = {
        "status": {
            "phase": "Bound",
            "nodeName": "n1",
            "devices": [{"driver": DRIVER, "pool": "n1", "device": "gpu-1"}],
        }
    }
    waiting = {
        "status": {
            "phase": "Pending",
            "devices": [{"driver": DRIVER, "pool": "n1", "device": "gpu-2"}],
        }
    }
    assert dra_holds.claimed([bound, waiting, {}]) == {Ref(DRIVER, "n1", "gpu-1")}


def test_the_counted_inventory_holds_claimed_devices_and_keeps_everything_else() -> None:
    view = node(dev("gpu-0"), dev("gpu-1", held=True), dev("gpu-2", tainted=True), dev("gpu-3"))
    inv = dra_devices.Inventory(nodes={"n1": view}, reasons=("r",))
    claimed = {Ref(DRIVER, "n1", "gpu-1"), Ref(DRIVER, "n1", "gpu-3"), Ref(DRIVER, "n9", "x")}
    counted = dra_holds.counted_inventory(inv, claimed)
    assert [(d.ref.device, d.held, d.tainted) for d in counted.nodes["n1"].devices] == [
        ("gpu-0", False, False),
        ("gpu-1", True, False),
        ("gpu-2", False, True),
        ("gpu-3", True, False),
    ]
    assert counted.free == 1 and counted.reasons == ("r",)
