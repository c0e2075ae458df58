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
from gpuoperator.runtime import errors
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
    def __init__(
        self, n1: list[str], n2: list[str], api: DraApi | None = None, **settings: Any
    ) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.api = api if api is not None else DraApi()
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
        self.published: dict[str, Obj] = {}
        for name in ("n1", "n2"):
            node = objects.node(name, {})
            self.caches.nodes.store.put(node)
            self.ledger.apply_node(node)
            self.ledger.apply_resource_slice(slice_of(name, self.devices[name]))

    def publish(self, node: str, devices: list[str], tainted: tuple[str, ...] = ()) -> None:
        published = slice_of(node, devices, tainted)
        published["spec"]["pool"]["generation"] = 2
        self.published[node] = published
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

    def successor(self, **settings: Any) -> World:
        """A new leader over the same API server: its caches list what the server holds
        (claims and holds; the slices as this world last published them)."""
        after = World([], [], api=self.api, **settings)
        with self.api.lock:
            stored = copy.deepcopy(self.api.objects)
        for (kind, _, _), obj in sorted(stored.items()):
            if kind == GPUClaim.kind:
                after.caches.claims.store.put(obj)
                after.ledger.apply_claim(obj)
            elif kind == ResourceClaim.kind:
                after.ledger.apply_resource_claim(obj)
        for name in ("n1", "n2"):
            published = self.published.get(name) or slice_of(name, self.devices[name])
            after.ledger.apply_resource_slice(published)
        return after

    def other_allocation(self, name: str, *devices: str, node: str = "n1") -> None:
        """A ResourceClaim no GPUClaim controls, allocated on ``devices`` (an exempt pod's)."""
        obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "exempt"},
            "spec": {},
            "status": dra_holds.allocation([ref(d, node) for d in devices], node, NOW),
        }
        self.ledger.apply_resource_claim(self.api.add(ResourceClaim, obj))

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


# ---- a Bound claim whose hold is gone ------------------------------------------------------


def stopped_between_delete_and_create(world: World, name: str) -> None:
    """Run a health move of ``name`` whose leader stops right after the hold's delete: the
    create is fenced, so the claim stays Bound on its old devices with no ResourceClaim."""
    world.api.refuse[("create", NS)] = errors.NotLeaderError("lost the lease")
    try:
        world.reconcile()
    except errors.NotLeaderError:
        pass
    else:
        raise AssertionError("the move was not fenced")
    finally:
        del world.api.refuse[("create", NS)]
    assert world.api.stored(ResourceClaim, name, NS) is None
    assert world.status(name)["phase"] == "Bound"


def test_a_claim_left_without_its_hold_by_a_stopped_move_is_held_again_on_its_devices() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("idle", "gpu-0")
    world.bound("full", "gpu-1")  # the move's target is gpu-2
    world.publish("n1", ["gpu-0", "gpu-1", "gpu-2"], tainted=("gpu-0",))
    stopped_between_delete_and_create(world, "idle")
    world.publish("n1", ["gpu-0", "gpu-1", "gpu-2"])  # the taint is lifted meanwhile

    after = world.successor()
    before = len(after.api.writes())
    after.reconcile()

    assert after.verbs()[before:] == [
        ("create", "ResourceClaim"),
        ("replace_status", "ResourceClaim"),
        ("replace_status", "GPUClaim"),
    ]
    assert after.allocation("idle") == [("n1", "gpu-0")]
    status = after.status("idle")
    assert status["phase"] == "Bound" and status["nodeName"] == "n1"
    assert status["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    bound = condition(status, "Bound")
    assert bound is not None and bound["status"] == "True" and bound["reason"] == "HoldRestored"
    events = [e for e in after.recorder.events if e["name"] == "idle"]
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "HoldRestored")]
    hold = after.api.stored(ResourceClaim, "idle", NS)
    stored = after.api.stored(GPUClaim, "idle", NS)
    assert hold is not None and stored is not None and dra_holds.is_hold_of(hold, stored)


def test_a_claim_whose_devices_were_taken_meanwhile_moves_to_free_ones() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("idle", "gpu-0")
    world.api.remove(ResourceClaim, "idle", NS)
    world.other_allocation("exempt-pod", "gpu-0")
    after = world.successor()

    after.reconcile()

    assert after.allocation("idle") == [("n1", "gpu-1")]
    status = after.status("idle")
    assert status["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-1"}]
    assert (condition(status, "Bound") or {}).get("reason") == "Moved"


def test_an_idle_claim_whose_hold_is_gone_and_that_fits_nowhere_waits_again() -> None:
    world = World(["gpu-0"], [])
    world.bound("idle", "gpu-0")
    world.api.remove(ResourceClaim, "idle", NS)
    world.publish("n1", ["gpu-0"], tainted=("gpu-0",))
    after = world.successor()

    after.reconcile()

    assert after.api.stored(ResourceClaim, "idle", NS) is None
    status = after.status("idle")
    assert status["phase"] == "Pending"
    assert "nodeName" not in status and "devices" not in status
    bound = condition(status, "Bound")
    assert bound is not None and bound["status"] == "False" and bound["reason"] == "HoldLost"
    assert "DeviceClass a10.example.com" in bound["message"]


def test_a_serving_claim_whose_hold_is_gone_keeps_its_devices_and_says_so() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("serving", "gpu-0", attachment={"vmi": "vm-1", "uid": "vmi-uid"})
    world.api.remove(ResourceClaim, "serving", NS)
    world.other_allocation("exempt-pod", "gpu-0")
    after = world.successor()

    after.reconcile()

    assert after.api.stored(ResourceClaim, "serving", NS) is None
    status = after.status("serving")
    assert status["phase"] == "Bound"
    assert status["devices"] == [{"driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    flagged = condition(status, "HoldMissing")
    assert flagged is not None and f"{NS}/vm-1" in flagged["message"]
    events = [e for e in after.recorder.events if e["name"] == "serving"]
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "HoldMissing")]


def test_a_hold_the_cache_has_not_shown_yet_is_not_created_twice() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("idle", "gpu-0")
    world.ledger.delete_resource_claim(world.api.stored(ResourceClaim, "idle", NS) or {})
    before = len(world.api.writes())

    world.reconcile()

    assert world.api.writes()[before:] == []
    assert world.allocation("idle") == [("n1", "gpu-0")]


def test_a_device_taint_rule_on_a_held_device_moves_an_idle_hold_as_a_slice_taint_does() -> None:
    world = World(["gpu-0", "gpu-1"], [])
    world.bound("idle", "gpu-0")
    rule = {
        "apiVersion": names.DEVICE_TAINT_RULE_API_VERSION,
        "kind": names.DEVICE_TAINT_RULE_KIND,
        "metadata": {"name": "maintenance"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
            "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
        },
    }
    world.ledger.apply_device_taint_rule(rule)
    assert world.ledger.node_dra("n1")[0]["tainted"] == 1

    world.reconcile()

    assert world.allocation("idle") == [("n1", "gpu-1")]
    bound = condition(world.status("idle"), "Bound")
    assert bound is not None and bound["reason"] == "Moved" and "DeviceTainted" in bound["message"]

    world.ledger.delete_device_taint_rule(rule)
    assert world.ledger.node_dra("n1")[0]["tainted"] == 0
