"""Leases in memory, for the elector's tests: a ``leases.LeaseStore`` with the API server's
preconditions and no API server."""

from __future__ import annotations

import threading

from gpuoperator.runtime import errors
from gpuoperator.runtime.leases import LeaderElectionRecord


class InMemoryLeaseStore:
    """A ``LeaseStore`` in a dict: thread-safe, with the API server's
    resourceVersion preconditions (one counter for all Leases, as etcd's revision)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], tuple[LeaderElectionRecord, str]] = {}
        self._revision = 0

    def _next_version(self) -> str:
        self._revision += 1
        return str(self._revision)

    def get(self, namespace: str, name: str) -> tuple[LeaderElectionRecord, str] | None:
        with self._lock:
            return self._leases.get((namespace, name))

    def create(self, namespace: str, name: str, record: LeaderElectionRecord) -> str:
        with self._lock:
            if (namespace, name) in self._leases:
                raise errors.AlreadyExistsError(
                    409, "AlreadyExists", f'leases "{name}" already exists'
                )
            version = self._next_version()
            self._leases[(namespace, name)] = (record, version)
            return version

    def update(
        self, namespace: str, name: str, record: LeaderElectionRecord, resource_version: str
    ) -> str:
        with self._lock:
            current = self._leases.get((namespace, name))
            if current is None:
                raise errors.NotFoundError(404, "NotFound", f'leases "{name}" not found')
            if current[1] != resource_version:
                raise errors.ConflictError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on leases "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            version = self._next_version()
            self._leases[(namespace, name)] = (record, version)
            return version
