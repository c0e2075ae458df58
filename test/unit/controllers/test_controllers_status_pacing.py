"""GPUNode and GPUClass figures are written at most once per ``statusInterval`` per object:
an object's changes are gathered for one interval from the first one seen and written
together, so the figures are never more than an interval behind the ledger; a status the
controller wrote counts as current until the cache delivers it, so no write leaves on a
replaced version."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers import class_status, node_inventory
from gpuoperator import names, settings
from gpuoperator.ledger import Ledger
from gpuoperator.runtime.client import Kind
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Result
from harness.offline import FakeRecorder, offline_caches

Obj = dict[str, Any]
RESOURCE = "nvidia.com/GA102GL_A10"
INTERVAL = 5.0


class Writer:
    """Records status writes and answers each with the object at the next resourceVersion."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, Obj]] = []  # (kind, name, status)
        self.preconditions: list[str] = []
        self.rv = 100

    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        self.rv += 1
        self.preconditions.append(obj["metadata"]["resourceVersion"])
        self.statuses.append((kind.kind, obj["metadata"]["name"], obj["status"]))
        out = copy.deepcopy(obj)
        out["metadata"]["resourceVersion"] = str(self.rv)
        return out

    def replace(self, _kind: Kind, obj: Obj) -> Obj:
        return obj

    def create(self, kind: Kind, obj: Obj) -> Obj:
        raise AssertionError(f"no {kind.kind} is created here: {obj['metadata']['name']}")

    def delete(self, kind: Kind, name: str, *_: Any, **__: Any) -> None:
        raise AssertionError(f"no {kind.kind} is deleted here: {name}")


def gpu_class() -> Obj:
    return {
        "metadata": {
            "name": "a10",
            "uid": "u-class",
            "resourceVersion": "1",
            "generation": 1,
            "finalizers": [names.CLASS_PROTECTION_FINALIZER],
        },
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
    }


def node(units: int = 8) -> Obj:
    return {
        "metadata": {"name": "n1", "uid": "u-node", "resourceVersion": "1"},
        "spec": {},
        "status": {
            "capacity": {RESOURCE: str(units)},
            "allocatable": {RESOURCE: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def claim(name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "t", "resourceVersion": "5", "uid": name},
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.writer = Writer()
        self.caches.classes.store.put(gpu_class())
        self.ledger.apply_class(gpu_class())
        self.ledger.apply_node(node())
        self.caches.gpunodes.store.put(
            {"metadata": {"name": "n1", "uid": "u-gpunode", "resourceVersion": "1"}}
        )

    def bind(self, name: str) -> None:
        self.ledger.apply_claim(claim(name))


@pytest.fixture
def world() -> World:
    return World()


def nodes(world: World, interval: float = INTERVAL) -> node_inventory.NodeInventory:
    return node_inventory.NodeInventory(
        world.caches,
        world.ledger,
        world.writer,
        FakeRecorder(),
        clock=world.clock,
        registry=CollectorRegistry(),
        status_interval=interval,
    )


def classes(world: World, interval: float = INTERVAL) -> class_status.ClassStatus:
    return class_status.ClassStatus(
        world.caches,
        world.ledger,
        world.writer,
        FakeRecorder(),
        clock=world.clock,
        registry=CollectorRegistry(),
        status_interval=interval,
    )


def free_written(status: Obj) -> int:
    if "free" in status:  # a GPUClass
        return int(status["free"])
    return int(status["devices"][0]["free"])


@pytest.mark.parametrize("make", [nodes, classes], ids=["gpunode", "gpuclass"])
def test_figures_are_written_at_most_once_per_interval_and_the_last_change_lands(
    world: World, make: Any
) -> None:
    reconciler = make(world)
    key = ("", "n1") if make is nodes else ("", "a10")
    assert reconciler.reconcile(key) is None  # an object without status is written at once
    for i in range(3):
        world.bind(f"c{i}")
        world.clock.advance(1.0)
        result = reconciler.reconcile(key)
        assert isinstance(result, Result)
        # The first change seen (c0, at 1 s) waits one interval; the others join it.
        assert result.requeue_after == pytest.approx(INTERVAL - i)
    assert len(world.writer.statuses) == 1
    world.clock.advance(result.requeue_after)
    assert reconciler.reconcile(key) is None
    assert [free_written(s) for _k, _n, s in world.writer.statuses] == [8, 5]
    # The second write rested on the first write's reply, not on the stale cached version.
    assert world.writer.preconditions == ["1", "101"]


@pytest.mark.parametrize("make", [nodes, classes], ids=["gpunode", "gpuclass"])
def test_a_burst_after_a_quiet_spell_is_one_write_within_an_interval_of_its_first_change(
    world: World, make: Any
) -> None:
    """A node or class written long ago: its next burst of bindings is gathered from the
    first change seen and written once, exactly one interval after it (the bound the figures
    keep: never more than ``statusInterval`` behind the ledger)."""
    reconciler = make(world)
    key = ("", "n1") if make is nodes else ("", "a10")
    reconciler.reconcile(key)
    world.clock.advance(10 * INTERVAL)  # quiet: the last write is long past
    first_seen = world.clock.monotonic()
    written_at: list[float] = []
    for i in range(8):  # eight bindings over 4 s, each seen by a reconcile at once
        world.bind(f"c{i}")
        before = len(world.writer.statuses)
        result = reconciler.reconcile(key)
        if len(world.writer.statuses) > before:
            written_at.append(world.clock.monotonic())
        assert isinstance(result, Result)
        due = first_seen + INTERVAL - world.clock.monotonic()
        assert result.requeue_after == pytest.approx(due)
        world.clock.advance(0.5)
    world.clock.advance(first_seen + INTERVAL - world.clock.monotonic())
    assert reconciler.reconcile(key) is None
    written_at.append(world.clock.monotonic())
    assert [free_written(s) for _k, _n, s in world.writer.statuses] == [8, 0]
    assert written_at == [first_seen + INTERVAL]


@pytest.mark.parametrize("make", [nodes, classes], ids=["gpunode", "gpuclass"])
def test_an_interval_of_zero_writes_every_change(world: World, make: Any) -> None:
    reconciler = make(world, 0.0)
    key = ("", "n1") if make is nodes else ("", "a10")
    reconciler.reconcile(key)
    world.bind("c0")
    reconciler.reconcile(key)
    assert [free_written(s) for _k, _n, s in world.writer.statuses] == [8, 7]


def test_unchanged_figures_are_not_written_again(world: World) -> None:
    reconciler = nodes(world)
    reconciler.reconcile(("", "n1"))
    world.clock.advance(INTERVAL)
    reconciler.reconcile(("", "n1"))
    assert len(world.writer.statuses) == 1


def test_the_interval_is_a_setting_with_a_default_of_one_second() -> None:
    assert settings.load(None, {}, {}).status_interval == 1.0
    assert settings.load({"statusInterval": "2.5s"}, {}, {}).status_interval == 2.5
    assert settings.load(None, {"GPUOP_STATUS_INTERVAL": "0"}, {}).status_interval == 0.0
    with pytest.raises(settings.SettingsError, match="statusInterval"):
        settings.load(None, {}, {"statusInterval": "soon"})


def test_a_class_figure_that_grows_is_written_at_once(world: World) -> None:
    reconciler = classes(world)
    world.bind("c0")
    reconciler.reconcile(("", "a10"))  # 7 free
    world.clock.advance(1.0)
    world.ledger.delete_claim(claim("c0"))  # the unit is free again: orders may fit
    assert reconciler.reconcile(("", "a10")) is None
    assert [s["maxFreePerNode"] for _k, _n, s in world.writer.statuses] == [7, 8]
