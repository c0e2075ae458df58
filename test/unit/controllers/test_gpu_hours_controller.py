"""GPU-hours on in-memory caches, a real ``Inventory`` and an API server double with
resourceVersion preconditions, on a fake clock: what each replica's collector reports, and
what a new leader goes on counting from the stored claims.

The oracle is plain arithmetic on the scenario's times (hours written out below), never the
model the controller counts with.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any, cast

from prometheus_client import CollectorRegistry

from controllers import gpu_hours as gpuhoursmod
from controllers.claim_status import ClaimStatus
from gpuoperator import names
from gpuoperator.inventory import Inventory
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.recording import Recorder
from harness.offline import ClaimStore, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
HOUR = 3600.0
START = datetime.datetime(2026, 3, 1, 8, 0, tzinfo=datetime.UTC)


class NoEvents:
    def event(self, *_: Any, **__: Any) -> None:
        raise AssertionError("GPU-hours changes are not Events")


class Replica:
    """One operator process: its own caches, inventory, controller and collector."""

    def __init__(self, api: ClaimStore, clock: FakeClock) -> None:
        self.api = api
        self.caches = offline_caches()
        self.inventory = Inventory(clock=clock)
        statuses = ClaimStatus(
            cast("Client", api),
            self.inventory,
            cast("Recorder", NoEvents()),
            registry=CollectorRegistry(),
        )
        self.controller = gpuhoursmod.GpuHours(self.caches, statuses, clock=clock)
        self.registry = CollectorRegistry()
        self.registry.register(gpuhoursmod.UnitSecondsCollector(self.caches, clock=clock))

    def sync(self) -> None:
        """The watch delivers what the API server stores."""
        for key in list(self.caches.claims.store):
            if key[1] not in self.api.claims:
                gone = self.caches.claims.store.remove(key)
                assert gone is not None
                self.inventory.delete_claim(gone)
        for stored in self.api.claims.values():
            self.caches.claims.store.put(copy.deepcopy(stored))
            self.inventory.apply_claim(copy.deepcopy(stored))

    def put_vmi(self, vmi: Obj) -> None:
        self.caches.vmis.store.put(vmi)

    def delete_vmi(self, name: str) -> None:
        self.caches.vmis.store.remove((NS, name))

    def reconcile(self, name: str) -> None:
        self.controller.reconcile((NS, name))
        self.sync()

    def hours(self, name: str, state: str) -> float | None:
        value = self.registry.get_sample_value(
            "gpuoperator_claim_gpu_unit_seconds_total",
            {
                "namespace": NS,
                "claim": name,
                "uid": f"uid-{name}",
                "gpuclass": "a10",
                "state": state,
            },
        )
        return None if value is None else value / HOUR


def bound_claim(name: str, count: int, **status: Any) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
        "spec": {"className": "a10", "count": count},
        "status": {
            "phase": "Bound",
            "nodeName": "n1",
            "boundTime": "2026-03-01T08:00:00Z",
            **status,
        },
    }


def running_vmi(name: str, uid: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "status": {"phase": "Running", "nodeName": "n1"},
    }


def attach(api: ClaimStore, claim: str, vmi: str, uid: str) -> None:
    stored = api.claims[claim]
    api.store({**stored, "status": {**stored["status"], "attachment": {"vmi": vmi, "uid": uid}}})


def test_two_hours_held_with_the_vm_running_half_an_hour_across_a_leader_change() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(bound_claim("hold", 1))
    leader = Replica(api, clock)
    standby = Replica(api, clock)
    for replica in (leader, standby):
        replica.sync()

    leader.reconcile("hold")  # bound at 08:00: held from then on
    clock.advance(1 * HOUR)  # 09:00 the VM starts
    attach(api, "hold", "vm", "vm-uid")
    leader.put_vmi(running_vmi("vm", "vm-uid"))
    leader.sync()
    leader.reconcile("hold")

    clock.advance(0.25 * HOUR)  # 09:15 the leader stops; the standby takes over
    standby.sync()
    standby.put_vmi(running_vmi("vm", "vm-uid"))
    for replica in (leader, standby):
        assert replica.hours("hold", "idle") == 1.0
        assert replica.hours("hold", "in_use") == 0.25
    standby.reconcile("hold")  # nothing changed: the new leader writes nothing
    assert api.claims["hold"]["status"]["usage"]["since"] == "2026-03-01T09:00:00Z"

    clock.advance(0.25 * HOUR)  # 09:30 the VM stops
    standby.delete_vmi("vm")
    standby.reconcile("hold")

    clock.advance(0.5 * HOUR)  # 10:00
    idle, in_use = standby.hours("hold", "idle"), standby.hours("hold", "in_use")
    assert idle is not None and in_use is not None
    assert idle + in_use == 2.0
    assert in_use == 0.5
    # A replica started afresh reads the same from the stored claim.
    late = Replica(api, clock)
    late.sync()
    assert (late.hours("hold", "idle"), late.hours("hold", "in_use")) == (1.5, 0.5)


def test_units_multiply_the_hours() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(bound_claim("four", 4))
    leader = Replica(api, clock)
    leader.sync()
    leader.reconcile("four")
    clock.advance(1.5 * HOUR)
    assert (leader.hours("four", "idle"), leader.hours("four", "in_use")) == (6.0, 0.0)


def test_a_series_never_goes_back_while_the_cache_is_behind_a_write() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(bound_claim("hold", 1))
    leader, behind = Replica(api, clock), Replica(api, clock)
    leader.sync()
    behind.sync()
    leader.reconcile("hold")
    behind.sync()
    clock.advance(1 * HOUR)
    attach(api, "hold", "vm", "vm-uid")
    leader.sync()
    leader.put_vmi(running_vmi("vm", "vm-uid"))
    leader.reconcile("hold")  # 09:00 in use; `behind` has not seen it yet
    clock.advance(0.5 * HOUR)
    assert behind.hours("hold", "idle") == 1.5  # still counting idle on its old copy
    behind.sync()
    # The stored truth is 1 h idle, 0.5 h in use: the idle series stays where it was
    # reported until the truth passes it.
    assert behind.hours("hold", "idle") == 1.5
    assert behind.hours("hold", "in_use") == 0.5


def test_a_deleted_claim_ends_its_series_and_a_lost_hold_stops_counting() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(bound_claim("hold", 1))
    api.store(bound_claim("other", 1))
    leader = Replica(api, clock)
    leader.sync()
    leader.reconcile("hold")
    leader.reconcile("other")
    clock.advance(1 * HOUR)
    stored = api.claims["other"]
    api.store({**stored, "status": {**stored["status"], "phase": "Pending", "nodeName": None}})
    leader.sync()
    leader.reconcile("other")  # 09:00 no longer held
    clock.advance(1 * HOUR)
    assert leader.hours("other", "idle") == 1.0
    del api.claims["hold"]
    leader.sync()
    assert leader.hours("hold", "idle") is None
