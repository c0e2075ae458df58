"""Class status of a DRA class (docs/design.md §5 "DRA classes", one allocator per device):
a device of the class held by a ResourceClaim that no GPUClaim controls is counted as used
and the class's ``DevicesHeldOutside`` condition names it and its ResourceClaim, with one
Warning Event when it turns True; the catalog's own holds never raise it; once the outside
claim is gone the condition turns False and the device is free again. Device-plugin
classes never get the condition."""

from __future__ import annotations

from typing import Any

import pytest

from controllers import class_status
from gpuoperator import names
from gpuoperator.kinds import GPUClass
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import OfflineCluster

Obj = dict[str, Any]
DRIVER = objects.DRA_DRIVER
DEVICE_CLASS = "a10.example.com"
CLASS = "dra-a10"


def resource_claim(namespace: str, name: str, device: str, *, hold: bool = False) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if hold:
        meta["ownerReferences"] = [
            {
                "apiVersion": names.API_VERSION,
                "kind": names.GPU_CLAIM,
                "name": name,
                "uid": f"uid-claim-{name}",
                "controller": True,
            }
        ]
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device}
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": [result]}}}}


class World(OfflineCluster):
    def __init__(self) -> None:
        super().__init__()
        class_status.register(
            self.manager,
            self.caches,
            self.ledger,
            self.recorder,
            Settings.model_validate({"statusInterval": 0}),
        )
        self.reconciler = self.manager.reconcilers[class_status.NAME]
        self.put(
            self.caches.classes,
            objects.gpuclass(CLASS, source={"dra": {"deviceClassName": DEVICE_CLASS}}),
        )
        self.put(self.caches.nodes, objects.node("n1", 0))
        self.ledger.apply_device_class({"metadata": {"name": DEVICE_CLASS}, "spec": {}})
        self.ledger.apply_resource_slice(
            objects.resource_slice("n1", {"gpu-0": {}, "gpu-1": {}, "gpu-2": {}})
        )

    def status(self) -> Obj:
        self.reconciler.reconcile(("", CLASS))
        stored = self.api.stored(GPUClass, CLASS)
        assert stored is not None
        self.deliver(self.caches.classes, stored)
        status: Obj = stored["status"]
        return status

    @staticmethod
    def condition(status: Obj) -> Obj | None:
        found = [c for c in status.get("conditions", []) if c["type"] == "DevicesHeldOutside"]
        return found[0] if found else None


@pytest.fixture
def world() -> World:
    return World()


def test_no_outside_claim_gives_a_false_condition_and_no_event(world: World) -> None:
    world.ledger.apply_resource_claim(resource_claim("tenant", "hold", "gpu-0", hold=True))
    status = world.status()
    assert status["free"] == 2  # the hold's device is used
    condition = world.condition(status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "NoneHeldOutside")
    assert world.recorder.reasons() == []


def test_an_outside_claim_is_counted_named_told_once_and_cleared_when_gone(world: World) -> None:
    world.status()
    job = resource_claim("gpu-hoster", "job-gpu-x1", "gpu-1")
    world.ledger.apply_resource_claim(job)
    status = world.status()
    assert status["free"] == 2
    condition = world.condition(status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "HeldByOtherClaims")
    assert (
        f"{DRIVER}/n1/gpu-1 on node n1 by ResourceClaim gpu-hoster/job-gpu-x1"
        in (condition["message"])
    )
    [event] = world.recorder.events
    assert (event["type"], event["reason"], event["name"]) == (
        "Warning",
        "DevicesHeldOutside",
        CLASS,
    )
    assert "gpu-hoster/job-gpu-x1" in event["message"]

    # A second outside claim changes the message, not the status: no second Event.
    world.ledger.apply_resource_claim(resource_claim("gpu-hoster", "job-gpu-x2", "gpu-2"))
    status = world.status()
    condition = world.condition(status)
    assert condition is not None and condition["message"].startswith("2 device(s)")
    assert status["free"] == 1  # gpu-0 only
    assert world.recorder.reasons() == ["DevicesHeldOutside"]

    for name, device in (("job-gpu-x1", "gpu-1"), ("job-gpu-x2", "gpu-2")):
        world.ledger.delete_resource_claim(resource_claim("gpu-hoster", name, device))
    status = world.status()
    condition = world.condition(status)
    assert condition is not None and condition["status"] == "False"
    assert status["free"] == 3


def test_a_device_plugin_class_gets_no_such_condition(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass("a10"))
    world.reconciler.reconcile(("", "a10"))
    stored = world.api.stored(GPUClass, "a10")
    assert stored is not None
    assert [c["type"] for c in stored["status"]["conditions"]] == ["Available"]
