"""Devices of a DRA class held outside the catalog's holds, and the class condition that
names them (``model.dra_holds.held_outside``, ``outside_condition``; docs/design.md §5 "DRA
classes", one allocator per device). The expected holders are written out by hand from the
objects each test builds."""

from __future__ import annotations

from typing import Any

from gpuoperator import names
from gpuoperator.model import dra_devices, dra_holds
from harness import objects

Obj = dict[str, Any]
DRIVER = objects.DRA_DRIVER
Ref = dra_devices.DeviceRef
DEVICE_CLASS = "a10.example.com"
SELECTOR = {"cel": {"expression": 'device.attributes["gpu.example.com"].model == "A10"'}}


def device_class() -> Obj:
    return {"metadata": {"name": DEVICE_CLASS}, "spec": {"selectors": [SELECTOR]}}


def slices() -> list[Obj]:
    """n1: gpu-0, gpu-1 (A10) and gpu-2 (an L40S the class does not select); n2: gpu-0."""
    a10, l40s = {"model": {"string": "A10"}}, {"model": {"string": "L40S"}}
    return [
        objects.resource_slice("n1", {"gpu-0": a10, "gpu-1": a10, "gpu-2": l40s}),
        objects.resource_slice("n2", {"gpu-0": a10}),
    ]


def resource_claim(
    namespace: str, name: str, devices: list[tuple[str, str]], *, owner_kind: str | None = None
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if owner_kind is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": f"{names.GROUP}/v1alpha1",
                "kind": owner_kind,
                "name": name,
                "uid": f"uid-owner-{name}",
                "controller": True,
            }
        ]
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
        for pool, device in devices
    ]
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}


def outside(*claims: Obj) -> tuple[dra_holds.OutsideHold, ...]:
    inventory = dra_devices.inventory(slices(), device_class(), claims)
    return dra_holds.held_outside(inventory, claims)


def test_a_hold_is_a_resource_claim_a_gpuclaim_controls_whatever_its_labels() -> None:
    assert dra_holds.is_hold(resource_claim("t", "hold", [], owner_kind=names.GPU_CLAIM))
    assert not dra_holds.is_hold(resource_claim("t", "pod-claim", [], owner_kind="Pod"))
    dressed = resource_claim("t", "dressed", [])
    dressed["metadata"]["labels"] = {names.DRA_HOLD_LABEL: names.TRUE}
    assert not dra_holds.is_hold(dressed)
    not_controller = resource_claim("t", "ref", [], owner_kind=names.GPU_CLAIM)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert not dra_holds.is_hold(not_controller)


def test_devices_of_the_class_held_by_other_claims_are_named_with_their_holders() -> None:
    found = outside(
        resource_claim("t", "hold", [("n1", "gpu-0")], owner_kind=names.GPU_CLAIM),
        resource_claim("gpu-hoster", "job-gpu-x1", [("n1", "gpu-1")], owner_kind="Pod"),
        resource_claim("gpu-hoster", "plain", [("n2", "gpu-0")]),
        # gpu-2 of n1 is not the class's device: whoever holds it is none of its business.
        resource_claim("gpu-hoster", "l40s", [("n1", "gpu-2")]),
    )
    assert found == (
        dra_holds.OutsideHold(Ref(DRIVER, "n1", "gpu-1"), "n1", ("gpu-hoster", "job-gpu-x1")),
        dra_holds.OutsideHold(Ref(DRIVER, "n2", "gpu-0"), "n2", ("gpu-hoster", "plain")),
    )
    # And the inventory counts them as used, as it counts the hold's device.
    inventory = dra_devices.inventory(
        slices(),
        device_class(),
        [resource_claim("gpu-hoster", "plain", [("n2", "gpu-0")])],
    )
    assert inventory.nodes["n2"].free == 0


def test_only_holds_or_no_allocations_hold_nothing_outside() -> None:
    assert outside() == ()
    assert outside(resource_claim("t", "hold", [("n1", "gpu-0")], owner_kind=names.GPU_CLAIM)) == ()
    assert outside(resource_claim("t", "pending", [])) == ()


def test_a_device_two_claims_hold_is_named_for_each() -> None:
    found = outside(
        resource_claim("a", "one", [("n1", "gpu-1")]),
        resource_claim("b", "two", [("n1", "gpu-1")]),
    )
    assert [h.holder for h in found] == [("a", "one"), ("b", "two")]


def test_the_condition_is_false_when_none_are_held_outside() -> None:
    status, reason, message = dra_holds.outside_condition(DEVICE_CLASS, ())
    assert (status, reason) == (False, "NoneHeldOutside")
    assert DEVICE_CLASS in message


def test_the_condition_names_a_few_devices_and_holders_and_counts_the_rest() -> None:
    holds = [
        dra_holds.OutsideHold(Ref(DRIVER, f"n{i}", "gpu-0"), f"n{i}", ("gpu-hoster", f"job-{i}"))
        for i in range(5)
    ]
    status, reason, message = dra_holds.outside_condition(DEVICE_CLASS, holds)
    assert (status, reason) == (True, "HeldByOtherClaims")
    assert message.startswith(f"5 device(s) of DeviceClass {DEVICE_CLASS} are held by")
    for i in range(3):
        assert f"{DRIVER}/n{i}/gpu-0 on node n{i} by ResourceClaim gpu-hoster/job-{i}" in message
    assert "job-3" not in message and "job-4" not in message
    assert message.endswith(" and 2 more")


def test_the_condition_counts_devices_once_when_two_claims_hold_one() -> None:
    ref = Ref(DRIVER, "n1", "gpu-1")
    holds = [
        dra_holds.OutsideHold(ref, "n1", ("a", "one")),
        dra_holds.OutsideHold(ref, "n1", ("b", "two")),
    ]
    _, _, message = dra_holds.outside_condition(DEVICE_CLASS, holds)
    assert message.startswith("1 device(s)")
    assert "ResourceClaim a/one" in message and "ResourceClaim b/two" in message
    assert "more" not in message
