"""Device health on a DRA class (docs/design.md §5 "DRA classes"): an idle hold whose device
is tainted or gone from its slice moves to healthy devices (its ResourceClaim deleted and
allocated again before the claim's status names the new devices; Event ``Moved``); a hold
serving a VM, or one that fits nowhere, stays with the ``DeviceUnhealthy`` condition and a
Warning Event; the condition goes once the device is healthy again. The oracle is what the
API double stores (allocations and claims) and the Events, never the ledger."""

from __future__ import annotations

import copy
import datetime
import functools
from typing import Any

from prometheus_client import CollectorRegistry
from unit.controllers.test_controllers_binder_dra import DraApi

from controllers import device_health
from gpuoperator import names
from gpuoperator.claim_status import ClaimStatus
from gpuoperator.kinds import GPUClaim, ResourceClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import claim_states, dra_devices, dra_holds
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import FakeRecorder, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
DRIVER = objects.DRA_DRIVER
DEVICE_CLASS = "a10.example.com"
CLASS = objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": DEVICE_CLASS}})
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
claim = functools.partial(
    objects.claim,
    namespace=NS,
    class_name="dra-a10",
    uid=None,
    finalizers=[names.CLAIM_PROTECTION_FINALIZER],
)


def ref(device: str, node: str = "n1") -> dra_devices.DeviceRef:
    return dra_devices.DeviceRef(DRIVER, node, device)


def slice_of(node: str, devices: list[str], tainted: tuple[str, ...] = ()) -> Obj:
    obj = objects.resource_slice(node, {d: {} for d in devices})
    for d in obj["spec"]["devices"]:
        if d["name"] in tainted:
            d["taints"] = [{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]
    return obj


class World:
    def __init__(self, n1: list[str], n2: list[str], **settings: Any) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.api = DraApi()
        self.recorder = FakeRecorder()
        self.statuses = ClaimStatus(
            self.api, self.ledger, self.recorder, registry=CollectorRegistry()
        )
        self.health = device_health.DeviceHealth(
            self.caches,
            self.ledger,
            self.statuses,
            self.api,
            Settings.model_validate(settings),
            clock=self.clock,
            registry=CollectorRegistry(),
        )
        self.caches.classes.store.put(CLASS)
        self.ledger.apply_class(CLASS)
        self.ledger.apply_device_class({"metadata": {"name": DEVICE_CLASS}, "spec": {}})
        self.devices = {"n1": n1, "n2": n2}
        for name in ("n1", "n2"):
            node = objects.node(name, {})
            self.caches.nodes.store.put(node)
            self.ledger.apply_node(node)
            self.ledger.apply_resource_slice(slice_of(name, self.devices[name]))

    def publish(self, node: str, devices: list[str], tainted: tuple[str, ...] = ()) -> None:
        published = slice_of(node, devices, tainted)
        published["spec"]["pool"]["generation"] = 2
        self.ledger.apply_resource_slice(published)

    def bound(
        self, name: str, *devices: str, node: str = "n1", attachment: Obj | None = None
    ) -> Obj:
        """A claim Bound to ``devices`` on ``node`` with its allocated hold, as watched
        (attached to the VM instance ``attachment`` names, if any)."""
        base = self.api.add(GPUClaim, claim(name, count=len(devices)))
        held = [ref(d, node) for d in devices]
        status = claim_states.dra_bound(base, node, name, held, NOW)
        if attachment is not None:
            status["attachment"] = attachment
        stored = self.api.add(GPUClaim, {**base, "status": status})
        hold = dra_holds.resource_claim(stored, DEVICE_CLASS, len(held))
        hold["status"] = dra_holds.allocation(held, node, NOW)
        hold = self.api.add(ResourceClaim, hold)
        self.caches.claims.store.put(stored)
        self.ledger.apply_claim(stored)
        self.ledger.apply_resource_claim(copy.deepcopy(hold))
        return stored

    def reconcile(self) -> object:
        return self.health.reconcile(("", "dra-a10"))

    def allocation(self, name: str) -> list[tuple[str, str]] | None:
        hold = self.api.stored(ResourceClaim, name, NS)
        return None if hold is None else [(r.pool, r.device) for r in dra_holds.allocated(hold)]

    def status(self, name: str) -> Obj:
        stored = self.api.stored(GPUClaim, name, NS)
        assert stored is not None
        return stored.get("status") or {}

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, kind) for verb, kind, _, _ in self.api.writes()]


def condition(status: Obj, type_: str) -> Obj | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def test_an_idle_hold_on_a_tainted_device_moves_to_a_healthy_one_on_its_node() -> None:
    world = World(["gpu-0", "gpu-1"], ["gpu-0"])
    world.bound("idle", "gpu-0")
    other = world.bound("other", "gpu-0", node="n2")  # n2 is full: the move stays on n1
    world.publish("n1", ["gpu-0", "gpu-1"], tainted=("gpu-0",))
    before = len(world.api.writes())

    assert world.reconcile() is None

    assert world.verbs()[before:] == [
        ("delete", "ResourceClaim"),
        ("create", "ResourceClaim"),
        ("replace_status", "ResourceClaim"),
        ("replace_status", "GPUClaim"),
    ]
    assert world.allocation("idle") == [("n1", "gpu-1")]
    status = world.status("idle")
    assert status["nodeName"] == "n1"
    assert status["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-1"}]
    bound = condition(status, "Bound")
    assert bound is not None and bound["reason"] == "Moved"
    assert "DeviceTainted" in bound["message"] and f"{DRIVER}/n1/gpu-0" in bound["message"]
    [event] = [e for e in world.recorder.events if e["name"] == "idle"]
    assert (event["type"], event["reason"]) == ("Normal", "Moved")
    assert world.allocation("other") == [("n2", "gpu-0")]
    assert world.status("other") == other["status"]


def test_a_hold_whose_device_left_the_slice_moves_to_another_node() -> None:
    world = World(["gpu-0"], ["gpu-0", "gpu-1"])
    world.bound("idle", "gpu-0")
    world.publish("n1", [])  # the pool is whole and no longer lists gpu-0

    world.reconcile()

    assert world.allocation("idle") == [("n2", "gpu-0")]
    status = world.status("idle")
    assert status["nodeName"] == "n2"
    assert "DeviceGone" in (condition(status, "Bound") or {}).get("message", "")


def test_an_incomplete_pool_says_nothing_about_its_devices() -> None:
    world = World(["gpu-0"], ["gpu-0"])
    world.bound("idle", "gpu-0")
    republishing = slice_of("n1", [])
    republishing["spec"]["pool"].update(generation=2, resourceSliceCount=2)
    world.ledger.apply_resource_slice(republishing)
    before = len(world.api.writes())

    assert world.reconcile() is None

    assert world.api.writes()[before:] == []


def test_a_hold_serving_a_vm_stays_and_says_so_once() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("serving", "gpu-0", attachment={"vmi": "vm-1", "uid": "vmi-uid"})
    world.publish("n1", ["gpu-0", "gpu-1"], tainted=("gpu-0",))

    world.reconcile()
    stored = world.api.stored(GPUClaim, "serving", NS)
    assert stored is not None
    world.caches.claims.store.put(stored)
    world.ledger.apply_claim(stored)  # the watch delivers the flagged claim: nothing new
    world.reconcile()

    assert world.allocation("serving") == [("n1", "gpu-0")]
    status = world.status("serving")
    assert status["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    flagged = condition(status, "DeviceUnhealthy")
    assert flagged is not None and flagged["status"] == "True"
    assert flagged["reason"] == "DeviceTainted"
    assert f"{NS}/vm-1" in flagged["message"] and "not moved" in flagged["message"]
    events = [e for e in world.recorder.events if e["name"] == "serving"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "DeviceTainted")]


def test_a_hold_that_fits_nowhere_stays_and_loses_the_condition_once_healthy() -> None:
    world = World(["gpu-0"], [])
    world.bound("idle", "gpu-0")
    world.publish("n1", ["gpu-0"], tainted=("gpu-0",))

    world.reconcile()
    assert world.allocation("idle") == [("n1", "gpu-0")]
    flagged = condition(world.status("idle"), "DeviceUnhealthy")
    assert (
        flagged is not None and "no eligible node has 1 healthy free device" in flagged["message"]
    )

    stored = world.api.stored(GPUClaim, "idle", NS)
    assert stored is not None
    world.caches.claims.store.put(stored)
    world.ledger.apply_claim(stored)
    world.publish("n1", ["gpu-0"])  # the taint is lifted
    world.reconcile()
    assert condition(world.status("idle"), "DeviceUnhealthy") is None
    assert world.allocation("idle") == [("n1", "gpu-0")]


def test_with_drain_moves_off_an_idle_hold_is_reported_not_moved() -> None:
    world = World(["gpu-0", "gpu-1"], [], drainMoves=False)
    world.bound("idle", "gpu-0")
    world.publish("n1", ["gpu-0", "gpu-1"], tainted=("gpu-0",))

    world.reconcile()

    assert world.allocation("idle") == [("n1", "gpu-0")]
    assert condition(world.status("idle"), "DeviceUnhealthy") is not None


def test_a_move_whose_status_write_lost_a_race_is_finished_from_its_hold() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("idle", "gpu-0")
    world.publish("n1", ["gpu-0", "gpu-1"], tainted=("gpu-0",))
    # The hold was moved to gpu-1 before, and the claim's status still names gpu-0.
    moved = world.api.stored(ResourceClaim, "idle", NS)
    assert moved is not None
    moved["status"] = dra_holds.allocation([ref("gpu-1")], "n1", NOW)
    world.ledger.apply_resource_claim(world.api.add(ResourceClaim, moved))
    before = len(world.api.writes())

    world.reconcile()

    assert world.verbs()[before:] == [("replace_status", "GPUClaim")]
    assert world.status("idle")["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-1"}]
    assert world.allocation("idle") == [("n1", "gpu-1")]
