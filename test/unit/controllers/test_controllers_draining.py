"""The draining controller on in-memory caches, a real ``Ledger`` and an API server double
with resourceVersion preconditions: idle holds leave a cordoned node one decision at a time,
never onto more than a node has free; a hold that fits nowhere is reported; the setting turns
moves off; a running vGPU VM whose eviction strategy is LiveMigrate gets a migration instead of
blocking, one migration in flight per node (docs/design.md §5 "Live migration").

The over-allocation oracle is the double's stored claims summed here per node.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from unit.controllers import test_controllers_device_health as dra

from controllers import draining as drainingmod
from gpuoperator import names
from gpuoperator.claim_status import ClaimStatus
from gpuoperator.ledger import Ledger
from gpuoperator.model import slimming
from gpuoperator.runtime.client import Kind
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import ClaimStore, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
RESOURCE = "nvidia.com/GA102GL_A10"


class Api(ClaimStore):
    def __init__(self) -> None:
        super().__init__()
        #: the migrations created, in order, as the API server stored them
        self.created: list[Obj] = []

    def create(self, _kind: Kind, obj: Obj) -> Obj:
        stored = copy.deepcopy(obj)
        meta = stored["metadata"]
        meta["name"] = f"{meta['generateName']}{len(self.created):05d}"
        meta["uid"] = f"uid-{meta['name']}"
        meta["creationTimestamp"] = f"2026-01-01T00:01:{len(self.created):02d}Z"
        self.created.append(stored)
        return copy.deepcopy(stored)

    def held(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.claims.values():
            if c["status"].get("phase") == "Bound":
                out[c["status"]["nodeName"]] = out.get(c["status"]["nodeName"], 0) + int(
                    c["spec"]["count"]
                )
        return out


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def event(self, obj: Obj, type_: str, reason: str, message: str, **_: Any) -> None:
        self.seen.append((obj["metadata"]["name"], reason, message))


def node(name: str, units: int, *, cordoned: bool = False) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "capacity": {RESOURCE: str(units)},
            "allocatable": {RESOURCE: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def claim(
    name: str, count: int, second: int, node_name: str, class_name: str = "a10", **status: Any
) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": f"2026-01-01T00:00:{second:02d}Z",
        },
        "spec": {"className": class_name, "count": count},
        "status": {"phase": "Bound", "nodeName": node_name, **status},
    }


class World:
    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.api = Api()
        self.events = Events()
        statuses = ClaimStatus(
            self.api,
            self.ledger,
            self.events,
            registry=CollectorRegistry(),
        )
        self.controller = drainingmod.Draining(
            self.caches,
            self.ledger,
            statuses,
            self.events,
            Settings.model_validate(settings),
            writer=self.api,
            clock=self.clock,
            registry=CollectorRegistry(),
        )
        for name, mode in (("a10", "passthrough"), ("l40s", "vgpu")):
            cls = {
                "metadata": {"name": name},
                "spec": {"mode": mode, "source": {"devicePlugin": {"resourceName": RESOURCE}}},
            }
            self.caches.classes.store.put(cls)
            self.ledger.apply_class(cls)

    def put_node(self, obj: Obj) -> None:
        self.caches.nodes.store.put(obj)
        self.ledger.apply_node(obj)

    def put_claim(self, obj: Obj) -> None:
        self.api.store(obj)
        self.sync()

    def put_vm(self, obj: Obj) -> None:
        """A VM instance as the cache keeps it."""
        self.caches.vmis.store.put(slimming.slim_vmi(obj))

    def sync(self) -> None:
        for stored in self.api.claims.values():
            self.caches.claims.store.put(copy.deepcopy(stored))
            self.ledger.apply_claim(copy.deepcopy(stored))

    def drain(self, name: str) -> None:
        self.controller.reconcile(("", name))
        self.sync()

    def where(self, name: str) -> str:
        return str(self.api.claims[name]["status"]["nodeName"])


def test_idle_holds_move_one_decision_at_a_time_and_never_overfill() -> None:
    w = World()
    w.put_node(node("n1", 8, cordoned=True))
    w.put_node(node("roomy", 3))
    w.put_node(node("tight", 2))
    w.put_claim(claim("older", 2, 1, "n1"))
    w.put_claim(claim("younger", 2, 2, "n1"))
    w.put_claim(claim("vm", 1, 0, "n1", attachment={"vmi": "vm-1", "uid": "v1"}))

    w.drain("n1")

    # Binpack: the older hold takes the node with the least free that fits (tight: 2); the
    # younger then fits only on roomy (3). The attached claim stays.
    assert (w.where("older"), w.where("younger"), w.where("vm")) == ("tight", "roomy", "n1")
    held = w.api.held()
    assert held == {"n1": 1, "tight": 2, "roomy": 2}
    assert all(held[n] <= units for n, units in (("tight", 2), ("roomy", 3)))
    moved = [(who, msg) for who, reason, msg in w.events.seen if reason == "Moved"]
    assert moved == [
        ("older", "moved from n1 to tight: node cordoned"),
        ("younger", "moved from n1 to roomy: node cordoned"),
    ]
    blocked = [msg for who, reason, msg in w.events.seen if reason == "DrainBlocked"]
    assert len(blocked) == 1
    assert f"{NS}/vm-1 (not running; claim vm, 1 unit(s))" in blocked[0]
    bound = next(c for c in w.api.claims["older"]["status"]["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"]) == ("True", "Moved")

    writes = w.api.writes
    w.drain("n1")  # nothing left to do: no write, nothing told again
    assert w.api.writes == writes
    assert len([r for _, r, _ in w.events.seen if r == "DrainBlocked"]) == 1


def test_a_hold_that_fits_nowhere_stays_with_a_condition_until_the_node_is_uncordoned() -> None:
    w = World()
    w.put_node(node("n1", 4, cordoned=True))
    w.put_node(node("small", 1))
    w.put_claim(claim("big", 3, 1, "n1"))

    w.drain("n1")
    assert w.where("big") == "n1"
    cond = next(
        c for c in w.api.claims["big"]["status"]["conditions"] if c["type"] == "NodeCordoned"
    )
    assert (cond["status"], cond["reason"]) == ("True", "CannotMove")
    assert "no other eligible node has 3 free units" in cond["message"]
    assert [r for _, r, _ in w.events.seen] == ["CannotMove"]
    writes = w.api.writes
    w.drain("n1")
    assert w.api.writes == writes, "the same report is not written again"

    w.put_node(node("n1", 4))
    w.drain("n1")
    assert all(c["type"] != "NodeCordoned" for c in w.api.claims["big"]["status"]["conditions"])
    assert w.where("big") == "n1"


def test_with_moves_off_nothing_moves() -> None:
    w = World(drainMoves="false")
    w.put_node(node("n1", 4, cordoned=True))
    w.put_node(node("n2", 4))
    w.put_claim(claim("idle", 1, 1, "n1"))
    w.drain("n1")
    assert w.where("idle") == "n1"
    assert w.api.writes == 0


def test_a_move_never_takes_units_another_decision_assumed() -> None:
    w = World()
    w.put_node(node("n1", 4, cordoned=True))
    w.put_node(node("n2", 2))
    w.put_claim(claim("idle", 2, 1, "n1"))
    # A binding of the binder's, assumed into the ledger and not yet written, takes n2.
    pending = claim("new", 2, 5, "n2")
    w.api.store({**pending, "status": {"phase": "Pending"}})
    w.sync()
    w.ledger.assume({**w.api.claims["new"], "status": pending["status"]})
    w.drain("n1")
    assert w.where("idle") == "n1"


def test_a_stuck_hold_that_loses_its_node_loses_the_condition() -> None:
    w = World()
    w.put_node(node("n1", 4, cordoned=True))
    w.put_claim(claim("big", 3, 1, "n1"))
    w.drain("n1")
    assert any(c["type"] == "NodeCordoned" for c in w.api.claims["big"]["status"]["conditions"])
    stored = w.api.claims["big"]
    w.api.store({**stored, "status": {**stored["status"], "phase": "Pending", "nodeName": None}})
    w.sync()
    w.controller.reconcile((NS, "big"))  # the claim's own key: it is on no cordoned node
    assert all(c["type"] != "NodeCordoned" for c in w.api.claims["big"]["status"]["conditions"])


# ---- DRA classes: the hold moves through its ResourceClaim ---------------------------------


def dra_world(n1: list[str], n2: list[str]) -> tuple[dra.World, drainingmod.Draining, Events]:
    """Device health's DRA world with node n1 cordoned and a draining controller on it."""
    world = dra.World(n1, n2)
    cordoned = objects.node("n1", {})
    cordoned["spec"] = {"unschedulable": True}
    world.caches.nodes.store.put(cordoned)
    world.ledger.apply_node(cordoned)
    events = Events()
    drain = drainingmod.Draining(
        world.caches,
        world.ledger,
        world.statuses,
        events,
        Settings.model_validate({}),
        clock=world.clock,
        registry=CollectorRegistry(),
        holds=world.api,
    )
    return world, drain, events


def test_an_idle_dra_hold_leaves_a_cordoned_node_through_its_resource_claim() -> None:
    world, drain, _ = dra_world(["gpu-0"], ["gpu-0", "gpu-1"])
    world.bound("idle", "gpu-0")
    world.bound("there", "gpu-0", node="n2")
    before = len(world.api.writes())

    assert drain.reconcile(("", "n1")) is None

    assert world.verbs()[before:] == [
        ("delete", "ResourceClaim"),
        ("create", "ResourceClaim"),
        ("replace_status", "ResourceClaim"),
        ("replace_status", "GPUClaim"),
    ]
    assert world.allocation("idle") == [("n2", "gpu-1")]
    assert world.allocation("there") == [("n2", "gpu-0")]
    status = world.status("idle")
    assert status["nodeName"] == "n2"
    assert status["devices"] == [{"driver": dra.DRIVER, "pool": "n2", "device": "gpu-1"}]
    bound = dra.condition(status, "Bound")
    assert bound is not None and bound["reason"] == "Moved"
    assert bound["message"] == "moved from n1 to n2: node cordoned"
    [event] = [e for e in world.recorder.events if e["name"] == "idle"]
    assert (event["type"], event["reason"]) == ("Normal", "Moved")


def test_a_dra_hold_that_fits_nowhere_stays_cannot_move() -> None:
    world, drain, _ = dra_world(["gpu-0"], ["gpu-0"])
    world.bound("idle", "gpu-0")
    world.bound("there", "gpu-0", node="n2")

    drain.reconcile(("", "n1"))

    assert world.allocation("idle") == [("n1", "gpu-0")]
    flagged = dra.condition(world.status("idle"), "NodeCordoned")
    assert flagged is not None and flagged["reason"] == "CannotMove"
    assert "1 free unit of DeviceClass a10.example.com" in flagged["message"]


def test_a_dra_hold_serving_a_vm_stays_and_blocks_the_drain() -> None:
    world, drain, events = dra_world(["gpu-0"], ["gpu-0"])
    world.bound("serving", "gpu-0", attachment={"vmi": "vm-1", "uid": "vmi-uid"})
    vmi = {
        "metadata": {"name": "vm-1", "namespace": dra.NS, "uid": "vmi-uid"},
        "status": {"phase": "Running", "nodeName": "n1"},
    }
    world.caches.vmis.store.put(vmi)
    before = len(world.api.writes())

    drain.reconcile(("", "n1"))

    assert world.api.writes()[before:] == []
    assert [r for _, r, _ in events.seen] == ["DrainBlocked"]


# -- live migration ----------------------------------------------------------------------------


def vmi(
    name: str, node_name: str, *, strategy: str | None = "LiveMigrate", phase: str = "Running"
) -> Obj:
    """A VM instance on held claim ``<name>-hold``, running on ``node_name``."""
    spec: Obj = {} if strategy is None else {"evictionStrategy": strategy}
    return {
        "apiVersion": names.KUBEVIRT_API_VERSION,
        "kind": names.VMI_KIND,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {names.CLAIMS_LABEL: names.TRUE},
            "annotations": {names.CLAIMS_ANNOTATION: f'[{{"claim":"{name}-hold"}}]'},
        },
        "spec": spec,
        "status": {"phase": phase, "nodeName": node_name},
    }


def migrating_world(*vms: str, class_name: str = "l40s", **settings: Any) -> World:
    """Cordoned n1 with room on n2; each of ``vms`` runs on n1 on its held claim."""
    w = World(**settings)
    w.put_node(node("n1", 4, cordoned=True))
    w.put_node(node("n2", 4))
    for second, name in enumerate(vms):
        w.put_vm(vmi(name, "n1"))
        w.put_claim(
            claim(
                f"{name}-hold",
                1,
                second,
                "n1",
                class_name,
                attachment={"vmi": name, "uid": f"uid-{name}"},
            )
        )
    return w


def condition(w: World, name: str) -> Obj | None:
    found = w.api.claims[name]["status"].get("conditions") or []
    return next((c for c in found if c["type"] == "NodeCordoned"), None)


def reasons(w: World) -> list[str]:
    return [r for _, r, _ in w.events.seen]


def test_a_running_vgpu_vm_that_live_migrates_gets_a_migration_instead_of_blocking() -> None:
    w = migrating_world("vm-1")

    w.drain("n1")

    [made] = w.api.created
    assert made["apiVersion"] == "kubevirt.io/v1"
    assert made["kind"] == "VirtualMachineInstanceMigration"
    assert made["spec"] == {"vmiName": "vm-1"}
    assert made["metadata"]["namespace"] == NS
    assert made["metadata"]["generateName"] == "vm-1-drain-"
    assert made["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-operator"}
    assert made["metadata"]["annotations"] == {"gpu.cozystack.io/drained-node": "n1"}
    assert "DrainBlocked" not in reasons(w)
    assert ("n1", "DrainMigrating") in [(who, r) for who, r, _ in w.events.seen]
    cond = condition(w, "vm-1-hold")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "DrainMigrating")
    assert made["metadata"]["name"] in cond["message"]
    assert w.where("vm-1-hold") == "n1"  # the claim moves with the VM, not before

    # Not again: neither while the watch has not shown it, nor once it has.
    w.drain("n1")
    w.caches.migrations.store.put(copy.deepcopy(made))
    w.drain("n1")
    made["status"] = {"phase": "Running"}
    w.caches.migrations.store.put(copy.deepcopy(made))
    w.drain("n1")
    assert len(w.api.created) == 1
    assert reasons(w).count("DrainMigrating") == 2  # the node's Event and the claim's, once


def test_one_migration_in_flight_per_node_the_next_once_it_has_ended() -> None:
    w = migrating_world("vm-1", "vm-2")

    w.drain("n1")
    [first] = w.api.created
    assert first["spec"]["vmiName"] == "vm-1"  # the oldest hold first
    queued = condition(w, "vm-2-hold")
    assert queued is not None
    assert queued["reason"] == "DrainMigrationQueued"
    assert first["metadata"]["name"] in queued["message"]
    w.caches.migrations.store.put({**copy.deepcopy(first), "status": {"phase": "Running"}})
    w.drain("n1")
    assert len(w.api.created) == 1

    # It succeeded: the VM and its claim are on n2 now.
    w.caches.migrations.store.put({**copy.deepcopy(first), "status": {"phase": "Succeeded"}})
    w.put_vm(vmi("vm-1", "n2"))
    stored = w.api.claims["vm-1-hold"]
    w.api.store({**stored, "status": {**stored["status"], "nodeName": "n2"}})
    w.sync()
    w.drain("n1")
    assert [m["spec"]["vmiName"] for m in w.api.created] == ["vm-1", "vm-2"]
    cond = condition(w, "vm-2-hold")
    assert cond is not None
    assert cond["reason"] == "DrainMigrating"


def test_a_migration_another_made_holds_the_nodes_turn() -> None:
    w = migrating_world("vm-1")
    w.caches.migrations.store.put(
        {
            "metadata": {"name": "by-hand", "namespace": NS, "uid": "u-hand"},
            "spec": {"vmiName": "vm-1"},
            "status": {"phase": "Scheduling"},
        }
    )
    w.drain("n1")
    assert w.api.created == []
    cond = condition(w, "vm-1-hold")
    assert cond is not None
    assert (cond["reason"], "by-hand" in cond["message"]) == ("DrainMigrating", True)


def test_after_a_failed_migration_the_next_waits_its_retry_time() -> None:
    w = migrating_world("vm-1")
    w.drain("n1")
    [first] = w.api.created
    w.caches.migrations.store.put({**copy.deepcopy(first), "status": {"phase": "Failed"}})

    result = w.controller.reconcile(("", "n1"))
    assert result is not None
    assert 0 < (result.requeue_after or 0) <= drainingmod.MIGRATION_RETRY
    assert len(w.api.created) == 1

    w.clock.advance(drainingmod.MIGRATION_RETRY)
    w.drain("n1")
    assert len(w.api.created) == 2


def test_the_cluster_wide_strategy_applies_where_the_vm_sets_none() -> None:
    w = migrating_world("vm-1", "vm-2")
    w.put_vm(vmi("vm-1", "n1", strategy=None))
    w.put_vm(vmi("vm-2", "n1", strategy="None"))
    w.caches.kubevirts.store.put(
        {
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"evictionStrategy": "LiveMigrate"}},
        }
    )
    w.drain("n1")
    assert [m["spec"]["vmiName"] for m in w.api.created] == ["vm-1"]
    [blocked] = [msg for _, r, msg in w.events.seen if r == "DrainBlocked"]
    assert f"{NS}/vm-2 (running" in blocked
    assert "vm-1" not in blocked


@pytest.mark.parametrize(
    ("setup", "settings"),
    [
        pytest.param(lambda w: None, {"drainMoves": "false"}, id="drain-moves-off"),
        pytest.param(lambda w: w.put_vm(vmi("vm-1", "n1", strategy=None)), {}, id="no-strategy"),
        pytest.param(
            lambda w: w.put_vm(vmi("vm-1", "n1", phase="Scheduling")), {}, id="not-running-yet"
        ),
    ],
)
def test_a_vm_that_does_not_live_migrate_blocks_the_drain(
    setup: Any, settings: dict[str, str]
) -> None:
    w = migrating_world("vm-1", **settings)
    setup(w)
    w.drain("n1")
    assert w.api.created == []
    assert "DrainBlocked" in reasons(w)
    assert condition(w, "vm-1-hold") is None


def test_a_passthrough_vm_never_migrates() -> None:
    w = migrating_world("vm-1", class_name="a10")
    w.drain("n1")
    assert w.api.created == []
    assert "DrainBlocked" in reasons(w)
