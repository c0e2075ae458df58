"""The one claim status write-back, against the fake API server scripted to answer each
outcome: how each outcome settles the ledger's assumption, and what is told."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests
import structlog
from prometheus_client import CollectorRegistry

from gpuoperator.claim_status import Announcement, ClaimStatus, Outcome
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger
from gpuoperator.runtime import errors
from harness import objects
from harness.offline import FakeApi, FakeRecorder

Obj = dict[str, Any]
RESOURCE = "nvidia.com/GA102GL_A10"
KEY = ("t", "hold")
Scenario = Callable[[FakeApi], None]

BOUND: Obj = {"phase": "Bound", "nodeName": "n1", "boundTime": "2026-01-01T00:00:00Z"}


def someone_else_writes(**status: Any) -> Scenario:
    """Another writer's status lands just before this write (which then meets a 409)."""

    def scenario(api: FakeApi) -> None:
        def first(_obj: Obj) -> None:
            current = api.stored(GPUClaim, "hold", "t")
            assert current is not None
            api.add(GPUClaim, {**current, "status": status})

        api.before["hold"] = first

    return scenario


def lands_then_conflicts(api: FakeApi) -> None:
    """The write lands, but is answered 409 (a retry meeting its own first attempt)."""
    api.land_then_conflict.add("hold")


def fails_with(failure: BaseException) -> Scenario:
    def scenario(api: FakeApi) -> None:
        def fail(_obj: Obj) -> None:
            raise failure

        api.before["hold"] = fail

    return scenario


def write(scenario: Scenario | None = None) -> tuple[Any, Ledger, FakeRecorder]:
    api, events = FakeApi(), FakeRecorder()
    current = api.add(GPUClaim, objects.claim("hold", namespace="t", uid="u1", count=2))
    inv = Ledger()
    inv.apply_class(objects.gpuclass(resource=RESOURCE))
    inv.apply_node(objects.node("n1", {RESOURCE: 4}))
    inv.apply_claim(current)
    if scenario is not None:
        scenario(api)
    statuses = ClaimStatus(api, inv, events, registry=CollectorRegistry())
    announce = Announcement("claim bound", "Bound", "bound to node n1")
    try:
        with structlog.testing.capture_logs() as logs:
            outcome: Any = statuses.write(current, dict(BOUND), announce)
    except BaseException as exc:
        outcome = exc
    return (outcome, logs), inv, events


def phase(inv: Ledger) -> Any:
    return (inv.claim(KEY) or {}).get("status", {}).get("phase")


def test_a_landed_write_is_confirmed_logged_once_and_recorded() -> None:
    (written, logs), inv, events = write()
    assert written.outcome is Outcome.WRITTEN
    assert phase(inv) == "Bound"
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["claim bound"]
    assert events.reasons() == ["Bound"]


def test_a_conflict_whose_stored_status_is_this_write_counts_as_written() -> None:
    (written, _), inv, events = write(lands_then_conflicts)
    assert written.outcome is Outcome.WRITTEN
    assert phase(inv) == "Bound" and events.reasons() == ["Bound"]


def test_a_conflict_with_another_writers_status_is_forgotten() -> None:
    (written, _), inv, events = write(someone_else_writes(phase="Pending"))
    assert written.outcome is Outcome.CHANGED
    assert phase(inv) is None and events.reasons() == []


@pytest.mark.parametrize(
    "failure",
    [
        errors.InvalidError(422, "Invalid", "status.phase: Unsupported value"),
        errors.NotLeaderError("no longer leads", sent=False),
    ],
    ids=["refused", "fenced-before-sending"],
)
def test_a_write_that_surely_did_not_land_is_forgotten(failure: BaseException) -> None:
    (raised, _), inv, _ = write(fails_with(failure))
    assert raised is failure
    assert inv.assumed_keys() == set() and phase(inv) is None


@pytest.mark.parametrize(
    "failure",
    [
        errors.ApiError(500, "InternalError", "etcdserver: request timed out"),
        requests.ReadTimeout("read timed out"),
        errors.NotLeaderError("no longer leads", sent=True),
    ],
    ids=["5xx", "timeout", "fenced-between-retries"],
)
def test_a_write_that_may_have_landed_stays_counted(failure: BaseException) -> None:
    (raised, _), inv, _ = write(fails_with(failure))
    assert raised is failure
    assert inv.assumed_keys() == {KEY} and phase(inv) == "Bound"
    assert inv.next_expiry("a10") is not None
