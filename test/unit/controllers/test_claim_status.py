"""The one claim status write-back, against a scripted writer: how each outcome settles the
inventory's assumption, and what is told."""

from __future__ import annotations

from typing import Any, cast

import pytest
import requests
import structlog
from prometheus_client import CollectorRegistry

from controllers.claim_status import Announcement, ClaimStatus, Outcome
from gpuoperator.inventory import Inventory
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Kind
from gpuoperator.runtime.recording import Recorder

Obj = dict[str, Any]
RESOURCE = "nvidia.com/GA102GL_A10"
KEY = ("t", "hold")


class Writer:
    """Answers each status write with ``answer`` (an object to store, or an exception)."""

    def __init__(self, answer: Obj | BaseException, stored: Obj | None = None) -> None:
        self.answer = answer
        self.stored = stored

    def replace_status(self, _kind: Kind, obj: Obj) -> Obj:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def get(self, _kind: Kind, _name: str, _namespace: str | None = None) -> Obj:
        if self.stored is None:
            raise errors.NotFoundError(404, "NotFound", "gone")
        return self.stored


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def event(self, _obj: Obj, _type: str, reason: str, _message: str, **_: Any) -> None:
        self.reasons.append(reason)


def claim(rv: int, **status: Any) -> Obj:
    return {
        "metadata": {"name": "hold", "namespace": "t", "uid": "u1", "resourceVersion": str(rv)},
        "spec": {"className": "a10", "count": 2},
        "status": status,
    }


BOUND: Obj = {"phase": "Bound", "nodeName": "n1", "boundTime": "2026-01-01T00:00:00Z"}


def inventory() -> Inventory:
    inv = Inventory()
    inv.apply_class(
        {
            "metadata": {"name": "a10"},
            "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
        }
    )
    inv.apply_node(
        {
            "metadata": {"name": "n1"},
            "spec": {},
            "status": {
                "allocatable": {RESOURCE: "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    inv.apply_claim(claim(10))
    return inv


def write(answer: Obj | BaseException, stored: Obj | None = None) -> tuple[Any, Inventory, Events]:
    inv, events = inventory(), Events()
    statuses = ClaimStatus(
        cast("Client", Writer(answer, stored)),
        inv,
        cast("Recorder", events),
        registry=CollectorRegistry(),
    )
    announce = Announcement("claim bound", "Bound", "bound to node n1")
    try:
        with structlog.testing.capture_logs() as logs:
            outcome: Any = statuses.write(claim(10), dict(BOUND), announce)
    except BaseException as exc:
        outcome = exc
    return (outcome, logs), inv, events


def phase(inv: Inventory) -> Any:
    return (inv.claim(KEY) or {}).get("status", {}).get("phase")


def test_a_landed_write_is_confirmed_logged_once_and_recorded() -> None:
    (written, logs), inv, events = write(claim(11, **BOUND))
    assert written.outcome is Outcome.WRITTEN
    assert phase(inv) == "Bound"
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["claim bound"]
    assert events.reasons == ["Bound"]


def test_a_conflict_whose_stored_status_is_this_write_counts_as_written() -> None:
    (written, _), inv, events = write(
        errors.ConflictError(409, "Conflict", "modified"), stored=claim(11, **BOUND)
    )
    assert written.outcome is Outcome.WRITTEN
    assert phase(inv) == "Bound" and events.reasons == ["Bound"]


def test_a_conflict_with_another_writers_status_is_forgotten() -> None:
    (written, _), inv, events = write(
        errors.ConflictError(409, "Conflict", "modified"), stored=claim(11, phase="Pending")
    )
    assert written.outcome is Outcome.CHANGED
    assert phase(inv) is None and events.reasons == []


@pytest.mark.parametrize(
    "failure",
    [
        errors.InvalidError(422, "Invalid", "status.phase: Unsupported value"),
        errors.NotLeaderError("no longer leads", sent=False),
    ],
    ids=["refused", "fenced-before-sending"],
)
def test_a_write_that_surely_did_not_land_is_forgotten(failure: BaseException) -> None:
    (raised, _), inv, _ = write(failure)
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
    (raised, _), inv, _ = write(failure)
    assert raised is failure
    assert inv.assumed_keys() == {KEY} and phase(inv) == "Bound"
    assert inv.next_expiry("a10") is not None
