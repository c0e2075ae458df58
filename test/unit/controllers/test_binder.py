"""The binder on in-memory caches and a real ``Inventory``, against a small API server double
that keeps claims with resourceVersion preconditions and lets a test fail a write or hold it
in flight: a pass never leaves while its writes are in flight, its own retried write is
recognised, the next pass reads the assumed state, and a Lost claim that cannot be bound
again waits as Pending.

The oracle of every over-allocation check is the double's stored claims (what the API
server holds), summed here, never the inventory the binder itself counts with.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from controllers import binder as bindermod
from controllers.claim_status import ASSUME_TTL, ClaimStatus
from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.inventory import Inventory
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Kind
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.informing import Handlers, Informer, InformerOptions, ListWatcher
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder
from gpuoperator.settings import Settings

Obj = dict[str, Any]
NS = "tenant-a"
RESOURCE = "nvidia.com/GA102GL_A10"
WAIT = 10.0  # seconds any step of a test may wait for another thread (a deadline, not a pause)


# -- doubles ----------------------------------------------------------------------------------


class _NoServerManager:
    """Enough of ``Manager`` for ``caches.register``: informers that are never started."""

    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        return Informer(cast("ListWatcher", object()), kind, options, name=name)


Hook = Callable[[Obj], None]


class Api:
    """The claims an API server holds. ``replace_status`` checks the resourceVersion and
    stores the status; ``before[name]`` runs first inside a write (it may raise, or block to
    hold the write in flight); ``land_then_conflict`` names claims whose write is stored and
    then answered 409, as a retried write meeting its own first attempt is."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: dict[str, Obj] = {}
        self.writes: list[str] = []
        self.before: dict[str, Hook] = {}
        self.land_then_conflict: set[str] = set()
        self._rv = 100

    def add(self, obj: Obj) -> Obj:
        with self.lock:
            return self._store(obj)

    def _store(self, obj: Obj) -> Obj:
        self._rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._rv)
        self.claims[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def replace_status(self, _kind: Kind, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        with self.lock:
            self.writes.append(name)
        hook = self.before.get(name)
        if hook is not None:
            hook(obj)
        with self.lock:
            current = self.claims.get(name)
            if current is None:
                raise errors.NotFoundError(404, "NotFound", f"gpuclaims {name} not found")
            if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise errors.ConflictError(409, "Conflict", "the object has been modified")
            stored = self._store({**current, "status": copy.deepcopy(obj.get("status"))})
            if name in self.land_then_conflict:
                self.land_then_conflict.discard(name)
                raise errors.ConflictError(409, "Conflict", "the object has been modified")
            return stored

    def get(self, _kind: Kind, name: str, _namespace: str | None = None) -> Obj:
        with self.lock:
            if name not in self.claims:
                raise errors.NotFoundError(404, "NotFound", f"gpuclaims {name} not found")
            return copy.deepcopy(self.claims[name])

    def held(self, node: str) -> int:
        """Units the stored claims hold on ``node`` (the over-allocation oracle)."""
        with self.lock:
            return sum(
                int(c["spec"]["count"])
                for c in self.claims.values()
                if (c.get("status") or {}).get("phase") == "Bound"
                and c["status"].get("nodeName") == node
            )

    def status(self, name: str) -> Obj:
        with self.lock:
            return copy.deepcopy(self.claims[name].get("status") or {})


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def event(self, obj: Obj, type_: str, reason: str, message: str, **_: Any) -> None:
        self.seen.append((obj["metadata"]["name"], reason, message))

    def reasons(self, name: str) -> list[str]:
        return [reason for who, reason, _ in self.seen if who == name]


class WatchedLock:
    """``Inventory.allocation_lock`` that sets ``contended`` when a thread has to wait for it."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock = threading.RLock()
        self.contended = contended

    def __enter__(self) -> WatchedLock:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self._lock.release()


# -- objects ----------------------------------------------------------------------------------


def gpu_class(name: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
    }


def node(name: str, units: int, *, ready: bool = True) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "capacity": {RESOURCE: str(units)},
            "allocatable": {RESOURCE: str(units)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def claim(name: str, cls: str, count: int, second: int, **status: Any) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": f"2026-01-01T00:00:{second:02d}Z",
            "finalizers": [names.CLAIM_PROTECTION_FINALIZER],
        },
        "spec": {"className": cls, "count": count},
        **({"status": status} if status else {}),
    }


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.caches = cachesmod.register(cast("Manager", _NoServerManager()))
        self.inventory = Inventory(clock=self.clock)
        self.api = Api()
        self.events = Events()
        self.statuses = ClaimStatus(
            cast("Client", self.api),
            self.inventory,
            cast("Recorder", self.events),
            registry=CollectorRegistry(),
        )
        self.binder = bindermod.Binder(
            self.caches,
            self.inventory,
            self.statuses,
            Settings.model_validate({}),
            clock=self.clock,
            registry=CollectorRegistry(),
        )

    def put_class(self, cls: Obj) -> None:
        self.caches.classes.store.put(cls)
        self.inventory.apply_class(cls)

    def put_node(self, obj: Obj) -> None:
        self.caches.nodes.store.put(obj)
        self.inventory.apply_node(obj)

    def delete_node(self, name: str) -> None:
        gone = self.caches.nodes.store.remove(("", name))
        assert gone is not None
        self.inventory.delete_node(gone)

    def put_claim(self, obj: Obj) -> Obj:
        stored = self.api.add(obj)
        self.caches.claims.store.put(stored)
        self.inventory.apply_claim(stored)
        return stored

    def sync(self, name: str) -> None:
        """Deliver the API server's current claim to the cache, as the watch would."""
        stored = self.api.get(None, name)  # type: ignore[arg-type]
        self.caches.claims.store.put(stored)
        self.inventory.apply_claim(stored)

    def reconcile(self, class_name: str) -> object:
        return self.binder.reconcile(("", class_name))


@pytest.fixture
def world() -> World:
    return World()


# -- defect: the pass leaves its lock with writes in flight -----------------------------------


def test_a_failed_write_does_not_let_the_next_pass_plan_while_another_write_is_in_flight(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two classes on one resource, one 2-unit node. The "small" pass binds two 1-unit
    claims: the first write fails (the claim was deleted meanwhile), the second is slow. The
    "large" pass (a 2-unit claim) must not bind on figures the slow write is about to take."""
    world.put_class(gpu_class("small"))
    world.put_class(gpu_class("large"))
    world.put_node(node("n1", 2))
    world.put_claim(claim("s1", "small", 1, second=1))
    world.put_claim(claim("s2", "small", 1, second=2))
    world.put_claim(claim("big", "large", 2, second=3))
    # The slow write lands once the "large" pass has to wait for the lock, or has ended.
    s2_in_flight, go = threading.Event(), threading.Event()
    world.inventory.allocation_lock = WatchedLock(contended=go)  # type: ignore[assignment]

    def deleted_meanwhile(_obj: Obj) -> None:
        assert s2_in_flight.wait(WAIT)  # fail only once the other write is in flight
        with world.api.lock:
            world.api.claims.pop("s1")

    def slow(_obj: Obj) -> None:
        s2_in_flight.set()
        assert go.wait(WAIT)

    world.api.before.update(s1=deleted_meanwhile, s2=slow)

    # The "large" pass starts once the "small" one has settled: it has either left its lock
    # or is waiting for its writes.
    settled = threading.Event()
    real_wait = bindermod.__dict__.get("wait")

    def waiting_for_writes(*args: Any, **kwargs: Any) -> Any:
        settled.set()
        assert real_wait is not None
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(bindermod, "wait", waiting_for_writes, raising=False)
    failures: list[BaseException] = []

    def small_pass() -> None:
        try:
            world.reconcile("small")
        except BaseException as exc:
            failures.append(exc)
        finally:
            settled.set()

    def large_pass() -> None:
        try:
            world.reconcile("large")
        finally:
            go.set()

    small = threading.Thread(target=small_pass)
    small.start()
    assert settled.wait(WAIT)
    large = threading.Thread(target=large_pass)
    large.start()
    small.join(WAIT)
    large.join(WAIT)
    assert not small.is_alive() and not large.is_alive()

    assert world.api.held("n1") <= 2, f"{world.api.held('n1')} units held on a 2-unit node"
    assert world.api.status("s2")["phase"] == "Bound"
    assert world.api.status("big").get("phase") != "Bound"
    assert [type(f) for f in failures] in ([], [errors.NotFoundError])


def test_a_pass_raises_a_write_failure_only_after_its_other_writes_ended(world: World) -> None:
    world.put_class(gpu_class("small"))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", "small", 1, second=1))
    world.put_claim(claim("s2", "small", 1, second=2))
    s2_landed = threading.Event()

    def boom(_obj: Obj) -> None:
        raise errors.ApiError(422, "Invalid", "status.nodeName: Invalid value")

    world.api.before.update(s1=boom, s2=lambda _obj: s2_landed.set())
    with pytest.raises(errors.ApiError):
        world.reconcile("small")
    assert s2_landed.is_set()
    assert world.api.status("s2")["phase"] == "Bound"
    # The refused write is forgotten: s1 is counted as the watch has it (Pending, no hold).
    assert (world.inventory.claim((NS, "s1")) or {}).get("status") is None
    assert world.inventory.claim((NS, "s2"))["status"]["phase"] == "Bound"  # type: ignore[index]


def test_a_conflict_on_the_binders_own_retried_write_counts_as_bound(world: World) -> None:
    world.put_class(gpu_class("small"))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", "small", 2, second=1))
    world.api.land_then_conflict.add("s1")

    world.reconcile("small")

    assert world.api.status("s1")["phase"] == "Bound"
    counted = world.inventory.claim((NS, "s1"))
    assert counted is not None and counted["status"]["nodeName"] == "n1"
    assert world.events.reasons("s1") == ["Bound"]
    writes = len(world.api.writes)
    world.reconcile("small")  # the cache still shows it Pending: nothing more to do
    assert len(world.api.writes) == writes


def test_a_conflict_from_another_writer_forgets_the_binding(world: World) -> None:
    world.put_class(gpu_class("small"))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", "small", 2, second=1))

    def someone_else_writes(_obj: Obj) -> None:
        with world.api.lock:
            world.api._store(world.api.claims["s1"])

    world.api.before["s1"] = someone_else_writes

    world.reconcile("small")

    assert world.api.status("s1").get("phase") is None
    assert world.inventory.node("n1") is not None
    assert (world.inventory.claim((NS, "s1")) or {}).get("status") is None
    assert world.events.reasons("s1") == []


def test_a_bind_with_an_unknown_outcome_waits_for_the_watch_then_expires_and_binds_again(
    world: World,
) -> None:
    world.put_class(gpu_class("small"))
    world.put_node(node("n1", 2))
    world.put_claim(claim("s1", "small", 2, second=1))

    def timed_out(_obj: Obj) -> None:
        raise errors.ApiError(504, "Timeout", "the server was unable to return a response")

    world.api.before["s1"] = timed_out
    with pytest.raises(errors.ApiError):
        world.reconcile("small")
    assert world.inventory.node("n1") is not None
    # It may have landed: its units stay counted, and the next pass does not resend it.
    writes = len(world.api.writes)
    result = world.reconcile("small")
    assert len(world.api.writes) == writes
    assert isinstance(result, Result) and result.requeue_after is not None
    assert result.requeue_after > ASSUME_TTL - 1
    world.api.before.clear()
    world.clock.advance(result.requeue_after)
    world.reconcile("small")
    assert world.api.status("s1")["phase"] == "Bound"


# -- defect: phantom re-planning right after a bind -------------------------------------------


def test_the_pass_after_a_bind_neither_plans_it_again_nor_reports_no_capacity(
    world: World,
) -> None:
    world.put_class(gpu_class("a10"))
    world.put_node(node("n1", 4))
    world.put_node(node("n2", 4))
    world.put_claim(claim("four", "a10", 4, second=1))

    world.reconcile("a10")
    assert world.api.status("four")["phase"] == "Bound"
    writes = list(world.api.writes)

    world.reconcile("a10")  # the claims cache still shows "four" Pending

    assert world.api.writes == writes, "the bound claim was planned again"
    assert "NoCapacity" not in world.events.reasons("four")
    world.sync("four")  # the watch catches up: the same answer
    world.reconcile("a10")
    assert world.api.writes == writes


# -- defect: node loss noticed late; Lost goes back to Pending ---------------------------------


def test_deleting_a_node_that_was_already_not_ready_wakes_the_classes_of_its_claims() -> None:
    inventory = Inventory()
    inventory.apply_class(gpu_class("a10"))
    inventory.apply_node(node("n1", 4))
    inventory.apply_claim(claim("hold", "a10", 2, second=1, phase="Bound", nodeName="n1"))
    inventory.apply_node(node("n1", 4, ready=False))
    notices: list[Obj] = []
    inventory.changes.add_handlers(Handlers(on_add=notices.append))

    inventory.delete_node(node("n1", 4, ready=False))

    assert any("a10" in n["classes"] for n in notices), notices


def test_a_lost_claim_that_cannot_be_bound_again_waits_as_pending_with_the_reason(
    world: World,
) -> None:
    world.put_class(gpu_class("a10"))
    world.put_node(node("n1", 4))
    world.put_claim(claim("hold", "a10", 2, second=1))
    world.reconcile("a10")
    world.sync("hold")
    assert world.api.status("hold")["nodeName"] == "n1"

    world.delete_node("n1")
    world.reconcile("a10")

    status = world.api.status("hold")
    assert status["phase"] == "Pending"
    assert "nodeName" not in status
    [bound] = [c for c in status["conditions"] if c["type"] == "Bound"]
    assert (bound["status"], bound["reason"]) == ("False", "NoCapacity")
    assert "n1 is gone" in bound["message"]
    assert world.events.reasons("hold") == ["Bound", "NodeLost", "NoCapacity"]
    world.sync("hold")
    writes = list(world.api.writes)
    world.reconcile("a10")  # waiting on: the condition keeps naming the lost node
    assert world.api.writes == writes

    world.put_node(node("n2", 4))
    world.sync("hold")
    world.reconcile("a10")
    assert (world.api.status("hold")["phase"], world.api.status("hold")["nodeName"]) == (
        "Bound",
        "n2",
    )
