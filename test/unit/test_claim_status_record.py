"""``ClaimStatus.record``: a status write that keeps the claim's phase and node (GPU-hours)
is sent with its resourceVersion and never assumed, so another decision's assumption of the
same claim stays counted, and the decision in flight meets the conflict instead."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controllers import gpu_hours as gpuhoursmod
from gpuoperator import names
from gpuoperator.claim_status import ClaimStatus, Outcome
from gpuoperator.ledger import Ledger
from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import FakeClock
from harness.offline import ClaimStore, FakeRecorder, offline_caches

Obj = dict[str, Any]
RESOURCE = "nvidia.com/GA102GL_A10"


def claim(**status: Any) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"name": "c", "namespace": "t", "uid": "u", "generation": 1},
        "spec": {"className": "a10", "count": 2},
        "status": status,
    }


def world() -> tuple[ClaimStore, Ledger, ClaimStatus]:
    api, ledger = ClaimStore(), Ledger(clock=FakeClock())
    ledger.apply_class(
        {
            "metadata": {"name": "a10"},
            "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
        }
    )
    ledger.apply_node(
        {
            "metadata": {"name": "n1"},
            "spec": {},
            "status": {
                "allocatable": {RESOURCE: "4"},
                "capacity": {RESOURCE: "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    statuses = ClaimStatus(api, ledger, FakeRecorder(), registry=CollectorRegistry())
    return api, ledger, statuses


def test_a_record_leaves_another_decisions_assumption_counted() -> None:
    api, ledger, statuses = world()
    observed = api.store(claim(phase="Pending"))
    ledger.apply_claim(observed)
    # The binder assumed a binding to n1 and its write is in flight.
    ledger.assume({**observed, "status": {"phase": "Bound", "nodeName": "n1"}})
    written = statuses.record(observed, {"phase": "Pending", "usage": {"idleUnitSeconds": 0}})
    assert written.ok
    assumed = ledger.claim(("t", "c"))
    assert assumed is not None
    assert assumed["status"] == {"phase": "Bound", "nodeName": "n1"}
    view = ledger.node("n1")
    assert view is not None
    assert [d["free"] for d in view.devices] == [2]  # the binding's units stay counted
    # The binding then meets the conflict: the record changed the claim first.
    with pytest.raises(errors.ConflictError):
        api.replace_status(None, {**observed, "status": {"phase": "Bound", "nodeName": "n1"}})  # type: ignore[arg-type]


def test_a_record_that_lost_a_race_says_changed() -> None:
    api, _inventory, statuses = world()
    observed = api.store(claim(phase="Bound", nodeName="n1"))
    api.store(api.claims["c"])  # someone wrote meanwhile
    written = statuses.record(observed, {**observed["status"], "usage": {}})
    assert written.outcome is Outcome.CHANGED


def test_a_record_never_changes_phase_or_node() -> None:
    api, _inventory, statuses = world()
    observed = api.store(claim(phase="Bound", nodeName="n1"))
    with pytest.raises(ValueError, match="phase and node"):
        statuses.record(observed, {"phase": "Bound", "nodeName": "n2"})
    with pytest.raises(ValueError, match="phase and node"):
        statuses.record(observed, {"phase": "Pending"})


def test_gpu_hours_never_wait_for_the_decisions_lock() -> None:
    api, ledger, statuses = world()
    caches = offline_caches()
    stored = api.store(claim(phase="Bound", nodeName="n1", boundTime="2026-01-01T00:00:00Z"))
    caches.claims.store.put(stored)
    controller = gpuhoursmod.GpuHours(caches, statuses, clock=FakeClock())
    done = threading.Event()

    def reconcile() -> None:
        controller.reconcile(("t", "c"))
        done.set()

    with ledger.allocation_lock:  # a binder pass is running
        worker = threading.Thread(target=reconcile)
        worker.start()
        assert done.wait(10.0), "the GPU-hours write waited for the binder"
    worker.join(10.0)
    assert api.claims["c"]["status"]["usage"]["state"] == "Idle"
