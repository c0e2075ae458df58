"""Every stored version of every ResourceClaim's allocation, in etcd's order, and the check
that needs the whole history: **no device is allocated twice, at any revision**.

A DRA class's hold is an allocated ResourceClaim (docs/design.md §5 "DRA classes"); the
binder writes the allocations of its holds and kube-scheduler those of pods, and DRA lets
one device be in one allocation at a time (an allocation with ``adminAccess`` takes no
device). After each etcd revision the devices of every allocation then stored — each
``(driver, pool, device)`` of ``status.allocation.devices.results`` — are counted with
plain arithmetic, nothing taken from the product; a device in two allocations at once is a
device sold twice, whoever wrote them.

Fed by the same etcd watch as ``history`` (``chaos.store``), so no version is missed while
the API server restarts; values are decoded by ``chaos.protobuf``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from chaos import store

Obj = dict[str, Any]
#: Where kube-apiserver stores ResourceClaims (a built-in kind: no group in the key).
PREFIX = "/registry/resourceclaims/"
Device = tuple[str, str, str]


@dataclass(frozen=True)
class Allocation:
    revision: int
    uid: str
    devices: tuple[Device, ...]
    node: str
    #: The controller ownerReference, ``Kind/name`` ("" if none).
    owner: str


def node_of(allocation: Obj) -> str:
    """The node an allocation's node selector names by ``metadata.name`` (as the binder
    writes it), else by the hostname label; "" when it names none."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field, key in (
            ("matchFields", "metadata.name"),
            ("matchExpressions", "kubernetes.io/hostname"),
        ):
            for req in term.get(field) or []:
                if req.get("key") == key and req.get("operator") == "In" and req.get("values"):
                    return str(req["values"][0])
    return ""


def devices_of(claim: Obj | None) -> tuple[Device, ...]:
    """The devices a stored ResourceClaim's allocation takes (admin access takes none)."""
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    return tuple(
        (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess")
    )


def allocation_of(revision: int, claim: Obj | None) -> Allocation:
    if claim is None:
        return Allocation(revision, "", (), "", "")
    meta = claim.get("metadata") or {}
    owner = next(
        (
            f"{r.get('kind')}/{r.get('name')}"
            for r in meta.get("ownerReferences") or []
            if r.get("controller")
        ),
        "",
    )
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return Allocation(
        revision, str(meta.get("uid") or ""), devices_of(claim), node_of(allocation), owner
    )


class AllocationHistory:
    """Feed it with :meth:`on_events` (ResourceClaim keys only)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.versions: dict[str, list[Allocation]] = defaultdict(list)
        self._current: dict[str, Allocation] = {}
        #: device -> the keys whose allocation holds it now
        self._holders: dict[Device, set[str]] = defaultdict(set)
        #: Every revision at which a device was in two allocations, described.
        self.twice: list[str] = []
        #: Devices ever allocated (for the figures).
        self.allocated: set[Device] = set()
        #: Stored values that could not be decoded (the record is then incomplete).
        self.unreadable: list[str] = []

    def on_events(self, batch: list[store.Event]) -> None:
        with self._lock:
            touched: set[Device] = set()
            for event in batch:
                key = event.key.removeprefix(PREFIX)
                new = allocation_of(event.revision, event.obj)
                old = self._current.get(key)
                for device in old.devices if old else ():
                    self._holders[device].discard(key)
                    touched.add(device)
                for device in new.devices:
                    self._holders[device].add(key)
                    touched.add(device)
                    self.allocated.add(device)
                self._current[key] = new
                if not old or old.devices != new.devices or old.uid != new.uid:
                    self.versions[key].append(new)
            revision = batch[0].revision if batch else 0
            for device in sorted(touched):
                holders = self._holders[device]
                if len(holders) > 1:
                    self.twice.append(
                        f"revision {revision}: {'/'.join(device)} allocated in "
                        + ", ".join(sorted(holders))
                    )

    def held(self) -> dict[Device, set[str]]:
        """Each device allocated now, with its holders."""
        with self._lock:
            return {d: set(h) for d, h in self._holders.items() if h}

    def transitions(self, key: str) -> list[str]:
        """A ResourceClaim's allocations, for failure messages."""
        with self._lock:
            return [
                f"{a.revision}:{a.uid[:8] or 'gone'}@{a.node or '-'}"
                f"[{','.join(d for _, _, d in a.devices)}]"
                for a in self.versions.get(key, [])
            ]
