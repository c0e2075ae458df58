"""Node inventory over the fake API server and the product's caches and ledger, wired by
its own ``register``: a node with GPU resources gets a GPUNode owned by the Node, with its
devices, its classes' free units, ``Schedulable`` and ``Overcommitted`` in one status write,
and nothing more while nothing changes; a GPUNode whose node is gone or has no GPU resource
is deleted with its uid as precondition; a name taken behind the cache is looked at again;
pods that overrun the holds are named, with one Warning Event per episode."""

from __future__ import annotations

import pytest
import structlog

from controllers import node_inventory
from gpuoperator import names
from gpuoperator.kinds import GPUNode, ResourceSlice
from gpuoperator.runtime.controlling import Result
from gpuoperator.settings import Settings
from harness import objects
from harness.objects import A10
from harness.offline import OfflineCluster

Obj = objects.Obj


class World(OfflineCluster):
    def __init__(self) -> None:
        super().__init__()
        # Every change written at once (statusInterval 0): these tests are about what is
        # written; the coalescing of writes has tests of its own.
        node_inventory.register(
            self.manager,
            self.caches,
            self.ledger,
            self.recorder,
            Settings.model_validate({"statusInterval": 0}),
        )
        self.reconciler = self.manager.reconcilers[node_inventory.NAME]
        self.put(self.caches.classes, objects.gpuclass())

    def reconcile(self, name: str = "n1") -> Result | None:
        return self.reconciler.reconcile(("", name))

    def gpunode(self, name: str = "n1") -> Obj | None:
        return self.api.stored(GPUNode, name)

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, kind) for verb, kind, _, _ in self.api.writes()]

    def condition(self, type_: str) -> tuple[str, str]:
        stored = self.gpunode()
        assert stored is not None
        [found] = [c for c in stored["status"]["conditions"] if c["type"] == type_]
        return found["status"], found["reason"]


@pytest.fixture
def world() -> World:
    return World()


def test_a_gpu_node_gets_a_gpunode_owned_by_it_with_its_figures(world: World) -> None:
    world.put(world.caches.nodes, objects.node("n1", 4, uid="node-uid-1"))
    world.put(world.caches.claims, objects.claim("one", count=1, phase="Bound", node="n1"))

    assert world.reconcile() is None

    assert world.verbs() == [("create", "GPUNode"), ("replace_status", "GPUNode")]
    stored = world.gpunode()
    assert stored is not None
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "n1",
            "uid": "node-uid-1",
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    status = stored["status"]
    assert status["devices"] == [
        {"resourceName": A10, "capacity": 4, "allocatable": 4, "allocated": 1, "free": 3}
    ]
    assert status["classes"] == [{"name": "a10", "free": 3}]
    assert world.condition("Schedulable") == ("True", "Ready")
    assert world.condition("Overcommitted") == ("False", "WithinCapacity")
    assert world.recorder.events == []


def test_an_unchanged_node_is_not_written_again(world: World) -> None:
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.reconcile()
    world.sync(world.caches.gpunodes, "n1")
    written = len(world.api.writes())

    assert world.reconcile() is None
    assert world.reconcile() is None

    assert len(world.api.writes()) == written


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (objects.node("n1", 4, ready=False), "NotReady"),
        (objects.node("n1", 4, cordoned=True), "Cordoned"),
    ],
    ids=["not-ready", "cordoned"],
)
def test_a_node_that_takes_no_vm_is_not_schedulable(world: World, node: Obj, reason: str) -> None:
    world.put(world.caches.nodes, node)
    assert world.reconcile() is None
    assert world.condition("Schedulable") == ("False", reason)


def test_a_node_without_gpu_resources_gets_no_gpunode(world: World) -> None:
    world.put(world.caches.nodes, objects.node("n1", {"cpu": 8}))
    assert world.reconcile() is None
    assert world.api.writes() == []


def test_the_gpunode_of_a_node_without_gpu_resources_is_deleted_by_uid(world: World) -> None:
    world.put(world.caches.nodes, objects.node("n1", {"cpu": 8}))
    gpunode = world.put(world.caches.gpunodes, {"metadata": {"name": "n1", "uid": "g-1"}})

    with structlog.testing.capture_logs() as logs:
        assert world.reconcile() is None

    assert world.api.writes() == [("delete", "GPUNode", "n1", {"uid": gpunode["metadata"]["uid"]})]
    assert world.gpunode() is None
    assert [e["reason"] for e in logs if e["event"] == "gpunode deleted"] == ["NoGPUResources"]


def test_the_gpunode_of_a_node_that_is_gone_is_deleted(world: World) -> None:
    world.put(world.caches.gpunodes, {"metadata": {"name": "n1"}})
    assert world.reconcile() is None
    assert world.verbs() == [("delete", "GPUNode")]


def test_a_gpunode_already_deleted_is_not_an_error(world: World) -> None:
    world.put(world.caches.gpunodes, {"metadata": {"name": "n1"}})
    world.api.remove(GPUNode, "n1")
    assert world.reconcile() is None
    assert world.verbs() == [("delete", "GPUNode")]


def test_a_gpunode_that_exists_behind_the_cache_is_looked_at_again(world: World) -> None:
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.api.add(GPUNode, {"metadata": {"name": "n1"}})  # not delivered to the cache yet

    result = world.reconcile()

    assert result is not None and result.requeue_after == 1.0
    assert world.verbs() == [("create", "GPUNode")]  # refused; no status write


def test_pods_that_overrun_the_holds_are_named_with_one_warning_per_episode(
    world: World,
) -> None:
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.put(world.caches.claims, objects.claim("hold", count=3, phase="Bound", node="n1"))
    world.put(world.caches.gpunodes, {"metadata": {"name": "n1"}})
    hog = objects.pod(
        "hog", node_name="n1", requests={A10: "2"}, limits={A10: "2"}, phase="Running"
    )
    world.put(world.caches.pods, hog)

    assert world.reconcile() is None

    assert world.condition("Overcommitted") == ("True", "PodsOverrunHolds")
    [event] = world.recorder.events
    assert (event["type"], event["reason"], event["kind"]) == (
        "Warning",
        "Overcommitted",
        names.GPU_NODE,
    )
    assert f"{A10}: pods {objects.NS}/hog use units held by claims" in event["message"]

    # Still overrun, with other figures: written again, but not told again.
    world.sync(world.caches.gpunodes, "n1")
    world.put(world.caches.claims, objects.claim("more", count=1, phase="Bound", node="n1"))
    world.reconcile()
    assert world.verbs()[-1] == ("replace_status", "GPUNode")
    assert len(world.recorder.events) == 1

    # The pod goes: the episode ends; a new overrun is told again.
    world.sync(world.caches.gpunodes, "n1")
    world.caches.pods.store.remove((objects.NS, "hog"))
    world.ledger.delete_pod(hog)
    world.reconcile()
    assert world.condition("Overcommitted") == ("False", "WithinCapacity")
    world.sync(world.caches.gpunodes, "n1")
    world.put(world.caches.pods, hog)
    world.reconcile()
    assert world.recorder.reasons() == ["Overcommitted", "Overcommitted"]


def test_a_node_with_only_dra_devices_gets_a_gpunode_with_their_figures(world: World) -> None:
    selector = f'device.driver == "{objects.DRA_DRIVER}"'
    world.put(
        world.caches.classes,
        objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "a10.example.com"}}),
    )
    world.put(
        world.caches.device_classes,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "a10.example.com"},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
    )
    published = objects.resource_slice("d1", {"gpu-0": {}, "gpu-1": {}})
    published["spec"]["devices"][1]["taints"] = [{"key": "bad", "effect": "NoSchedule"}]
    world.put(world.caches.resource_slices, published)
    world.put(world.caches.nodes, objects.node("d1", {}))

    assert world.reconcile("d1") is None

    stored = world.gpunode("d1")
    assert stored is not None
    assert stored["status"]["devices"] == []
    assert stored["status"]["draDevices"] == [
        {
            "name": "dra-a10",
            "deviceClassName": "a10.example.com",
            "count": 2,
            "allocated": 0,
            "tainted": 1,
            "free": 1,
        }
    ]
    # The slice goes: no device of any class and no GPU resource, so no GPUNode.
    world.api.remove(ResourceSlice, published["metadata"]["name"])
    world.sync(world.caches.resource_slices, published["metadata"]["name"])
    world.sync(world.caches.gpunodes, "d1")
    world.reconcile("d1")
    assert world.gpunode("d1") is None
