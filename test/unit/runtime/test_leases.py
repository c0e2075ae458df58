"""Lease records and their stores: MicroTime, the record's spec, the in-memory store's
preconditions and the Kubernetes store's requests and errors."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any

import pytest

from gpuoperator.runtime import errors, leases
from harness.leases import InMemoryLeaseStore

NS = "gpu-system"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(start: datetime.datetime, seconds: float) -> datetime.datetime:
    return start + datetime.timedelta(seconds=seconds)


def test_micro_time_has_exactly_six_fractional_digits_in_utc() -> None:
    assert leases.format_micro_time(T0) == "2026-01-01T00:00:00.000000Z"
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    t = datetime.datetime(2026, 1, 1, 2, 0, 0, 1234, tzinfo=plus_two)
    assert leases.format_micro_time(t) == "2026-01-01T00:00:00.001234Z"
    assert leases.parse_micro_time("2026-01-01T00:00:00.001234Z") == at(T0, 0.001234)
    assert leases.parse_micro_time("2026-01-01T00:00:00Z") == T0
    assert leases.parse_micro_time("2026-01-01T00:00:00.123456789Z").microsecond == 123456

    spec = leases.LeaderElectionRecord("a", 15, T0, at(T0, 0.5), 3).to_spec()
    assert MICRO_TIME.match(spec["acquireTime"]) and MICRO_TIME.match(spec["renewTime"])
    assert spec["renewTime"] == "2026-01-01T00:00:00.500000Z"
    assert leases.LeaderElectionRecord.from_spec(spec).renew_time == at(T0, 0.5)


def test_in_memory_store_enforces_resource_version_preconditions() -> None:
    store = InMemoryLeaseStore()
    rec = leases.LeaderElectionRecord("a", 15, T0, T0, 0)
    with pytest.raises(errors.NotFoundError):
        store.update(NS, "l", rec, "1")
    v1 = store.create(NS, "l", rec)
    with pytest.raises(errors.AlreadyExistsError):
        store.create(NS, "l", rec)
    v2 = store.update(NS, "l", dataclasses.replace(rec, holder_identity="b"), v1)
    assert v2 != v1
    with pytest.raises(errors.ConflictError):
        store.update(NS, "l", rec, v1)
    assert store.get(NS, "l") == (dataclasses.replace(rec, holder_identity="b"), v2)


@dataclasses.dataclass
class FakeResponse:
    status_code: int
    body: Any

    def json(self) -> Any:
        if isinstance(self.body, str):
            raise ValueError("not JSON")
        return self.body


class FakeAPI:
    """Stands in for ``pykube.HTTPClient``: records requests, answers from a queue."""

    def __init__(self, *responses: FakeResponse) -> None:
        self.responses = list(responses)
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def _answer(self, method: str, kwargs: dict[str, Any]) -> FakeResponse:
        self.requests.append((method, kwargs))
        return self.responses.pop(0)

    def get(self, **kwargs: Any) -> FakeResponse:
        return self._answer("GET", kwargs)

    def post(self, **kwargs: Any) -> FakeResponse:
        return self._answer("POST", kwargs)

    def put(self, **kwargs: Any) -> FakeResponse:
        return self._answer("PUT", kwargs)


def lease_obj(rv: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "l",
            "namespace": NS,
            "resourceVersion": rv,
            "labels": {"team": "gpu"},
        },
        "spec": spec,
    }


def status(code: int, reason: str) -> FakeResponse:
    return FakeResponse(code, {"kind": "Status", "code": code, "reason": reason, "message": "m"})


def test_kube_store_puts_the_whole_lease_with_its_resource_version() -> None:
    held = {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 2,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:01.000000Z",
        "strategy": "OldestEmulationVersion",
    }
    api = FakeAPI(FakeResponse(200, lease_obj("7", held)), FakeResponse(200, lease_obj("8", {})))
    store = leases.KubeLeaseStore(api)

    got = store.get(NS, "l")
    assert got == (leases.LeaderElectionRecord("a", 15, T0, at(T0, 1), 2), "7")
    new = leases.LeaderElectionRecord("b", 15, at(T0, 2), at(T0, 2), 3)
    assert store.update(NS, "l", new, "7") == "8"

    method, kwargs = api.requests[1]
    assert method == "PUT"
    assert (kwargs["version"], kwargs["namespace"], kwargs["url"].strip("/")) == (
        "coordination.k8s.io/v1",
        NS,
        "leases/l",
    )
    sent = json.loads(kwargs["data"])
    assert sent["metadata"]["resourceVersion"] == "7"
    assert sent["metadata"]["labels"] == {"team": "gpu"}  # a PUT must not drop what it read
    assert sent["spec"] == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 3,
        "acquireTime": "2026-01-01T00:00:02.000000Z",
        "renewTime": "2026-01-01T00:00:02.000000Z",
        "strategy": "OldestEmulationVersion",
    }


def test_kube_store_maps_responses_to_typed_errors() -> None:
    rec = leases.LeaderElectionRecord("a", 15, T0, T0, 0)
    api = FakeAPI(
        status(404, "NotFound"),
        status(409, "AlreadyExists"),
        status(409, "Conflict"),
        status(403, "Forbidden"),
        FakeResponse(502, "<html>bad gateway</html>"),
    )
    store = leases.KubeLeaseStore(api)
    assert store.get(NS, "l") is None
    with pytest.raises(errors.AlreadyExistsError):
        store.create(NS, "l", rec)
    assert api.requests[1][0] == "POST" and api.requests[1][1]["url"].strip("/") == "leases"
    with pytest.raises(errors.ConflictError):
        store.update(NS, "l", rec, "3")
    with pytest.raises(errors.ForbiddenError):
        store.get(NS, "l")
    with pytest.raises(errors.ApiError) as info:
        store.get(NS, "l")
    assert info.value.code == 502
