"""The binder on a DRA class (docs/design.md §5 "DRA classes", "Binding"): a claim is bound to
named devices through a ResourceClaim it controls, allocated through the status
subresource, before its own status says so. The oracle is what the API server double holds
(the allocations of the stored ResourceClaims and the stored claims), never the ledger."""

from __future__ import annotations

import copy
import datetime
import functools
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers import binder as bindermod
from gpuoperator import names
from gpuoperator.claim_status import ClaimStatus
from gpuoperator.kinds import GPUClaim, ResourceClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import claim_states, dra_holds
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Kind
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import FakeApi, FakeRecorder, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
DRIVER = objects.DRA_DRIVER
DEVICE_CLASS = "a10.example.com"
CLASS = objects.gpuclass(
    "dra-a10", source={"dra": {"deviceClassName": DEVICE_CLASS, "topologyAttribute": "pcieRoot"}}
)
claim = functools.partial(
    objects.claim, class_name="dra-a10", uid=None, finalizers=[names.CLAIM_PROTECTION_FINALIZER]
)


class DraApi(FakeApi):
    """The harness's API double, with ResourceClaims' status subresource: a status write
    keeps the stored spec and takes only the status, under the resourceVersion."""

    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        if kind.kind != ResourceClaim.kind:
            return super().replace_status(kind, obj)
        meta = obj["metadata"]
        self._record("replace_status", kind, meta["name"], obj)
        self._conflict("replace_status", meta.get("namespace"))
        with self.lock:
            current = self._current(kind, meta["name"], meta.get("namespace"))
            self._precondition(meta.get("resourceVersion") or "missing", current)
            return self.add(kind, {**current, "status": copy.deepcopy(obj.get("status"))})


def slice_of(node: str, roots: list[str]) -> Obj:
    return objects.resource_slice(
        node, {f"gpu-{i}": {"pcieRoot": {"string": root}} for i, root in enumerate(roots)}
    )


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.api = DraApi()
        self.statuses = ClaimStatus(
            self.api, self.ledger, FakeRecorder(), registry=CollectorRegistry()
        )
        self.binder = bindermod.Binder(
            self.caches,
            self.ledger,
            self.statuses,
            Settings.model_validate({}),
            clock=self.clock,
            registry=CollectorRegistry(),
            holds=self.api,
        )
        self.caches.classes.store.put(CLASS)
        self.ledger.apply_class(CLASS)
        self.ledger.apply_device_class({"metadata": {"name": DEVICE_CLASS}, "spec": {}})
        for name, roots in (("n1", ["r0"] * 2 + ["r1"] * 2), ("n2", ["r0"])):
            node = objects.node(name, 0)
            self.caches.nodes.store.put(node)
            self.ledger.apply_node(node)
            self.ledger.apply_resource_slice(slice_of(name, roots))

    def put_claim(self, obj: Obj) -> Obj:
        stored = self.api.add(GPUClaim, obj)
        self.caches.claims.store.put(stored)
        self.ledger.apply_claim(stored)
        return stored

    def reconcile(self) -> object:
        return self.binder.reconcile(("", "dra-a10"))

    def watch_holds(self) -> None:
        """Deliver the stored ResourceClaims to the ledger, as their watch would."""
        with self.api.lock:
            held = [o for (k, _, _), o in self.api.objects.items() if k == "ResourceClaim"]
        for obj in held:
            self.ledger.apply_resource_claim(copy.deepcopy(obj))

    def allocations(self) -> dict[str, list[tuple[str, str]]]:
        """Stored ResourceClaim -> the (pool, device) its allocation holds."""
        with self.api.lock:
            return {
                name: [(r.pool, r.device) for r in dra_holds.allocated(o)]
                for (k, _, name), o in self.api.objects.items()
                if k == "ResourceClaim"
            }

    def status(self, name: str) -> Obj:
        stored = self.api.stored(GPUClaim, name, NS)
        assert stored is not None
        return stored.get("status") or {}


@pytest.fixture
def world() -> World:
    return World()


def test_a_dra_claim_is_bound_to_named_devices_held_by_its_own_allocated_resource_claim(
    world: World,
) -> None:
    stored = world.put_claim(claim("pair", count=2))
    world.reconcile()

    hold = world.api.stored(ResourceClaim, "pair", NS)
    assert hold is not None
    assert dra_holds.is_hold_of(hold, stored)
    assert hold["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    # binpack: n1 is the only node with 2 free; one PCIe root, the first in order.
    assert world.allocations() == {"pair": [("n1", "gpu-0"), ("n1", "gpu-1")]}
    assert hold["status"]["allocation"]["nodeSelector"] == dra_holds.node_selector("n1")
    assert hold["status"]["allocation"]["allocationTimestamp"]
    status = world.status("pair")
    assert (status["phase"], status["nodeName"], status["resourceClaimName"]) == (
        "Bound",
        "n1",
        "pair",
    )
    assert status["devices"] == [
        {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
        {"driver": DRIVER, "pool": "n1", "device": "gpu-1"},
    ]
    # The ResourceClaim is written first, the claim's status last.
    writes = [(verb, kind) for verb, kind, _, _ in world.api.writes()]
    assert writes == [
        ("create", "ResourceClaim"),
        ("replace_status", "ResourceClaim"),
        ("replace_status", "GPUClaim"),
    ]


def test_the_next_pass_never_gives_the_devices_away_before_the_watch_shows_them(
    world: World,
) -> None:
    world.put_claim(claim("first", count=2, created="2026-01-01T00:00:01Z"))
    world.reconcile()
    # Neither the claim's Bound version nor the allocation has been watched yet.
    for name, second in (("second", 2), ("third", 3)):
        world.put_claim(claim(name, count=2, created=f"2026-01-01T00:00:0{second}Z"))
    world.reconcile()

    held = [d for devices in world.allocations().values() for d in devices]
    assert len(held) == len(set(held)) == 4
    assert sorted(world.allocations()) == ["first", "second"]
    assert world.allocations()["second"] == [("n1", "gpu-2"), ("n1", "gpu-3")]
    assert world.status("third")["phase"] == "Pending"


def test_a_tenants_resource_claim_of_the_claims_name_is_never_adopted(world: World) -> None:
    tenants = {"metadata": {"name": "taken", "namespace": NS, "uid": "t-1"}, "spec": {}}
    world.api.add(ResourceClaim, tenants)
    world.ledger.apply_resource_claim(tenants)
    world.put_claim(claim("taken"))
    world.reconcile()

    assert world.allocations() == {"taken": []}
    bound = next(c for c in world.status("taken")["conditions"] if c["type"] == "Bound")
    assert bound["status"] == "False"
    assert "ResourceClaim named taken exists" in bound["message"]
    assert [v for v, *_ in world.api.writes()] == ["replace_status"]  # only the claim's status


def test_a_refused_allocation_write_binds_nothing_and_frees_the_devices(world: World) -> None:
    world.put_claim(claim("one"))
    world.api.conflict_next.add("replace_status")
    world.reconcile()

    assert world.status("one").get("phase") != "Bound"
    inv = world.ledger.dra_inventory("dra-a10")
    assert inv is not None and inv.free == 5  # the assumption is forgotten
    # The hold exists unallocated: the next pass allocates it instead of creating another.
    world.watch_holds()
    world.reconcile()
    assert world.allocations() == {"one": [("n2", "gpu-0")]}
    assert world.status("one")["phase"] == "Bound"


def test_an_allocated_hold_whose_claim_status_failed_is_bound_as_it_is(world: World) -> None:
    world.put_claim(claim("one"))
    refused = errors.ConflictError(409, "Conflict", "the object has been modified")

    def fail_claim(obj: Obj) -> None:
        if obj.get("kind") == "GPUClaim":
            raise refused

    world.api.before["one"] = fail_claim
    world.reconcile()
    assert world.status("one").get("phase") != "Bound"
    assert world.allocations() == {"one": [("n2", "gpu-0")]}

    del world.api.before["one"]
    world.watch_holds()
    world.reconcile()
    status = world.status("one")
    assert (status["phase"], status["nodeName"]) == ("Bound", "n2")
    assert status["devices"] == [{"driver": DRIVER, "pool": "n2", "device": "gpu-0"}]
    assert [v for v, k, *_ in world.api.writes() if k == "ResourceClaim"] == [
        "create",
        "replace_status",
    ]  # nothing allocated twice


def test_a_hold_on_a_node_that_is_gone_is_deleted_and_the_claim_bound_again(world: World) -> None:
    world.put_claim(claim("one"))
    world.reconcile()
    assert world.allocations() == {"one": [("n2", "gpu-0")]}
    world.watch_holds()
    bound = world.api.stored(GPUClaim, "one", NS)
    assert bound is not None
    world.caches.claims.store.put(bound)
    world.ledger.apply_claim(bound)

    gone = world.caches.nodes.store.remove(("", "n2"))
    assert gone is not None
    world.ledger.delete_node(gone)
    world.reconcile()  # Lost, then its hold on n2 is deleted (uid precondition)
    assert world.allocations() == {}
    deletes = [p for v, k, _, p in world.api.writes() if (v, k) == ("delete", "ResourceClaim")]
    assert deletes == [{"uid": "uid-one"}]

    world.ledger.delete_resource_claim({"metadata": {"namespace": NS, "name": "one"}})
    world.reconcile()
    status = world.status("one")
    assert (status["phase"], status["nodeName"]) == ("Bound", "n1")
    assert world.allocations() == {"one": [("n1", "gpu-0")]}


def test_a_hold_on_a_node_that_refused_the_claim_is_not_adopted_but_deleted(world: World) -> None:
    """A waiting claim whose allocated hold sits on a node it must skip (its unexpired
    refusedNodes) is not bound there again: the hold goes, and the claim is bound anew."""
    world.put_claim(claim("one"))
    world.reconcile()
    world.watch_holds()
    bound = world.api.stored(GPUClaim, "one", NS)
    assert bound is not None and bound["status"]["nodeName"] == "n2"
    until = world.clock.now() + datetime.timedelta(minutes=10)
    refused = {
        **bound,
        "status": claim_states.refused(
            bound, "n2", until, "RefusedByNode", "no", world.clock.now()
        ),
    }
    stored = world.api.add(GPUClaim, refused)
    world.caches.claims.store.put(stored)
    world.ledger.apply_claim(stored)

    world.reconcile()
    assert world.allocations() == {}
    world.ledger.delete_resource_claim({"metadata": {"namespace": NS, "name": "one"}})
    world.reconcile()
    status = world.status("one")
    assert (status["phase"], status["nodeName"]) == ("Bound", "n1")


class MeetingApi(DraApi):
    """Each ResourceClaim create waits until ``parties`` of them are in flight at once."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.meeting = threading.Barrier(parties, timeout=5)

    def create(self, kind: Kind, obj: Obj, **kw: Any) -> Obj:
        if kind.kind == ResourceClaim.kind:
            self.meeting.wait()
        return super().create(kind, obj, **kw)


def test_a_passs_dra_bindings_are_written_together_and_all_end_before_it_does(
    world: World,
) -> None:
    """Three round trips per DRA binding, one binding after the other, bound a class at a
    few claims per second (docs/benchmarks.md, P1-DRA): a pass writes its bindings together,
    as it does device-plugin ones, and returns once every write has ended."""
    api = MeetingApi(parties=3)
    world.api = api
    world.statuses = ClaimStatus(api, world.ledger, FakeRecorder(), registry=CollectorRegistry())
    world.binder = bindermod.Binder(
        world.caches,
        world.ledger,
        world.statuses,
        Settings.model_validate({}),
        clock=world.clock,
        registry=CollectorRegistry(),
        holds=api,
    )
    for name in ("a", "b", "c"):
        world.put_claim(claim(name, count=1))
    world.reconcile()
    assert not api.meeting.broken
    assert {n: world.status(n).get("phase") for n in ("a", "b", "c")} == dict.fromkeys(
        "abc", "Bound"
    )
    held = [d for devices in world.allocations().values() for d in devices]
    assert len(held) == len(set(held)) == 3
