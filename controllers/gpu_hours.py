"""GPU-hours: each claim's ``status.usage`` follows what its units do (``model.gpu_hours``),
and a collector exports the totals as Prometheus counters on every replica.

**The controller** (leader only; key = a claim, woken by the claim and by the VMIs it may
serve). When the claim's state (not held, idle, in use) differs from the one its
``status.usage`` records, the open interval is closed and the next one opened, in one write
through the claim status write-back's ``ClaimStatus.record`` (resourceVersion precondition,
fenced writer, the watch's copy of the claim as the base). The write keeps the claim's phase
and node, so it is never assumed into the ledger and takes no decision lock: the
binder's passes never wait for it, and a binding in flight on the same claim meets a 409
and decides again. A conflict here (the binder or placement wrote first) is decided again on
the fresh claim.

**The collector** (every replica, computed on each scrape from the claims cache):
``gpuoperator_claim_gpu_unit_seconds_total{namespace, claim, uid, gpuclass, state}`` with
``state`` ``idle`` or ``in_use``: the totals of ``model.gpu_hours.totals`` at the scrape.
Why per claim, and why this stays a counter:

* The value is a function of persisted status and the time, so a replica that becomes
  leader, or any replica at all, reports what the last leader reported: no restart, no
  doubling (dashboards take ``max`` over the replicas, then ``sum`` by namespace and class).
* A deleted claim's series ends (its samples stay in Prometheus) instead of making a
  namespace's sum go down, which Prometheus would read as a counter reset and count again in
  full; a claim recreated under the same name is another ``uid``, another series.
* A replica's cache can be a moment behind a write that closed an interval; each series
  reported by this process is therefore never lower than it reported before (the next
  write catches up within that moment).

The series name tenants' namespaces and claims: only the hoster's monitoring may read them
(the metrics endpoint authorises every scrape; the ``gpu-operator-metrics-reader`` role is
for the hoster's Prometheus alone). With the setting ``gpuHoursSeries: namespace`` the
collector exports ``gpuoperator_claim_gpu_unit_seconds_total{namespace, gpuclass, state}``
instead, one series per namespace and class: what the namespace's claims of the class
accrued while this process watched (``model.gpu_hours.accrued``, read at each scrape), so a
sum never drops when a claim goes, and it starts from zero in a new process, which
Prometheus reads as a counter reset. As with the series per claim, what a claim accrues
between the last scrape and its removal is not seen.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuoperator.caches import Caches, own_key
from gpuoperator.claim_status import Announcement, ClaimStatus, Outcome
from gpuoperator.model import claim_states, gpu_hours, orders
from gpuoperator.runtime import managing
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key, key_of

log = structlog.get_logger(__name__)

NAME = "gpu-hours"
LABELS: Final = ("namespace", "claim", "uid", "gpuclass", "state")
#: The labels of the series summed per namespace and class (``gpuHoursSeries: namespace``).
NAMESPACE_LABELS: Final = ("namespace", "gpuclass", "state")
#: The values of the ``gpuHoursSeries`` setting.
PER_CLAIM: Final = "claim"
PER_NAMESPACE: Final = "namespace"
FAMILY: Final = "gpuoperator_claim_gpu_unit_seconds"
#: Seconds before a reconcile that lost a write race looks again.
RETRY: Final = 1.0
NOT_HELD: Final = "NotHeld"


class GpuHours:
    def __init__(
        self,
        caches: Caches,
        statuses: ClaimStatus,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.statuses = statuses
        self.clock = clock

    def reconcile(self, key: Key) -> Result | None:
        claim = self.caches.claims.store.get(key)
        if claim is None:
            return None
        change = self._change(claim)
        if change is None:
            return None
        usage, new, state, vmi_name = change
        status = claim_states.counted(claim, new)
        reason = state.value if state is not None else NOT_HELD
        written = self.statuses.record(
            claim,
            status,
            Announcement(
                "claim usage state changed",
                reason,
                f"GPU usage {reason} since {status['usage']['since']}",
                event=None,
                fields={
                    "previous": usage.state.value if usage.state else NOT_HELD,
                    "vmi": vmi_name or None,
                    "idleUnitSeconds": new.idle,
                    "inUseUnitSeconds": new.in_use,
                },
            ),
        )
        if written.outcome is Outcome.CHANGED:
            return Result(requeue_after=RETRY)
        return None

    def _change(
        self, claim: Obj
    ) -> tuple[gpu_hours.Usage, gpu_hours.Usage, gpu_hours.State | None, str] | None:
        """``(recorded usage, usage to write, state, VMI name)``, or None: nothing changed."""
        vmi_name = gpu_hours.served_vmi_name(claim)
        change = gpu_hours.transition(claim, self.caches.served_vmi(claim), self.clock.now())
        if change is None:
            return None
        usage, new, state = change
        return usage, new, state, vmi_name


class UnitSecondsCollector(Collector):
    """``gpuoperator_claim_gpu_unit_seconds_total`` computed on each scrape (module
    docstring); a series never goes below what this process reported for it before."""

    def __init__(self, caches: Caches, *, clock: Clock = SYSTEM) -> None:
        self.caches = caches
        self.clock = clock
        self._lock = threading.Lock()
        self._reported: dict[tuple[str, ...], float] = {}

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            FAMILY,
            "GPU unit-seconds held per claim: idle (Bound, its VM not running) and in_use "
            "(its VM instance running); derived from the claims' status.usage",
            labels=LABELS,
        )

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        now = self.clock.now()
        with self._lock:
            reported: dict[tuple[str, ...], float] = {}
            for claim in self.caches.claims.store.values():
                usage = gpu_hours.read(claim)
                if usage.since is None:
                    continue  # never held
                meta = claim.get("metadata") or {}
                totals = gpu_hours.totals(usage, orders.ordered_count(claim), now)
                base = (
                    str(meta.get("namespace") or ""),
                    str(meta.get("name") or ""),
                    str(meta.get("uid") or ""),
                    orders.ordered_class(claim),
                )
                for state, value in (("idle", totals.idle), ("in_use", totals.in_use)):
                    labels = (*base, state)
                    reported[labels] = max(value, self._reported.get(labels, 0.0))
                    family.add_metric(list(labels), reported[labels])
            self._reported = reported
        yield family


class NamespaceUnitSecondsCollector(Collector):
    """``gpuoperator_claim_gpu_unit_seconds_total{namespace, gpuclass, state}``: per
    namespace and class, the unit-seconds the claims accrued while this process watched
    (module docstring). Every sum only grows: a claim's readings count from its highest
    earlier one, and a claim that goes leaves what it accrued in the sum."""

    def __init__(self, caches: Caches, *, clock: Clock = SYSTEM) -> None:
        self.caches = caches
        self.clock = clock
        self.started = clock.now()
        self._lock = threading.Lock()
        #: claim uid -> (namespace, class) and the highest totals counted for it
        self._counted: dict[str, tuple[tuple[str, str], gpu_hours.Totals]] = {}
        #: (namespace, class) -> unit-seconds idle and in use
        self._sums: dict[tuple[str, str], gpu_hours.Totals] = {}

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            FAMILY,
            "GPU unit-seconds held by the claims of a namespace, per class: idle (Bound, its "
            "VM not running) and in_use (its VM instance running), accrued while this process "
            "ran; derived from the claims' status.usage",
            labels=NAMESPACE_LABELS,
        )

    def _count(self, claim: Obj, now: datetime.datetime) -> str | None:
        """Add what ``claim`` accrued since it was last counted; its uid (None: never held)."""
        usage = gpu_hours.read(claim)
        if usage.since is None:
            return None
        meta = claim.get("metadata") or {}
        uid = str(meta.get("uid") or "") or "/".join(key_of(claim))
        group = (str(meta.get("namespace") or ""), orders.ordered_class(claim))
        totals = gpu_hours.totals(usage, orders.ordered_count(claim), now)
        known = self._counted.get(uid)
        if known is not None:
            before: gpu_hours.Totals | None = known[1]
        else:
            before = None if gpu_hours.bound_since(claim, self.started) else totals
        added = gpu_hours.accrued(before, totals)
        sums = self._sums.get(group, gpu_hours.Totals(0.0, 0.0))
        self._sums[group] = gpu_hours.Totals(sums.idle + added.idle, sums.in_use + added.in_use)
        self._counted[uid] = (group, gpu_hours.highest(before, totals))
        return uid

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        now = self.clock.now()
        with self._lock:
            present = {
                uid
                for uid in (self._count(c, now) for c in self.caches.claims.store.values())
                if uid is not None
            }
            for uid in set(self._counted) - present:
                del self._counted[uid]  # gone: what it accrued stays in the sum
            for (namespace, class_name), sums in sorted(self._sums.items()):
                for state, value in (("idle", sums.idle), ("in_use", sums.in_use)):
                    family.add_metric([namespace, class_name, state], value)
        yield family


def claims_served_by(caches: Caches, vmi: Obj) -> list[Key]:
    """The claims of the VMI's namespace that name it as the VM instance they serve."""
    ns, name = key_of(vmi)
    return [
        key_of(c)
        for c in caches.claims_of_vmi(ns, name)
        if name and gpu_hours.served_vmi_name(c) == name
    ]


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager."""


def register(
    manager: ManagerAccess,
    caches: Caches,
    statuses: ClaimStatus,
    registry: CollectorRegistry | None = None,
    *,
    series: str = PER_CLAIM,
) -> Controller[Key]:
    """The controller (run while leading) and the collector (on every replica): series per
    claim, or per namespace and class (``series``: the ``gpuHoursSeries`` setting)."""
    collector: Collector
    if series == PER_NAMESPACE:
        collector = NamespaceUnitSecondsCollector(caches, clock=manager.clock)
    else:
        collector = UnitSecondsCollector(caches, clock=manager.clock)
    (registry or manager.registry).register(collector)
    controller = manager.controller(
        NAME,
        GpuHours(caches, statuses, clock=manager.clock),
        workers=2,
        seed=lambda: list(caches.claims.store),
    )
    manager.add_controller(
        controller,
        [(caches.claims, own_key), (caches.vmis, lambda vmi: claims_served_by(caches, vmi))],
    )
    return controller
