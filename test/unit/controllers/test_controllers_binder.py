"""The binder on in-memory caches and a real ``Ledger``, against a small API server double
that keeps claims with resourceVersion preconditions and lets a test fail a write or hold it
in flight: a pass never leaves while its writes are in flight, its own retried write is
recognised, the next pass reads the assumed state, and a Lost claim that cannot be bound
again waits as Pending.

The API server double is the harness's (``harness.offline.FakeApi``). The oracle of every
over-allocation check is the double's stored claims (what the API
server holds), summed here, never the ledger the binder itself counts with.
"""

from __future__ import annotations

import datetime
import functools
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from controllers import binder as bindermod
from controllers import gpu_hours as gpuhoursmod
from controllers import node_rejections
from gpuoperator import names
from gpuoperator.claim_status import ASSUME_TTL, ClaimStatus
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import node_rejections as model_rejections
from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.informing import Handlers
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import FakeApi, FakeRecorder, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
RESOURCE = "nvidia.com/GA102GL_A10"
WAIT = 10.0  # seconds any step of a test may wait for another thread (a deadline, not a pause)


# -- doubles ----------------------------------------------------------------------------------


class WatchedLock:
    """``Ledger.allocation_lock`` that sets ``contended`` when a thread has to wait for it."""

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


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


claim = functools.partial(
    objects.claim, uid=None, generation=1, finalizers=[names.CLAIM_PROTECTION_FINALIZER]
)
node = objects.node


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.caches = offline_caches()
        self.ledger = Ledger(clock=self.clock)
        self.api = FakeApi()
        self.events = FakeRecorder()
        self.statuses = ClaimStatus(
            self.api,
            self.ledger,
            self.events,
            registry=CollectorRegistry(),
        )
        self.binder = bindermod.Binder(
            self.caches,
            self.ledger,
            self.statuses,
            Settings.model_validate({}),
            clock=self.clock,
            registry=CollectorRegistry(),
        )

    def put_class(self, cls: Obj) -> None:
        self.caches.classes.store.put(cls)
        self.ledger.apply_class(cls)

    def put_node(self, obj: Obj) -> None:
        self.caches.nodes.store.put(obj)
        self.ledger.apply_node(obj)

    def delete_node(self, name: str) -> None:
        gone = self.caches.nodes.store.remove(("", name))
        assert gone is not None
        self.ledger.delete_node(gone)

    def put_claim(self, obj: Obj) -> Obj:
        stored = self.api.add(GPUClaim, obj)
        self.caches.claims.store.put(stored)
        self.ledger.apply_claim(stored)
        return stored

    def sync(self, name: str) -> None:
        """Deliver the API server's current claim to the cache, as the watch would."""
        stored = self.api.get(GPUClaim, name, NS)
        self.caches.claims.store.put(stored)
        self.ledger.apply_claim(stored)

    def reconcile(self, class_name: str) -> object:
        return self.binder.reconcile(("", class_name))

    def writes(self) -> list[str]:
        """The claims whose status was written, in order (each attempt counts)."""
        with self.api.lock:
            return [name for verb, _, name, _ in self.api.calls if verb == "replace_status"]

    def status(self, name: str) -> Obj:
        stored = self.api.stored(GPUClaim, name, NS)
        assert stored is not None
        return stored.get("status") or {}

    def held(self, node: str) -> int:
        """Units the stored claims hold on ``node`` (the over-allocation oracle)."""
        with self.api.lock:
            return sum(
                int(c["spec"]["count"])
                for (kind, _, _), c in self.api.objects.items()
                if kind == "GPUClaim"
                and (c.get("status") or {}).get("phase") == "Bound"
                and c["status"].get("nodeName") == node
            )


@pytest.fixture
def world() -> World:
    return World()


# -- budgets at bind time are added up on what the binder itself bound ------------------------


def test_a_budget_counts_the_claims_bound_a_pass_ago_while_the_cache_still_shows_them_pending(
    world: World,
) -> None:
    """A budget of 2; the youngest order is seen first and bound. Its Bound version has not
    come back through the watch when the two older orders arrive: the next pass must count
    it (the cache still says Pending, and it was ordered after both), so only one more binds
    — not two, which would hold 3 units on a budget of 2."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 8))
    world.caches.quotas.store.put(objects.quota({names.quota_key("a10"): "2"}))
    world.put_claim(claim("young", count=1, created=at(3)))
    world.reconcile("a10")
    assert world.status("young")["phase"] == "Bound"  # stored; the cache has not seen it

    world.put_claim(claim("old", count=1, created=at(1)))
    world.put_claim(claim("middle", count=1, created=at(2)))
    world.reconcile("a10")

    phases = {n: str(world.status(n).get("phase")) for n in ("old", "middle", "young")}
    assert sorted(phases.values()) == ["Bound", "Bound", "Pending"], phases
    assert phases["old"] == "Bound"  # of the two racing orders the older binds
    waiting = next(c for c in world.status("middle")["conditions"] if c["type"] == "Bound")
    assert waiting["reason"] == "BudgetExceeded"
    assert "2 are held" in waiting["message"]


def test_a_claim_being_deleted_keeps_its_budget_until_it_is_gone(world: World) -> None:
    """A budget of 2 used by a bound claim the tenant deleted (a finalizer keeps it, its
    units are still held): a new order waits with BudgetExceeded until the claim is gone."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 8))
    world.caches.quotas.store.put(objects.quota({names.QUOTA_TOTAL_KEY: "2"}))
    world.put_claim(
        claim("leaving", count=2, created=at(1), phase="Bound", node="n1", deleting=True)
    )
    world.put_claim(claim("next", count=1, created=at(2)))
    world.reconcile("a10")

    waiting = next(c for c in world.status("next")["conditions"] if c["type"] == "Bound")
    assert (world.status("next")["phase"], waiting["reason"]) == ("Pending", "BudgetExceeded")
    assert "2 by claims being deleted" in waiting["message"]

    gone = world.caches.claims.store.remove((NS, "leaving"))
    assert gone is not None
    world.ledger.delete_claim(gone)
    world.api.remove(GPUClaim, "leaving", NS)
    world.sync("next")
    world.reconcile("a10")
    assert world.status("next")["phase"] == "Bound"


# -- backfill, not head-of-line blocking ------------------------------------------------------


def test_a_claim_that_fits_only_on_an_empty_node_does_not_block_younger_claims(
    world: World,
) -> None:
    """A template claim of 4 on 4-unit nodes, each partly held: younger claims of other
    tenants keep binding (more than the eight bypasses that used to block the class), never
    on the node it nominated; it binds there once that node's hold goes."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_node(node("n2", 8))
    world.put_claim(claim("h1", count=1, created=at(0), phase="Bound", node="n1"))
    world.put_claim(claim("h2", count=7, created=at(0), phase="Bound", node="n2"))
    world.put_claim(claim("big", count=4, created=at(1), owner_uid="vmi-uid"))
    world.reconcile("a10")
    waiting = next(c for c in world.status("big")["conditions"] if c["type"] == "Bound")
    assert waiting["reason"] == "NoCapacity"
    assert "waiting for 1 more unit on node n1" in waiting["message"]

    for i in range(12):  # each young claim: its own tenant, its own pass
        stored = world.api.add(
            GPUClaim, claim(f"young-{i:02d}", namespace=f"tenant-{i:02d}", created=at(2 + i))
        )
        world.caches.claims.store.put(stored)
        world.ledger.apply_claim(stored)
        world.reconcile("a10")
    young = [
        world.api.stored(GPUClaim, f"young-{i:02d}", f"tenant-{i:02d}") or {} for i in range(12)
    ]
    assert [(c.get("status") or {}).get("nodeName") for c in young] == ["n2"] + [None] * 11
    kept = next(c for c in young[1]["status"]["conditions"] if c["type"] == "Bound")
    assert kept["reason"] == "Queued"
    assert "kept for an older claim of class a10" in kept["message"]
    assert "big" not in kept["message"] and NS not in kept["message"]
    assert world.held("n1") == 1, "a younger claim took the units the nomination keeps"

    world.api.remove(GPUClaim, "h1", NS)
    gone = world.caches.claims.store.remove((NS, "h1"))
    assert gone is not None
    world.ledger.delete_claim(gone)
    world.sync("big")
    world.reconcile("a10")
    assert (world.status("big")["phase"], world.status("big")["nodeName"]) == ("Bound", "n1")


# -- defect: the pass leaves its lock with writes in flight -----------------------------------


def test_a_failed_write_does_not_let_the_next_pass_plan_while_another_write_is_in_flight(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two classes on one resource, one 2-unit node. The "small" pass binds two 1-unit
    claims: the first write fails (the claim was deleted meanwhile), the second is slow. The
    "large" pass (a 2-unit claim) must not bind on figures the slow write is about to take."""
    world.put_class(objects.gpuclass("small", resource=RESOURCE))
    world.put_class(objects.gpuclass("large", resource=RESOURCE))
    world.put_node(node("n1", 2))
    world.put_claim(claim("s1", class_name="small", count=1, created=at(1)))
    world.put_claim(claim("s2", class_name="small", count=1, created=at(2)))
    world.put_claim(claim("big", class_name="large", count=2, created=at(3)))
    # The slow write lands once the "large" pass has to wait for the lock, or has ended.
    s2_in_flight, go = threading.Event(), threading.Event()
    world.ledger.allocation_lock = WatchedLock(contended=go)  # type: ignore[assignment]

    def deleted_meanwhile(_obj: Obj) -> None:
        assert s2_in_flight.wait(WAIT)  # fail only once the other write is in flight
        world.api.remove(GPUClaim, "s1", NS)

    def slow(_obj: Obj) -> None:
        s2_in_flight.set()
        assert go.wait(WAIT)

    world.api.before.update(s1=deleted_meanwhile, s2=slow)

    # The "large" pass starts once the "small" one has settled: it has either left its lock
    # or is waiting for its writes.
    settled = threading.Event()
    real_wait = vars(bindermod)["wait"]  # KeyError if the binder no longer waits through it

    def waiting_for_writes(*args: Any, **kwargs: Any) -> Any:
        settled.set()
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(bindermod, "wait", waiting_for_writes)
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

    assert world.held("n1") <= 2, f"{world.held('n1')} units held on a 2-unit node"
    assert world.status("s2")["phase"] == "Bound"
    assert world.status("big").get("phase") != "Bound"
    assert [type(f) for f in failures] in ([], [errors.NotFoundError])


def test_a_pass_raises_a_write_failure_only_after_its_other_writes_ended(world: World) -> None:
    world.put_class(objects.gpuclass("small", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", class_name="small", count=1, created=at(1)))
    world.put_claim(claim("s2", class_name="small", count=1, created=at(2)))
    s2_landed = threading.Event()

    def boom(_obj: Obj) -> None:
        raise errors.ApiError(422, "Invalid", "status.nodeName: Invalid value")

    world.api.before.update(s1=boom, s2=lambda _obj: s2_landed.set())
    with pytest.raises(errors.ApiError):
        world.reconcile("small")
    assert s2_landed.is_set()
    assert world.status("s2")["phase"] == "Bound"
    # The refused write is forgotten: s1 is counted as the watch has it (Pending, no hold).
    assert (world.ledger.claim((NS, "s1")) or {}).get("status") is None
    assert world.ledger.claim((NS, "s2"))["status"]["phase"] == "Bound"  # type: ignore[index]


def test_a_conflict_on_the_binders_own_retried_write_counts_as_bound(world: World) -> None:
    world.put_class(objects.gpuclass("small", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", class_name="small", count=2, created=at(1)))
    world.api.land_then_conflict.add("s1")

    world.reconcile("small")

    assert world.status("s1")["phase"] == "Bound"
    counted = world.ledger.claim((NS, "s1"))
    assert counted is not None and counted["status"]["nodeName"] == "n1"
    assert world.events.reasons("s1") == ["Bound"]
    writes = len(world.writes())
    world.reconcile("small")  # the cache still shows it Pending: nothing more to do
    assert len(world.writes()) == writes


def test_a_conflict_from_another_writer_forgets_the_binding(world: World) -> None:
    world.put_class(objects.gpuclass("small", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_claim(claim("s1", class_name="small", count=2, created=at(1)))

    def someone_else_writes(_obj: Obj) -> None:
        stored = world.api.stored(GPUClaim, "s1", NS)
        assert stored is not None
        world.api.add(GPUClaim, stored)

    world.api.before["s1"] = someone_else_writes

    world.reconcile("small")

    assert world.status("s1").get("phase") is None
    assert world.ledger.node("n1") is not None
    assert (world.ledger.claim((NS, "s1")) or {}).get("status") is None
    assert world.events.reasons("s1") == []


def test_a_bind_with_an_unknown_outcome_waits_for_the_watch_then_expires_and_binds_again(
    world: World,
) -> None:
    world.put_class(objects.gpuclass("small", resource=RESOURCE))
    world.put_node(node("n1", 2))
    world.put_claim(claim("s1", class_name="small", count=2, created=at(1)))

    def timed_out(_obj: Obj) -> None:
        raise errors.ApiError(504, "Timeout", "the server was unable to return a response")

    world.api.before["s1"] = timed_out
    with pytest.raises(errors.ApiError):
        world.reconcile("small")
    assert world.ledger.node("n1") is not None
    # It may have landed: its units stay counted, and the next pass does not resend it.
    writes = len(world.writes())
    result = world.reconcile("small")
    assert len(world.writes()) == writes
    assert isinstance(result, Result) and result.requeue_after is not None
    assert result.requeue_after > ASSUME_TTL - 1
    world.api.before.clear()
    world.clock.advance(result.requeue_after)
    world.reconcile("small")
    assert world.status("s1")["phase"] == "Bound"


# -- defect: phantom re-planning right after a bind -------------------------------------------


def test_the_pass_after_a_bind_neither_plans_it_again_nor_reports_no_capacity(
    world: World,
) -> None:
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_node(node("n2", 4))
    world.put_claim(claim("four", class_name="a10", count=4, created=at(1)))

    world.reconcile("a10")
    assert world.status("four")["phase"] == "Bound"
    writes = list(world.writes())

    world.reconcile("a10")  # the claims cache still shows "four" Pending

    assert world.writes() == writes, "the bound claim was planned again"
    assert "NoCapacity" not in world.events.reasons("four")
    world.sync("four")  # the watch catches up: the same answer
    world.reconcile("a10")
    assert world.writes() == writes


def test_a_binding_opens_the_holds_usage_interval_so_gpu_hours_has_nothing_to_write(
    world: World,
) -> None:
    """One write per bound claim on the steady path: the binding records the idle interval
    the hold starts (from its boundTime), which is what the GPU-hours controller would
    write next; it finds nothing to do."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_claim(claim("two", class_name="a10", count=2, created=at(1)))

    world.reconcile("a10")
    status = world.status("two")
    assert status["phase"] == "Bound"
    assert status["usage"] == {
        "state": "Idle",
        "since": status["boundTime"],
        "idleUnitSeconds": 0,
        "inUseUnitSeconds": 0,
    }
    world.sync("two")
    writes = list(world.writes())
    hours = gpuhoursmod.GpuHours(world.caches, world.statuses, clock=world.clock)
    assert hours.reconcile((NS, "two")) is None
    assert world.writes() == writes, "GPU-hours wrote again what the binding recorded"


# -- defect: node loss noticed late; Lost goes back to Pending ---------------------------------


def test_deleting_a_node_that_was_already_not_ready_wakes_the_classes_of_its_claims() -> None:
    ledger = Ledger()
    ledger.apply_class(objects.gpuclass("a10", resource=RESOURCE))
    ledger.apply_node(node("n1", 4))
    ledger.apply_claim(
        claim("hold", class_name="a10", count=2, created=at(1), phase="Bound", node="n1")
    )
    ledger.apply_node(node("n1", 4, ready=False))
    notices: list[Obj] = []
    ledger.changes.add_handlers(Handlers(on_add=notices.append))

    ledger.delete_node(node("n1", 4, ready=False))

    assert any("a10" in n["classes"] for n in notices), notices


def test_a_lost_claim_that_cannot_be_bound_again_waits_as_pending_with_the_reason(
    world: World,
) -> None:
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n1", 4))
    world.put_claim(claim("hold", class_name="a10", count=2, created=at(1)))
    world.reconcile("a10")
    world.sync("hold")
    assert world.status("hold")["nodeName"] == "n1"

    world.delete_node("n1")
    world.reconcile("a10")

    status = world.status("hold")
    assert status["phase"] == "Pending"
    assert "nodeName" not in status
    [bound] = [c for c in status["conditions"] if c["type"] == "Bound"]
    assert (bound["status"], bound["reason"]) == ("False", "NoCapacity")
    assert "n1 is gone" in bound["message"]
    assert world.events.reasons("hold") == ["Bound", "NodeLost", "NoCapacity"]
    world.sync("hold")
    writes = list(world.writes())
    world.reconcile("a10")  # waiting on: the condition keeps naming the lost node
    assert world.writes() == writes

    world.put_node(node("n2", 4))
    world.sync("hold")
    world.reconcile("a10")
    assert (world.status("hold")["phase"], world.status("hold")["nodeName"]) == (
        "Bound",
        "n2",
    )


# -- a node refusal: the claim changes node only through a stored version releasing it --------


def refuse(world: World, name: str, node_name: str) -> bool:
    """Placement records that ``node_name`` rejected the claim's pinned pod (its one claim
    status write: refusedNodes, back to Pending) on the claim as the cache has it."""
    rejections = node_rejections.NodeRejections(
        world.caches,
        world.ledger,
        world.api,
        world.statuses,
        world.events,
        Settings.model_validate({}),
        clock=world.clock,
    )
    cached = world.caches.claims.store.get((NS, name))
    assert cached is not None
    now = world.clock.now()
    until = now + datetime.timedelta(minutes=10)
    owed = model_rejections.Rejection(
        pod={},
        node=node_name,
        detail="no room",
        now=now,
        until=until,
        vmi_name="vm1",
        vmi_uid="",
        claim_names=(name,),
    )
    return rejections.write(cached, owed, (NS, "virt-launcher-vm1"))


def unconfirmed_refusal(world: World, name: str, node_name: str) -> None:
    """The refusal write does not land and its outcome is unknown (a 504; a fence between
    retries or a cut connection look the same): the ledger keeps it assumed."""

    def timed_out(_obj: Obj) -> None:
        raise errors.ApiError(504, "Timeout", "the server was unable to return a response")

    world.api.before[name] = timed_out
    with pytest.raises(errors.ApiError):
        refuse(world, name, node_name)
    del world.api.before[name]
    assert world.status(name)["nodeName"] == node_name  # nothing landed


def stored_versions(world: World, name: str) -> list[tuple[str, str]]:
    """``(phase, nodeName)`` of each status the server stored for ``name``, in order."""
    versions: list[tuple[str, str]] = []
    real = world.api.replace_status

    def recording(kind: Any, obj: Obj) -> Obj:
        stored = real(kind, obj)
        if stored["metadata"]["name"] == name:
            status = stored.get("status") or {}
            versions.append((str(status.get("phase")), str(status.get("nodeName") or "")))
        return stored

    world.api.replace_status = recording  # type: ignore[method-assign]
    return versions


def peak_held(world: World, node_name: str) -> list[int]:
    """The units the stored claims hold on ``node_name`` after each status write."""
    held: list[int] = []
    real = world.api.replace_status

    def recording(kind: Any, obj: Obj) -> Obj:
        stored = real(kind, obj)
        held.append(world.held(node_name))
        return stored

    world.api.replace_status = recording  # type: ignore[method-assign]
    return held


def test_a_claim_whose_refusal_write_is_unconfirmed_is_not_bound_elsewhere_over_its_old_binding(
    world: World,
) -> None:
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n-0", 2))
    world.put_node(node("n-1", 2))
    world.put_claim(claim("hold", count=2, created=at(1), phase="Bound", node="n-0"))
    versions = stored_versions(world, "hold")
    unconfirmed_refusal(world, "hold", "n-0")

    world.reconcile("a10")

    assert versions == [], "a bind was written on top of the stored Bound@n-0"
    assert world.status("hold")["nodeName"] == "n-0"
    # The refusal is taken again (placement retries) and lands: then the claim moves on.
    world.clock.advance(ASSUME_TTL + 1)
    world.ledger.expire()
    assert refuse(world, "hold", "n-0")
    world.reconcile("a10")
    assert versions == [("Pending", ""), ("Bound", "n-1")]
    assert [r["nodeName"] for r in world.status("hold")["refusedNodes"]] == ["n-0"]


def test_an_unconfirmed_refusal_frees_no_units_of_the_node_the_claim_is_still_bound_to(
    world: World,
) -> None:
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n-0", 2))
    world.put_claim(claim("hold", count=2, created=at(1), phase="Bound", node="n-0"))
    world.put_claim(claim("next", count=2, created=at(2)))
    peak = peak_held(world, "n-0")
    unconfirmed_refusal(world, "hold", "n-0")

    world.reconcile("a10")

    assert max(peak, default=0) <= 2, f"{max(peak)} units held on a 2-unit node"
    assert world.status("next").get("phase") != "Bound"
    # The refusal's write was never stored: once it is forgotten the hold is as stored.
    world.clock.advance(ASSUME_TTL + 1)
    world.reconcile("a10")
    assert world.held("n-0") == 2
    assert world.status("hold")["nodeName"] == "n-0"


def test_a_pass_while_a_refusal_write_is_in_flight_does_not_bind_over_the_old_binding(
    world: World,
) -> None:
    """Placement's refusal write is in flight (it holds no decision lock) when a binder pass
    runs: the pass must not plan the claim from the assumed Pending state, whose bind would
    carry the stored Bound@n-0 version's resourceVersion and could land first."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_node(node("n-0", 2))
    world.put_node(node("n-1", 2))
    world.put_claim(claim("hold", count=2, created=at(1), phase="Bound", node="n-0"))
    versions = stored_versions(world, "hold")
    in_flight, go = threading.Event(), threading.Event()

    def held_in_flight(_obj: Obj) -> None:
        if not in_flight.is_set():  # the refusal, the first write: held until the pass ended
            in_flight.set()
            assert go.wait(WAIT)

    world.api.before["hold"] = held_in_flight
    refused: list[bool] = []
    placement = threading.Thread(target=lambda: refused.append(refuse(world, "hold", "n-0")))
    placement.start()
    try:
        assert in_flight.wait(WAIT)
        world.reconcile("a10")
    finally:
        go.set()
        placement.join(WAIT)
    assert refused == [True]
    assert versions == [("Pending", "")], "the claim changed node without being released"
    world.reconcile("a10")
    assert versions == [("Pending", ""), ("Bound", "n-1")]


# -- preemptible classes: a guaranteed order takes idle spot holds back -------------------------


def spot_world(world: World) -> World:
    """A guaranteed class and a preemptible one on one resource, a 4-unit node full of two
    idle spot holds (``old`` bound first, ``new`` after)."""
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_class(objects.gpuclass("a10-spot", resource=RESOURCE, preemptible=True))
    world.put_node(node("n1", {RESOURCE: 4}))
    for name, second in (("old", 1), ("new", 2)):
        world.put_claim(
            claim(
                name,
                class_name="a10-spot",
                count=2,
                created=at(second),
                phase="Bound",
                node="n1",
                status={"boundTime": at(second)},
            )
        )
    return world


def test_a_guaranteed_order_takes_back_the_newest_idle_spot_hold_and_binds_in_the_same_pass(
    world: World,
) -> None:
    spot_world(world)
    world.put_claim(claim("order", class_name="a10", count=2, created=at(3)))
    world.reconcile("a10")
    assert world.status("order")["phase"] == "Bound"
    assert world.status("order")["nodeName"] == "n1"
    taken = world.status("new")
    assert taken["phase"] == "Pending" and "nodeName" not in taken
    reason = next(c for c in taken["conditions"] if c["type"] == "Bound")["reason"]
    assert reason == "Preempted"
    assert world.status("old")["nodeName"] == "n1"
    assert world.held("n1") == 4
    # The hold taken back is written before the order's binding: never 6 units promised.
    assert world.writes() == ["new", "order"]
    preempted = [e for e in world.events.events if e["reason"] == "Preempted"]
    assert [(e["name"], e["type"]) for e in preempted] == [("new", "Normal")]
    assert "guaranteed claim tenant-a/order of class a10" in preempted[0]["message"]


def test_a_take_back_whose_write_fails_binds_nothing_over_the_hold(world: World) -> None:
    spot_world(world)
    world.put_claim(claim("order", class_name="a10", count=2, created=at(3)))

    def boom(_obj: Obj) -> None:
        raise errors.ApiError(422, "Invalid", "status: Invalid value")

    world.api.before.update(new=boom)
    with pytest.raises(errors.ApiError):
        world.reconcile("a10")
    assert world.status("order").get("phase") != "Bound"
    assert world.status("new")["phase"] == "Bound"
    assert world.held("n1") == 4


def test_a_spot_order_and_an_order_that_fits_take_nothing_back(world: World) -> None:
    spot_world(world)
    world.put_node(node("n2", {RESOURCE: 2}))
    world.put_claim(claim("fits", class_name="a10", count=2, created=at(3)))
    world.put_claim(claim("spot-order", class_name="a10-spot", count=2, created=at(4)))
    world.reconcile("a10")
    world.reconcile("a10-spot")
    assert world.status("fits")["nodeName"] == "n2"
    assert world.status("spot-order").get("phase") != "Bound"
    assert world.status("new")["phase"] == world.status("old")["phase"] == "Bound"
    assert not [e for e in world.events.events if e["reason"] == "Preempted"]


def _passes(world: World, names_: list[str], classes: tuple[str, ...], rounds: int) -> None:
    """Binder passes over ``classes``, each followed by the watch delivering every claim."""
    for _ in range(rounds):
        for cls in classes:
            world.reconcile(cls)
            for name in names_:
                world.sync(name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spot_counts=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=5),
    held_counts=st.lists(st.integers(min_value=1, max_value=3), max_size=3),
    order_counts=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=4),
    nodes=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
)
def test_take_backs_never_overfill_a_node_nor_release_a_guaranteed_hold(
    spot_counts: list[int], held_counts: list[int], order_counts: list[int], nodes: list[int]
) -> None:
    """Spot and guaranteed holds bound first, then guaranteed orders: whatever the binder
    takes back, the stored claims never hold more than a node has (summed here from what the
    API double stores), no guaranteed claim once Bound is ever written otherwise, and every
    claim written back to Pending is a spot one."""
    world = World()
    world.put_class(objects.gpuclass("a10", resource=RESOURCE))
    world.put_class(objects.gpuclass("a10-spot", resource=RESOURCE, preemptible=True))
    sizes = {f"n{i}": units for i, units in enumerate(nodes)}
    for name, units in sizes.items():
        world.put_node(node(name, {RESOURCE: units}))
    made: list[str] = []
    second = 0
    for prefix, cls, counts in (("s", "a10-spot", spot_counts), ("g", "a10", held_counts)):
        for i, count in enumerate(counts):
            second += 1
            made.append(f"{prefix}{i}")
            world.put_claim(claim(made[-1], class_name=cls, count=count, created=at(second)))
    _passes(world, made, ("a10-spot", "a10"), 1)
    for i, count in enumerate(order_counts):
        second += 1
        made.append(f"o{i}")
        world.put_claim(claim(made[-1], class_name="a10", count=count, created=at(second)))
    _passes(world, made, ("a10", "a10-spot"), 3)

    for name, units in sizes.items():
        assert world.held(name) <= units, f"{world.held(name)} units held on {name} ({units})"
    bound_once: set[str] = set()
    with world.api.lock:
        for verb, _, name, payload in world.api.calls:
            if verb != "replace_status" or name.startswith("s"):
                continue
            phase = (payload.get("status") or {}).get("phase")
            assert not (name in bound_once and phase != "Bound"), f"guaranteed {name} released"
            if phase == "Bound":
                bound_once.add(name)
    preempted = {e["name"] for e in world.events.events if e["reason"] == "Preempted"}
    assert all(n.startswith("s") for n in preempted), preempted
    event("some hold taken back" if preempted else "nothing taken back")
