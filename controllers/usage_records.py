"""Usage records: a ``Workload`` per bound claim, the shape Cozystack's billing reads.

``gpuclaim-<claim>`` in the claim's namespace, with a controller ownerReference to the claim
(garbage collection removes it with the claim) and
``status.resources = {"<class>.gpuclass.cozystack.io/devices": count}``. A claim that is not
Bound (Pending, Lost) has no record; a claim being deleted keeps its record until it goes.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import Caches, own_key
from gpuoperator.kinds import Workload
from gpuoperator.model import claims
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key

log = structlog.get_logger(__name__)

NAME = "usage-records"


def desired(claim: Obj) -> Obj:
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.WORKLOAD,
        "metadata": {
            "name": names.workload_name(meta["name"]),
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.GPU_CLAIM,
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "status": {
            "kind": names.GPU_CLAIM,
            "type": "gpu",
            "resources": {names.quota_key(spec.get("className", "")): int(spec.get("count", 0))},
            "operational": True,
        },
    }


class ApiAccess(protocols.Creates, protocols.Replaces, protocols.Deletes, Protocol):
    """What usage records ask of the API server: a record created, replaced or deleted."""


class ManagerAccess(managing.Controls, Protocol):
    """What ``register`` uses of the manager: the writer of this controller."""

    def writer_for(self, component: str) -> ApiAccess: ...


class UsageRecords:
    def __init__(self, caches: Caches, writer: ApiAccess) -> None:
        self.caches = caches
        self.writer = writer

    def reconcile(self, key: Key) -> Result | None:
        namespace, claim_name = key
        claim = self.caches.claims.store.get(key)
        record_key = (namespace, names.workload_name(claim_name))
        current = self.caches.workloads.store.get(record_key)
        bound = claim is not None and claims.is_bound(claim)
        if not bound:
            if current is not None and _owned_by(current, claim):
                self.writer.delete(
                    Workload, record_key[1], namespace, uid=current["metadata"].get("uid")
                )
                log.info("usage record removed", reason="NotBound", claim=claim_name)
            return None
        assert claim is not None
        want = desired(claim)
        if current is None:
            try:
                self.writer.create(Workload, want)
            except errors.AlreadyExistsError:
                return Result(requeue_after=1.0)
            except errors.NamespaceTerminatingError:
                # The claim goes with its namespace; there is nothing left to bill for.
                log.info(
                    "usage record not created", reason="NamespaceTerminating", claim=claim_name
                )
                return None
            log.info(
                "usage record created",
                reason="Bound",
                claim=claim_name,
                resources=want["status"]["resources"],
            )
            return None
        if not _owned_by(current, claim):
            # A record of an older claim of the same name: garbage collection removes it.
            return Result(requeue_after=2.0)
        if current.get("status") != want["status"]:
            self.writer.replace(Workload, {**current, "status": want["status"]})
        return None


def _owned_by(record: Obj, claim: Obj | None) -> bool:
    """Whether ``record`` belongs to this claim object (or, with no claim, to any claim)."""
    owners = (record.get("metadata") or {}).get("ownerReferences") or []
    if claim is None:
        return any(o.get("kind") == names.GPU_CLAIM for o in owners)
    uid = claim["metadata"].get("uid")
    return any(o.get("kind") == names.GPU_CLAIM and o.get("uid") == uid for o in owners)


def register(manager: ManagerAccess, caches: Caches, workers: int = 2) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        UsageRecords(caches, manager.writer_for(NAME)),
        workers=workers,
        seed=lambda: list(caches.claims.store),
    )

    def from_record(record: Obj) -> list[Key]:
        meta = record["metadata"]
        name = str(meta.get("name", ""))
        if not name.startswith(names.WORKLOAD_PREFIX):
            return []
        return [(meta.get("namespace", ""), name.removeprefix(names.WORKLOAD_PREFIX))]

    manager.add_controller(controller, [(caches.claims, own_key), (caches.workloads, from_record)])
    return controller
