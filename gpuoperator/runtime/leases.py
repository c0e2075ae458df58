"""Lease records and where they are kept: the part of leader election client-go keeps in
``tools/leaderelection/resourcelock``.

The record is the Lease ``spec`` fields leader election reads and writes
(:class:`LeaderElectionRecord`, with Kubernetes ``MicroTime`` timestamps); a
:class:`LeaseStore` gets, creates and replaces it, every write conditional on the
resourceVersion last read, so of two candidates racing for one Lease exactly one wins. The
elector (``leading``) decides what to write; :class:`KubeLeaseStore` keeps the record in a
``coordination.k8s.io/v1`` Lease on the API server.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from collections.abc import Mapping
from typing import Any, Final, Protocol

import pykube

from gpuoperator.runtime import errors, kinds

_LEASE_API_VERSION: Final = "coordination.k8s.io/v1"
_SPEC_FIELDS: Final = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
)
_JSON_HEADERS: Final = {"Content-Type": "application/json"}


# --- MicroTime -------------------------------------------------------------------------------


def format_micro_time(t: datetime.datetime) -> str:
    """Kubernetes ``MicroTime``: RFC 3339 in UTC with exactly six fractional digits and ``Z``
    (``2026-01-01T00:00:00.000000Z``). A naive datetime is taken as UTC."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> datetime.datetime:
    """Parse an RFC 3339 timestamp (any number of fractional digits, ``Z`` or an offset)
    into an aware UTC datetime; digits beyond microseconds are dropped."""
    t = datetime.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.astimezone(datetime.UTC)


# --- The record ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeaderElectionRecord:
    """The Lease spec fields leader election reads and writes.

    Compared field by field to tell whether the record changed since it was last observed;
    its timestamps are never compared with the local clock.
    """

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime.datetime | None
    renew_time: datetime.datetime | None
    lease_transitions: int

    def to_spec(self) -> dict[str, Any]:
        """The Lease ``spec`` (camelCase, MicroTime strings; absent times are omitted)."""
        spec: dict[str, Any] = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        return spec

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> LeaderElectionRecord:
        """Read a Lease ``spec``; missing fields read as client-go reads them ("" and 0)."""
        acquire = spec.get("acquireTime")
        renew = spec.get("renewTime")
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=parse_micro_time(acquire) if acquire else None,
            renew_time=parse_micro_time(renew) if renew else None,
            lease_transitions=int(spec.get("leaseTransitions") or 0),
        )


# --- Storage ---------------------------------------------------------------------------------


class LeaseStore(Protocol):
    """Where the record lives. Writes are conditional on the resourceVersion last read."""

    def get(self, namespace: str, name: str) -> tuple[LeaderElectionRecord, str] | None:
        """The record and its resourceVersion, or None when the Lease does not exist."""

    def create(self, namespace: str, name: str, record: LeaderElectionRecord) -> str:
        """Create the Lease; returns its resourceVersion. ``AlreadyExistsError`` if taken."""

    def update(
        self, namespace: str, name: str, record: LeaderElectionRecord, resource_version: str
    ) -> str:
        """Replace the record if the Lease is still at ``resource_version``; returns the new
        one. ``ConflictError`` when it moved on, ``NotFoundError`` when it is gone."""


class KubeLeaseStore:
    """A ``LeaseStore`` on the API server's Lease objects (``kinds.Lease``).

    Writes are PUTs of the whole Lease with ``metadata.resourceVersion`` (not pykube's
    ``update()``, a merge patch): a stale write is a 409 ``ConflictError``. The last object
    read or written is kept so a PUT carries its labels, annotations and any spec fields
    this module does not manage. Not thread-safe, like the ``HTTPClient`` it owns: use it
    from the elector's thread only.
    """

    def __init__(self, api: pykube.HTTPClient) -> None:
        self._api = api
        self._last: dict[tuple[str, str], dict[str, Any]] = {}

    def _lease(self, namespace: str, name: str) -> Any:
        return kinds.Lease(
            self._api,
            {
                "apiVersion": _LEASE_API_VERSION,
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
            },
        )

    def _remember(self, namespace: str, name: str, obj: dict[str, Any]) -> str:
        self._last[(namespace, name)] = obj
        return str(obj["metadata"]["resourceVersion"])

    def get(self, namespace: str, name: str) -> tuple[LeaderElectionRecord, str] | None:
        resp = self._api.get(**self._lease(namespace, name).api_kwargs())
        if resp.status_code == 404:
            self._last.pop((namespace, name), None)
            return None
        obj = _json_or_raise(resp)
        version = self._remember(namespace, name, obj)
        return LeaderElectionRecord.from_spec(obj.get("spec") or {}), version

    def create(self, namespace: str, name: str, record: LeaderElectionRecord) -> str:
        lease = self._lease(namespace, name)
        obj = copy.deepcopy(lease.obj)
        obj["spec"] = record.to_spec()
        resp = self._api.post(
            **lease.api_kwargs(obj_list=True, data=json.dumps(obj), headers=dict(_JSON_HEADERS))
        )
        return self._remember(namespace, name, _json_or_raise(resp))

    def update(
        self, namespace: str, name: str, record: LeaderElectionRecord, resource_version: str
    ) -> str:
        lease = self._lease(namespace, name)
        last = self._last.get((namespace, name))
        if last is not None and last["metadata"].get("resourceVersion") == resource_version:
            obj = copy.deepcopy(last)
        else:
            obj = copy.deepcopy(lease.obj)
        obj["metadata"]["resourceVersion"] = resource_version
        spec = {k: v for k, v in (obj.get("spec") or {}).items() if k not in _SPEC_FIELDS}
        spec.update(record.to_spec())
        obj["spec"] = spec
        resp = self._api.put(**lease.api_kwargs(data=json.dumps(obj), headers=dict(_JSON_HEADERS)))
        return self._remember(namespace, name, _json_or_raise(resp))


def _json_or_raise(resp: Any) -> dict[str, Any]:
    """The response's object, or the typed ``errors.ApiError`` for a non-2xx status."""
    if 200 <= resp.status_code < 300:
        body: dict[str, Any] = resp.json()
        return body
    try:
        status = resp.json()
    except ValueError:
        status = None
    raise errors.from_status(resp.status_code, status if isinstance(status, dict) else None)
