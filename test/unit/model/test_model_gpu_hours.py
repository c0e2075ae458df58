"""A claim's GPU-hours in its status: held time split into idle and in use, closed at each
change of state and counted on from ``since`` by whoever reads it next."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuoperator.model import gpu_hours
from gpuoperator.model.gpu_hours import State, Totals, Usage

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def held_claim(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "hold", "namespace": "t", "uid": "c1"},
        "spec": {"className": "a10", "count": 2},
        "status": {"phase": "Bound", "nodeName": "n1", **status},
    }


def template_claim(owner_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vm-gpu-0",
            "namespace": "t",
            "labels": {"gpu.cozystack.io/template-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }


def vmi(name: str, uid: str, phase: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t", "uid": uid, **meta},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        ("Pending", State.IDLE),
        ("Scheduling", State.IDLE),
        ("Scheduled", State.IN_USE),
        ("Running", State.IN_USE),
        ("Succeeded", State.IDLE),
        ("Failed", State.IDLE),
    ],
)
def test_a_held_claim_is_in_use_while_its_vmi_has_a_running_pod(phase: str, state: State) -> None:
    claim = held_claim(attachment={"vmi": "vm", "uid": "v1"})
    assert gpu_hours.state_of(claim, vmi("vm", "v1", phase)) is state


def test_a_vmi_being_deleted_still_uses_the_gpu() -> None:
    claim = held_claim(attachment={"vmi": "vm", "uid": "v1"})
    gone_soon = vmi("vm", "v1", "Running", deletionTimestamp="2026-01-01T00:00:00Z")
    assert gpu_hours.state_of(claim, gone_soon) is State.IN_USE


def test_another_vmi_of_the_same_name_does_not_use_the_claim() -> None:
    claim = held_claim(attachment={"vmi": "vm", "uid": "v1"})
    assert gpu_hours.state_of(claim, vmi("vm", "v2", "Running")) is State.IDLE
    unconfirmed = held_claim(attachment={"vmi": "vm"})
    assert gpu_hours.state_of(unconfirmed, vmi("vm", "v2", "Running")) is State.IN_USE


def test_a_template_claim_is_in_use_while_its_owner_runs() -> None:
    assert gpu_hours.served_vmi_name(template_claim("v1")) == "vm"
    assert gpu_hours.state_of(template_claim("v1"), vmi("vm", "v1", "Running")) is State.IN_USE
    assert gpu_hours.state_of(template_claim("v1"), vmi("vm", "v9", "Running")) is State.IDLE


def test_a_claim_that_is_not_bound_holds_nothing() -> None:
    claim = held_claim()
    claim["status"] = {"phase": "Pending"}
    assert gpu_hours.state_of(claim, None) is None
    assert gpu_hours.state_of(held_claim(), None) is State.IDLE


def test_each_change_closes_the_open_interval_in_unit_seconds() -> None:
    usage = gpu_hours.advance(Usage(), State.IDLE, 2, at(0))
    assert usage == Usage(0, 0, State.IDLE, at(0))
    usage = gpu_hours.advance(usage, State.IN_USE, 2, at(600))
    assert usage == Usage(1200, 0, State.IN_USE, at(600))
    assert gpu_hours.advance(usage, State.IN_USE, 2, at(700)) is usage
    usage = gpu_hours.advance(usage, None, 2, at(900))
    assert usage == Usage(1200, 600, None, at(900))
    totals = gpu_hours.totals(usage, 2, at(5000))
    assert (totals.idle, totals.in_use) == (1200, 600)


def test_the_open_interval_counts_for_its_state_up_to_now() -> None:
    usage = Usage(100, 50, State.IN_USE, at(0))
    totals = gpu_hours.totals(usage, 2, at(30.5))
    assert (totals.idle, totals.in_use, totals.held) == (100, 111, 211)


def test_a_since_in_the_future_counts_nothing_yet() -> None:
    totals = gpu_hours.totals(Usage(10, 0, State.IDLE, at(60)), 1, at(0))
    assert (totals.idle, totals.in_use) == (10, 0)


def test_a_hold_starts_at_its_binding_when_first_recorded_late() -> None:
    usage = gpu_hours.advance(Usage(), State.IDLE, 1, at(300), bound_time=at(10))
    assert usage == Usage(0, 0, State.IDLE, at(10))


def test_a_rebound_claim_never_counts_before_its_last_hold_ended() -> None:
    ended = Usage(500, 0, None, at(1000))
    usage = gpu_hours.advance(ended, State.IDLE, 1, at(2000), bound_time=at(900))
    assert usage == Usage(500, 0, State.IDLE, at(1000))
    future = gpu_hours.advance(ended, State.IDLE, 1, at(2000), bound_time=at(3000))
    assert future.since == at(2000)


def test_moments_are_whole_seconds() -> None:
    usage = gpu_hours.advance(Usage(0, 0, State.IDLE, at(0)), State.IN_USE, 3, at(10.9))
    assert usage == Usage(30, 0, State.IN_USE, at(10))


def test_status_round_trip() -> None:
    usage = Usage(7, 8, State.IN_USE, at(3))
    status = gpu_hours.to_status(usage)
    assert status == {
        "idleUnitSeconds": 7,
        "inUseUnitSeconds": 8,
        "state": "InUse",
        "since": "2026-01-01T00:00:03Z",
    }
    assert gpu_hours.read({"status": {"usage": status}}) == usage
    ended = gpu_hours.to_status(Usage(7, 8, None, at(3)))
    assert "state" not in ended
    assert gpu_hours.read({"status": {"usage": ended}}) == Usage(7, 8, None, at(3))


def test_unreadable_usage_reads_as_never_held() -> None:
    bad = {"status": {"usage": {"idleUnitSeconds": -4, "inUseUnitSeconds": "x", "state": "Up"}}}
    assert gpu_hours.read(bad) == Usage()


def test_accrued_is_the_growth_per_state_and_never_negative() -> None:
    assert gpu_hours.accrued(None, Totals(5.0, 7.0)) == Totals(5.0, 7.0)
    assert gpu_hours.accrued(Totals(5.0, 7.0), Totals(8.0, 7.0)) == Totals(3.0, 0.0)
    # A reading from a cache behind a write may be ahead of the next one in a state.
    assert gpu_hours.accrued(Totals(9.0, 0.0), Totals(6.0, 3.0)) == Totals(0.0, 3.0)
    assert gpu_hours.highest(Totals(9.0, 0.0), Totals(6.0, 3.0)) == Totals(9.0, 3.0)
    assert gpu_hours.highest(None, Totals(6.0, 3.0)) == Totals(6.0, 3.0)


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        ("2026-01-01T00:00:10Z", True),
        ("2026-01-01T00:00:09Z", False),
        (None, False),
        ("not a time", False),
    ],
)
def test_bound_since_reads_the_bound_time(bound: str | None, expected: bool) -> None:
    claim = held_claim(boundTime=bound) if bound is not None else held_claim()
    assert gpu_hours.bound_since(claim, at(10.4)) is expected
