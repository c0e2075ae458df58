"""Class status over the fake API server and the product's caches and ledger, wired by its
own ``register``: a class gets its protection finalizer and its figures (free units, the most
free on one node, eligible nodes, ``Available``, ``observedGeneration``) in one status write
and nothing more while nothing changes; a class with no eligible node is not Available; a
class being deleted is held while claims name it (told once per change) and released when
none does; a class without the finalizer or gone is not written."""

from __future__ import annotations

import pytest
import structlog

from controllers import class_status
from gpuoperator import names
from gpuoperator.kinds import GPUClass
from gpuoperator.runtime.controlling import Result
from gpuoperator.settings import Settings
from harness import objects
from harness.objects import A10
from harness.offline import OfflineCluster

FINALIZER = names.CLASS_PROTECTION_FINALIZER


class World(OfflineCluster):
    def __init__(self) -> None:
        super().__init__()
        # Every change written at once (statusInterval 0): these tests are about what is
        # written; the coalescing of writes has tests of its own.
        class_status.register(
            self.manager,
            self.caches,
            self.ledger,
            self.recorder,
            Settings.model_validate({"statusInterval": 0}),
        )
        self.reconciler = self.manager.reconcilers[class_status.NAME]

    def reconcile(self, name: str = "a10") -> Result | None:
        return self.reconciler.reconcile(("", name))

    def stored_class(self, name: str = "a10") -> objects.Obj:
        stored = self.api.stored(GPUClass, name)
        assert stored is not None
        return stored

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, kind) for verb, kind, _, _ in self.api.writes()]


@pytest.fixture
def world() -> World:
    return World()


def test_a_new_class_gets_its_finalizer_and_its_figures_in_one_status_write(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass(generation=3))
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.put(world.caches.nodes, objects.node("n2", 2))
    world.put(world.caches.claims, objects.claim("one", count=3, phase="Bound", node="n1"))

    assert world.reconcile() is None

    assert world.verbs() == [("replace", "GPUClass"), ("replace_status", "GPUClass")]
    stored = world.stored_class()
    assert stored["metadata"]["finalizers"] == [FINALIZER]
    status = stored["status"]
    # 4 + 2 allocatable, 3 held on n1: 1 free there, 2 on n2.
    assert (status["free"], status["maxFreePerNode"], status["nodes"]) == (3, 2, 2)
    assert status["observedGeneration"] == 3
    [available] = status["conditions"]
    assert (available["type"], available["status"], available["reason"]) == (
        "Available",
        "True",
        "EligibleNodes",
    )
    assert available["observedGeneration"] == 3
    assert A10 in available["message"]
    assert world.recorder.events == []


def test_a_class_whose_figures_did_not_change_is_not_written_again(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass())
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.reconcile()
    world.sync(world.caches.classes, "a10")
    written = len(world.api.writes())

    assert world.reconcile() is None
    assert world.reconcile() is None

    assert len(world.api.writes()) == written


def test_a_class_is_written_again_when_a_claim_takes_its_units(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass())
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.reconcile()
    world.sync(world.caches.classes, "a10")

    world.put(world.caches.claims, objects.claim("one", count=3, phase="Bound", node="n1"))
    world.reconcile()

    assert world.verbs()[-1] == ("replace_status", "GPUClass")
    assert world.stored_class()["status"]["free"] == 1


def test_a_class_with_no_eligible_node_is_not_available(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass())
    world.put(world.caches.nodes, objects.node("n1", 4, ready=False))
    world.put(world.caches.nodes, objects.node("n2", 4, cordoned=True))

    with structlog.testing.capture_logs() as logs:
        assert world.reconcile() is None

    status = world.stored_class()["status"]
    assert (status["free"], status["maxFreePerNode"], status["nodes"]) == (0, 0, 0)
    [available] = status["conditions"]
    assert (available["status"], available["reason"]) == ("False", "NoEligibleNode")
    assert [e["reason"] for e in logs if e["event"] == "class availability"] == ["NoEligibleNode"]


def test_a_held_class_deletion_is_told_once_per_change_not_every_pass(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass(deleting=True, finalizers=[FINALIZER]))
    world.put(world.caches.claims, objects.claim("one", namespace="t", rv=1))

    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert world.reconcile() is None
        world.put(world.caches.claims, objects.claim("two", namespace="t", rv=1))  # told again
        assert world.reconcile() is None

    told = [e for e in logs if e["log_level"] == "info"]
    assert [e["event"] for e in told] == ["class deletion held"] * 2
    assert [e["claims"] for e in told] == [1, 2]
    assert world.recorder.reasons() == ["DeletionHeld"] * 2
    assert world.recorder.events[-1]["kind"] == names.GPU_CLASS
    assert "t/one, t/two" in world.recorder.events[-1]["message"]
    assert world.api.writes() == []  # nothing is written while claims remain


def test_a_deleted_class_no_claim_names_is_released(world: World) -> None:
    world.put(
        world.caches.classes,
        objects.gpuclass(deleting=True, finalizers=["example.com/other", FINALIZER]),
    )
    world.put(world.caches.claims, objects.claim("elsewhere", class_name="l40s"))

    assert world.reconcile() is None

    assert world.verbs() == [("replace", "GPUClass")]
    assert world.stored_class()["metadata"]["finalizers"] == ["example.com/other"]
    assert world.recorder.events == []


def test_a_deleted_class_without_the_finalizer_is_left_alone(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass(deleting=True, finalizers=["example.com/x"]))
    world.put(world.caches.claims, objects.claim("one"))

    assert world.reconcile() is None
    assert world.api.writes() == [] and world.recorder.events == []


def test_a_class_gone_from_the_cache_writes_nothing(world: World) -> None:
    assert world.reconcile("gone") is None
    assert world.api.calls == [] and world.recorder.events == []


def test_class_status_is_woken_by_its_classes_their_claims_and_inventory_changes(
    world: World,
) -> None:
    [(classes, by_class), (claims, by_claim), (changes, by_change)] = world.manager.sources[
        class_status.NAME
    ]
    assert (classes, claims, changes) == (
        world.caches.classes,
        world.caches.claims,
        world.ledger.changes,
    )
    assert list(by_class(objects.gpuclass("l40s"))) == [("", "l40s")]
    assert list(by_claim(objects.claim(class_name="l40s"))) == [("", "l40s")]
    assert list(by_change({"nodes": ["n1"], "classes": ["a10", "l40s"]})) == [
        ("", "a10"),
        ("", "l40s"),
    ]


def test_a_guaranteed_class_beside_a_spot_class_publishes_what_it_may_take_back(
    world: World,
) -> None:
    world.put(world.caches.classes, objects.gpuclass(generation=1))
    world.put(world.caches.classes, objects.gpuclass("a10-spot", generation=1, preemptible=True))
    world.put(world.caches.nodes, objects.node("n1", 4))
    world.put(
        world.caches.claims,
        objects.claim("idle", class_name="a10-spot", count=3, phase="Bound", node="n1"),
    )
    world.put(
        world.caches.claims,
        objects.claim(
            "vm",
            class_name="a10-spot",
            count=1,
            phase="Bound",
            node="n1",
            attached={"vmi": "vm1", "uid": "u1"},
        ),
    )
    world.reconcile()
    world.reconcile("a10-spot")
    status = world.stored_class()["status"]
    # Nothing free; the idle 3 may be taken back at once, the VM's unit after its notice.
    assert (status["maxFreePerNode"], status["reclaimable"], status["maxReclaimablePerNode"]) == (
        0,
        4,
        4,
    )
    spot = world.stored_class("a10-spot")["status"]
    assert "reclaimable" not in spot and "maxReclaimablePerNode" not in spot
