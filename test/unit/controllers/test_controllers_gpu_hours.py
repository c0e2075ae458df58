"""GPU-hours on in-memory caches, a real ``Ledger`` and an API server double with
resourceVersion preconditions, on a fake clock: what each replica's collector reports, and
what a new leader goes on counting from the stored claims.

The oracle is plain arithmetic on the scenario's times (hours written out below), never the
model the controller counts with.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers import gpu_hours as gpuhoursmod
from gpuoperator import cli, names, settings
from gpuoperator.claim_status import ClaimStatus
from gpuoperator.ledger import Ledger
from gpuoperator.runtime.clock import FakeClock
from harness.offline import ClaimStore, OfflineManager, offline_caches, put

Obj = dict[str, Any]
NS = "tenant-a"
HOUR = 3600.0
START = datetime.datetime(2026, 3, 1, 8, 0, tzinfo=datetime.UTC)


class NoEvents:
    def event(self, *_: Any, **__: Any) -> None:
        raise AssertionError("GPU-hours changes are not Events")


class Replica:
    """One operator process: its own caches, ledger, controller and collector."""

    def __init__(self, api: ClaimStore, clock: FakeClock) -> None:
        self.api = api
        self.caches = offline_caches()
        self.ledger = Ledger(clock=clock)
        statuses = ClaimStatus(
            api,
            self.ledger,
            NoEvents(),
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
                self.ledger.delete_claim(gone)
        for stored in self.api.claims.values():
            self.caches.claims.store.put(copy.deepcopy(stored))
            self.ledger.apply_claim(copy.deepcopy(stored))

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


# ---- series per namespace and class (gpuHoursSeries: namespace) ---------------------------
class Summing:
    """One process exporting the sums per namespace and class, wired by ``register``."""

    def __init__(self, api: ClaimStore, clock: FakeClock) -> None:
        self.api = api
        self.manager = OfflineManager(clock=clock)
        self.caches = offline_caches(self.manager)
        statuses = ClaimStatus(
            api,
            Ledger(clock=clock),
            NoEvents(),
            registry=CollectorRegistry(),
        )
        gpuhoursmod.register(self.manager, self.caches, statuses, series=gpuhoursmod.PER_NAMESPACE)
        self.registry = self.manager.registry

    def sync(self) -> None:
        for key in list(self.caches.claims.store):
            if key[1] not in self.api.claims:
                self.caches.claims.store.remove(key)
        for stored in self.api.claims.values():
            put(self.caches.claims, stored)

    def hours(self, state: str, gpuclass: str = "a10", namespace: str = NS) -> float | None:
        value = self.registry.get_sample_value(
            "gpuoperator_claim_gpu_unit_seconds_total",
            {"namespace": namespace, "gpuclass": gpuclass, "state": state},
        )
        return None if value is None else value / HOUR

    def series_labels(self) -> list[dict[str, str]]:
        return [
            s.labels
            for family in self.registry.collect()
            if family.name == "gpuoperator_claim_gpu_unit_seconds"
            for s in family.samples
        ]


def claim_in(namespace: str, name: str, count: int, gpuclass: str = "a10", **status: Any) -> Obj:
    claim = bound_claim(name, count, **status)
    claim["metadata"]["namespace"] = namespace
    claim["metadata"]["uid"] = f"uid-{namespace}-{name}"
    claim["spec"]["className"] = gpuclass
    return claim


def idle_since(moment: str) -> Obj:
    return {
        "usage": {"idleUnitSeconds": 0, "inUseUnitSeconds": 0, "state": "Idle", "since": moment}
    }


def test_namespace_series_sum_the_claims_of_a_class_and_name_no_claim() -> None:
    clock = FakeClock(START)  # the process starts at 08:00, when the claims are bound
    api = ClaimStore()
    api.store(claim_in(NS, "a", 1, **idle_since("2026-03-01T08:00:00Z")))
    api.store(claim_in(NS, "b", 2, **idle_since("2026-03-01T08:00:00Z")))
    api.store(claim_in(NS, "c", 1, gpuclass="l40s", **idle_since("2026-03-01T08:00:00Z")))
    api.store(claim_in("tenant-b", "d", 4, **idle_since("2026-03-01T08:00:00Z")))
    process = Summing(api, clock)
    process.sync()
    clock.advance(1 * HOUR)

    assert process.hours("idle") == 3.0  # 1 h x 1 unit + 1 h x 2 units
    assert process.hours("in_use") == 0.0
    assert process.hours("idle", gpuclass="l40s") == 1.0
    assert process.hours("idle", namespace="tenant-b") == 4.0
    assert all(
        set(labels) == {"namespace", "gpuclass", "state"} for labels in process.series_labels()
    )
    assert len(process.series_labels()) == 3 * 2


def test_a_namespace_sum_does_not_drop_when_a_claim_goes() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(claim_in(NS, "a", 1, **idle_since("2026-03-01T08:00:00Z")))
    api.store(claim_in(NS, "b", 2, **idle_since("2026-03-01T08:00:00Z")))
    process = Summing(api, clock)
    process.sync()
    clock.advance(1 * HOUR)
    assert process.hours("idle") == 3.0

    del api.claims["b"]  # 09:00: b's 2 unit-hours stay in the sum
    process.sync()
    assert process.hours("idle") == 3.0
    clock.advance(1 * HOUR)
    assert process.hours("idle") == 4.0  # + a's second hour

    del api.claims["a"]  # the last claim of the namespace and class: the series stays
    process.sync()
    clock.advance(1 * HOUR)
    assert process.hours("idle") == 4.0


def test_a_new_process_counts_from_zero_and_a_hold_begun_since_in_full() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(claim_in(NS, "old", 1, **idle_since("2026-03-01T08:00:00Z")))
    clock.advance(2 * HOUR)  # 10:00 the process starts; "old" has held 2 h already
    process = Summing(api, clock)
    process.sync()
    assert process.hours("idle") == 0.0

    clock.advance(0.5 * HOUR)  # 10:30 a claim is bound
    api.store(
        claim_in(
            NS, "new", 2, boundTime="2026-03-01T10:30:00Z", **idle_since("2026-03-01T10:30:00Z")
        )
    )
    clock.advance(0.5 * HOUR)  # 11:00, the first scrape that sees it
    process.sync()
    assert process.hours("idle") == 1.0 + 1.0  # old: 10:00-11:00; new: 10:30-11:00 x 2


def test_a_namespace_sum_never_goes_back_while_the_cache_is_behind_a_write() -> None:
    clock = FakeClock(START)
    api = ClaimStore()
    api.store(claim_in(NS, "hold", 1, **idle_since("2026-03-01T08:00:00Z")))
    process = Summing(api, clock)
    process.sync()
    clock.advance(1.5 * HOUR)
    assert process.hours("idle") == 1.5  # its copy says idle since 08:00
    # The stored truth, written at 09:00: 1 h idle, then in use.
    stored = api.claims["hold"]
    usage = {"idleUnitSeconds": 3600, "inUseUnitSeconds": 0, "state": "InUse"}
    api.store(
        {
            **stored,
            "status": {**stored["status"], "usage": {**usage, "since": "2026-03-01T09:00:00Z"}},
        }
    )
    process.sync()
    assert (process.hours("idle"), process.hours("in_use")) == (1.5, 0.5)
    clock.advance(0.5 * HOUR)
    assert (process.hours("idle"), process.hours("in_use")) == (1.5, 1.0)


def test_the_gpu_hours_series_setting_is_a_flag_and_a_configmap_key() -> None:
    args = cli.parser().parse_args(["run", "--gpu-hours-series", "namespace"])
    flags = {key: getattr(args, key, None) for key in settings.OVERRIDES}
    assert settings.load(None, {}, flags).gpu_hours_series == "namespace"
    assert settings.load({"gpuHoursSeries": "namespace"}, {}, {}).gpu_hours_series == "namespace"
    assert settings.load(None, {}, {}).gpu_hours_series == "claim"
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["run", "--gpu-hours-series", "pod"])
