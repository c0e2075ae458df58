"""Every stored version of every GPUClaim, in etcd's order, and the checks that need the
whole history rather than one snapshot.

Fed by :class:`store.Watch` from etcd (see ``store``), so no version is missed even while
the API server restarts; the same watch feeds the ResourceClaims' record (``allocations``:
no device allocated twice at any revision). Two checks run on it, with their own
arithmetic (docs/design.md §5), nothing taken from the product:

* **Holds never exceed capacity, at any revision.** After each etcd revision the units of
  Bound claims per (node, resource) — on the claim's node, and on the target node of its
  transient hold while its VM live-migrates (``status.migration``) — are compared with the
  capacity a test registered for it (allocatable minus the units of the pods it placed
  there that no claim accounts for). Launcher pods of VMs are accounted by their claims, so
  claims alone are the measure here; pods are checked at snapshots (``oracle``).
* **A claim changes node only through Lost** (its node went), through a refusal (the node
  refused the pinned launcher pod: Pending with reason ``RefusedByNode``), through a
  take-back (Pending with reason ``Preempted``, see below), by a move of the placement
  controller (reason ``Moved``: a claim not yet attached joins the other claims of its VM),
  or with its live-migrated VM (reason ``Migrated``). Anything else — a Bound claim re-bound
  to another node in one write, or re-bound after an unexplained unbind — is a broken hold.
* **A hold ends only as the contract says** (:meth:`ClaimHistory.releases`): its claim is
  deleted, its node is lost, its node refused its VM, or — for a claim of a class the test
  registered as preemptible, and only then — a guaranteed order took it back (reason
  ``Preempted``). A hold of a guaranteed class taken back, or any hold ending otherwise
  while its claim is not being deleted, is a broken promise.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from chaos import allocations, protobuf, store

Obj = dict[str, Any]
CLAIMS_PREFIX = "/registry/cozystack.io/gpuclaims/"
BOUND, PENDING, LOST = "Bound", "Pending", "Lost"
REFUSED_BY_NODE, MOVED, PREEMPTED = "RefusedByNode", "Moved", "Preempted"
#: The Bound reason of a claim that moved with its live-migrated VM.
MIGRATED = "Migrated"


@dataclass(frozen=True)
class Version:
    revision: int
    received: float
    uid: str
    phase: str
    node: str
    reason: str  # the Bound condition's reason
    class_name: str
    count: int
    deleting: bool
    #: What only the leader writes: the status (but the attachment, which the VMI webhook
    #: of any replica records), and the finalizers it removes.
    status: str = ""
    finalizers: int = 0
    refused: tuple[str, ...] = ()
    #: The target node of the claim's transient hold (``status.migration``), "" when none.
    migration_target: str = ""

    @property
    def holds(self) -> bool:
        return self.phase == BOUND and bool(self.node)

    def held_on(self) -> list[str]:
        """The nodes the claim holds its units on: its node while Bound, and the target node
        of its transient hold while a live migration of its VM runs."""
        if not self.holds:
            return []
        if self.migration_target and self.migration_target != self.node:
            return [self.node, self.migration_target]
        return [self.node]


GONE = Version(0, 0.0, "", "", "", "", "", 0, False)


def version_of(event: store.Event) -> Version:
    obj = event.obj
    if obj is None:
        return Version(event.revision, event.received, "", "", "", "gone", "", 0, False)
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    reason = next(
        (
            str(c.get("reason") or "")
            for c in status.get("conditions") or []
            if c.get("type") == BOUND
        ),
        "",
    )
    return Version(
        revision=event.revision,
        received=event.received,
        uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or ""),
        node=str(status.get("nodeName") or ""),
        reason=reason,
        class_name=str(spec.get("className") or ""),
        count=int(spec.get("count") or 0),
        deleting=bool(meta.get("deletionTimestamp")),
        status=json.dumps({k: v for k, v in status.items() if k != "attachment"}, sort_keys=True),
        finalizers=len(meta.get("finalizers") or []),
        refused=tuple(str(r.get("nodeName")) for r in status.get("refusedNodes") or []),
        migration_target=str((status.get("migration") or {}).get("targetNode") or ""),
    )


class ClaimHistory:
    """Feed it with :meth:`on_events`; register classes and capacities before load."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.versions: dict[str, list[Version]] = defaultdict(list)
        #: class name -> resource name
        self.classes: dict[str, str] = {}
        #: the registered classes that are preemptible (``spec.preemptible: true``)
        self.preemptible: set[str] = set()
        #: (node, resource) -> units that claims may hold there
        self.capacity: dict[tuple[str, str], int] = {}
        self._held: dict[tuple[str, str], int] = defaultdict(int)
        self._current: dict[str, Version] = {}
        self.overholds: list[str] = []
        self.revisions = 0
        #: The ResourceClaims' allocations, fed by the same watch (``allocations``).
        self.allocations = allocations.AllocationHistory()
        #: The etcd watch feeding this record (set by whoever starts it).
        self.watch: store.Watch | None = None

    # ---- feeding -----------------------------------------------------------------------
    @staticmethod
    def wanted(key: str) -> bool:
        """The keys this record reads: GPUClaims and ResourceClaims."""
        return key.startswith((CLAIMS_PREFIX, allocations.PREFIX))

    def decode(self, key: str, value: bytes) -> Obj:
        """A stored value as JSON; a ResourceClaim that cannot be read is recorded as such
        (a check then fails) and read as taking nothing, so the watch goes on."""
        if not key.startswith(allocations.PREFIX):
            return dict(json.loads(value))
        try:
            return protobuf.resource_claim(value)
        except ValueError as exc:
            self.allocations.unreadable.append(f"{key}: {exc}")
            return {"metadata": {}, "status": {}}

    def on_events(self, batch: list[store.Event]) -> None:
        held = [e for e in batch if e.key.startswith(allocations.PREFIX)]
        if held:
            self.allocations.on_events(held)
        batch = [e for e in batch if e.key.startswith(CLAIMS_PREFIX)]
        if not batch:
            return
        with self._lock:
            touched: set[tuple[str, str]] = set()
            for event in batch:
                key = event.key.removeprefix(CLAIMS_PREFIX)
                version = version_of(event)
                old = self._current.get(key, GONE)
                for v, sign in ((old, -1), (version, 1)):
                    for spot in self._spots(v):
                        self._held[spot] += sign * v.count
                        touched.add(spot)
                self._current[key] = version
                self.versions[key].append(version)
            self.revisions += 1
            for spot in touched:
                cap = self.capacity.get(spot)
                if cap is not None and self._held[spot] > cap:
                    holders = sorted(
                        f"{k}={v.count}" for k, v in self._current.items() if spot in self._spots(v)
                    )
                    self.overholds.append(
                        f"revision {batch[0].revision}: {spot[0]} {spot[1]}: "
                        f"{self._held[spot]} units held of {cap} ({', '.join(holders)})"
                    )

    def _spots(self, v: Version) -> list[tuple[str, str]]:
        resource = self.classes.get(v.class_name)
        return [(node, resource) for node in v.held_on()] if resource else []

    def retire_node(self, node: str) -> None:
        """The node is deleted: holds still pointing at it until they are Lost fit nothing."""
        with self._lock:
            for spot in [s for s in self.capacity if s[0] == node]:
                del self.capacity[spot]

    # ---- reading -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, list[Version]]:
        with self._lock:
            return {k: list(v) for k, v in self.versions.items()}

    def node_changes(self) -> dict[str, list[str]]:
        """Every change of node of every claim, sorted by how it happened:
        ``lost``, ``refused``, ``moved`` and ``unexplained`` (the violations)."""
        out: dict[str, list[str]] = {
            "lost": [],
            "refused": [],
            "preempted": [],
            "moved": [],
            "migrated": [],
            "unexplained": [],
        }
        for key, versions in self.snapshot().items():
            last_node, uid, via = "", "", ""
            for v in versions:
                if v.uid != uid:  # deleted, or a new claim of the same name
                    last_node, uid, via = "", v.uid, ""
                # A waiting claim may keep naming its last node (Lost, refused): the phase
                # says whether it holds.
                if v.phase == LOST:
                    via = "lost"
                elif v.phase != BOUND and v.reason in (REFUSED_BY_NODE, PREEMPTED) and not via:
                    via = "refused" if v.reason == REFUSED_BY_NODE else "preempted"
                if not v.holds:
                    continue
                if last_node and v.node != last_node:
                    kind = via or {MOVED: "moved", MIGRATED: "migrated"}.get(
                        v.reason, "unexplained"
                    )
                    out[kind].append(f"{key}: {last_node} -> {v.node} at revision {v.revision}")
                last_node, via = v.node, ""
        return out

    def releases(self) -> dict[str, list[str]]:
        """Every end of a hold while its claim was not being deleted, sorted by how it
        happened: ``lost``, ``refused``, ``preempted`` (a preemptible class's hold taken
        back) and the violations: ``guaranteed`` (a hold of a class not registered as
        preemptible taken back) and ``unexplained`` (any other end)."""
        out: dict[str, list[str]] = {
            "lost": [],
            "refused": [],
            "preempted": [],
            "guaranteed": [],
            "unexplained": [],
        }
        for key, versions in self.snapshot().items():
            for before, after in itertools.pairwise(versions):
                if not before.holds or after.holds or not after.uid or after.uid != before.uid:
                    continue  # still held, never held, or the claim is gone (deleted)
                if after.deleting:
                    continue  # the tenant gave it back
                if after.phase == LOST:
                    kind = "lost"
                elif after.reason == REFUSED_BY_NODE:
                    kind = "refused"
                elif after.reason == PREEMPTED:
                    kind = "preempted" if after.class_name in self.preemptible else "guaranteed"
                else:
                    kind = "unexplained"
                out[kind].append(
                    f"{key} ({after.class_name}): {before.node} -> {after.phase or '-'} "
                    f"({after.reason}) at revision {after.revision}"
                )
        return out

    def transitions(self, key: str) -> list[str]:
        """A claim's phases and nodes, for failure messages."""
        return [
            f"{v.revision}:{v.phase or '-'}@{v.node or '-'}({v.reason})"
            + (f"refused={','.join(v.refused)}" if v.refused else "")
            for v in self.snapshot().get(key, [])
        ]

    def first_leader_write_after(self, moment: float) -> float | None:
        """When the first claim write of the leader after ``moment`` (a wall-clock time)
        reached etcd, as received by the watch: a status change (binder, placement) or a
        finalizer removed (claim protection); tenants write neither."""
        first: float | None = None
        for versions in self.snapshot().values():
            for before, after in itertools.pairwise(versions):
                if after.received > moment and _leader_wrote(before, after):
                    if first is None or after.received < first:
                        first = after.received
                    break
        return first

    def count_lost(self) -> int:
        return sum(1 for versions in self.snapshot().values() for v in versions if v.phase == LOST)


def _leader_wrote(before: Version, after: Version) -> bool:
    """Whether the step from ``before`` to ``after`` is a write only the leader makes: a
    status change, or a finalizer removed — which for a claim being deleted removes it."""
    if not after.uid:
        return before.deleting
    if after.uid != before.uid:
        return False
    return before.status != after.status or after.finalizers < before.finalizers
