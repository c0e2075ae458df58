"""Preemptible classes (docs/design.md §5 "Preemptible classes"): which spot holds a
guaranteed order takes back, on which node.

A GPUClass with ``spec.preemptible: true`` sells units that can be taken back. Several
classes may share one resource on one node (the StorageClass model), so a guaranteed order
(a claim of a class that is not preemptible) can fit on a node only once some of the
preemptible holds there give their units back. This module decides what is taken back; the
binder carries it out. The rules, in the order they apply:

* Only **preemptible** holds are ever taken: a hold of a guaranteed class is never chosen,
  whatever it would free.
* **Idle before running**: holds that serve no VM (stopped VMs, holds not used yet) are
  taken first; running spot VMs only when the idle ones are not enough. Among each kind the
  **newest** goes first: for idle holds the one bound last, for running ones the VM started
  last (the one that has had its units for the shortest time).
* **Never more than needed**: the chosen set is taken in that order until it covers what the
  order lacks, then every chosen hold whose units are not needed to cover it is given back
  to the set's remainder (running ones first, then idle, oldest first), so no chosen hold
  could be left out and the order still fit (the set is inclusion-minimal).
* **Least disruption across nodes**: of the nodes where a take-back makes the order fit, the
  one that stops the fewest running VMs, then takes back the fewest units, then comes first
  in the caller's order (the placement policy's) is chosen.

A hold being deleted is not taken (its units free anyway) and counts as neither. Every
function is pure and idempotent; the inputs are plain values, so the rules are testable
without objects.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuoperator.model import binding, capacity, claims, conditions, draining, objects, orders
from gpuoperator.model import classes as gpuclasses

Key = claims.Key

#: The condition on a preemptible claim whose running VM is to be stopped for a guaranteed
#: order (True from the notice until the hold is taken back or no order needs it).
CONDITION: Final = "Preempting"
#: Its reason while the VM runs on borrowed time, and once it has been stopped.
STOP_SCHEDULED: Final = "StopScheduled"
VM_STOPPED: Final = "VMStopped"
#: The Event reasons of a notice withdrawn, and of the VM stopped.
CANCELLED: Final = "PreemptionCancelled"


@dataclasses.dataclass(frozen=True)
class SpotHold:
    """A preemptible hold on a node: its claim, units, whether a VM runs on it, and since
    when it is what it is (bound for an idle hold, the VM's start for a running one)."""

    key: Key
    count: int
    running: bool
    since: datetime.datetime


@dataclasses.dataclass(frozen=True)
class TakeBack:
    """What a guaranteed order takes back on ``node``: ``holds`` in the order they are
    taken, covering ``short`` units the node lacks for the order."""

    node: str
    short: int
    holds: tuple[SpotHold, ...]

    @property
    def units(self) -> int:
        return sum(h.count for h in self.holds)

    @property
    def running(self) -> int:
        """How many running VMs the take-back stops."""
        return sum(1 for h in self.holds if h.running)


def _preference(hold: SpotHold) -> tuple[bool, float, Key]:
    # Idle first, then newest first; the key breaks ties so the order is total.
    return (hold.running, -hold.since.timestamp(), hold.key)


def reclaimable(holds: Iterable[SpotHold]) -> int:
    """The units a guaranteed order could take back from ``holds``."""
    return sum(max(h.count, 0) for h in holds)


def take_back(node: str, short: int, holds: Iterable[SpotHold]) -> TakeBack | None:
    """The spot holds on ``node`` to take back so that ``short`` more units free there,
    or ``None`` when all of them together are not enough. ``short <= 0`` needs nothing."""
    if short <= 0:
        return TakeBack(node, 0, ())
    ordered = sorted((h for h in holds if h.count > 0), key=_preference)
    chosen: list[SpotHold] = []
    covered = 0
    for hold in ordered:
        if covered >= short:
            break
        chosen.append(hold)
        covered += hold.count
    if covered < short:
        return None
    # Give back what is not needed: running holds first, then idle ones, oldest first
    # (the reverse of the preference), while the rest still covers the shortfall.
    for hold in sorted(chosen, key=_preference, reverse=True):
        if covered - hold.count >= short:
            chosen.remove(hold)
            covered -= hold.count
    return TakeBack(node, short, tuple(chosen))


def choose(
    need: int,
    nodes: Sequence[tuple[str, int, Sequence[SpotHold]]],
) -> TakeBack | None:
    """Where a guaranteed order of ``need`` units fits by taking back spot holds: ``nodes``
    are ``(name, free units, spot holds there)`` in the placement policy's order. A node
    where the order fits without taking anything back is not a take-back (the binder binds
    there as usual) and is skipped. ``None`` when no node fits even with every spot hold
    taken."""
    best: TakeBack | None = None
    best_rank: tuple[int, int, int] | None = None
    for position, (name, free, holds) in enumerate(nodes):
        short = need - max(free, 0)
        if short <= 0:
            continue
        found = take_back(name, short, holds)
        if found is None:
            continue
        rank = (found.running, found.units, position)
        if best_rank is None or rank < best_rank:
            best, best_rank = found, rank
    return best


def _since(value: Any) -> datetime.datetime:
    return conditions.parse_stamp(value) or datetime.datetime.min.replace(tzinfo=datetime.UTC)


def spot_holds(
    node_name: str,
    claims_on_node: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
    preemptible_classes: Iterable[str],
) -> list[SpotHold]:
    """The preemptible holds bound to ``node_name``: claims of a class in
    ``preemptible_classes``, not being deleted. A claim serving a VM instance counts as
    running (stopping it goes through KubeVirt), since the VM instance's creation; an idle
    one since its ``boundTime``. ``vmis`` are the cached VM instances by key."""
    spot = set(preemptible_classes)
    by_key = {objects.key(c): c for c in claims_on_node}
    out = []
    for hold in draining.holds_on(node_name, by_key.values(), vmis):
        if hold.class_name not in spot or hold.role is draining.Role.RELEASING:
            continue
        if hold.role is draining.Role.BLOCKING:
            vmi = vmis.get((hold.key[0], hold.vmi)) or {}
            meta = vmi.get("metadata")
            stamp = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
            out.append(SpotHold(hold.key, hold.count, True, _since(stamp)))
        else:
            status = by_key[hold.key].get("status")
            stamp = status.get("boundTime") if isinstance(status, Mapping) else None
            out.append(SpotHold(hold.key, hold.count, False, _since(stamp)))
    return out


def spot_classes(cls: Mapping[str, Any], classes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The preemptible classes whose holds a claim of ``cls`` may take back: every
    preemptible class on the same device-plugin resource, when ``cls`` itself is not
    preemptible (a spot order takes nothing back); none for a DRA class (not built)."""
    resource = gpuclasses.resource_name(dict(cls))
    if not resource or gpuclasses.preemptible(dict(cls)):
        return []
    return sorted(
        gpuclasses.name(dict(c))
        for c in classes
        if gpuclasses.preemptible(dict(c)) and gpuclasses.resource_name(dict(c)) == resource
    )


def _by_node(found: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Bound claims by their node (each node's holds are then read once, not per node)."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for claim in found:
        node = claims.node_name(claim)
        if node and claims.is_bound(claim):
            out.setdefault(node, []).append(claim)
    return out


def take_back_for(
    claim: Mapping[str, Any],
    cls: Mapping[str, Any],
    spot: Iterable[str],
    nodes: Iterable[dict[str, Any]],
    ledger: capacity.Ledger,
    spot_claims: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
    policy: binding.Policy,
    now: datetime.datetime,
    *,
    running: bool = False,
) -> TakeBack | None:
    """What the guaranteed ``claim`` of ``cls`` takes back, and where (:func:`choose`),
    among the nodes serving ``cls`` that it has not refused and that could hold it at all
    (allocatable >= its count), in the placement policy's order. ``spot`` are the classes
    it may take from (:func:`spot_classes`), ``spot_claims`` their claims as counted.

    Without ``running`` only idle spot holds are candidates (what the binder takes back at
    once); with it running spot VMs are too (what the preemption controller stops, after
    the grace period, when idle holds are not enough)."""
    spot = set(spot)
    if not spot:
        return None
    need = orders.ordered_count(dict(claim))
    if need < 1:
        return None
    resource = gpuclasses.resource_name(dict(cls))
    refused = binding.unexpired_refusals(dict(claim), now)
    names = [
        n
        for n in binding.serving_nodes(dict(cls), nodes, ledger)
        if n not in refused and ledger.allocatable(n, resource) >= need
    ]
    ordered = binding.policy_order(((n, ledger.free(n, resource)) for n in names), policy)
    on_node = _by_node(spot_claims)
    layout = []
    for name, free in ordered:
        found = spot_holds(name, on_node.get(name, ()), vmis, spot)
        holds = [h for h in found if running or not h.running]
        layout.append((name, free, holds))
    return choose(need, layout)


def room(
    cls: Mapping[str, Any],
    spot: Iterable[str],
    nodes: Iterable[dict[str, Any]],
    ledger: capacity.Ledger,
    spot_claims: Iterable[Mapping[str, Any]],
) -> tuple[int, int]:
    """``(reclaimable, most on one node)`` for a claim of ``cls``: the units of the
    preemptible holds (of ``spot``, idle or running a VM) on the nodes serving ``cls``, and
    the most units one claim can get on one of them, free and taken back together (class
    status; the order webhook admits up to it)."""
    spot = set(spot)
    resource = gpuclasses.resource_name(dict(cls))
    on_node = _by_node(spot_claims)
    total, most = 0, 0
    for name in binding.serving_nodes(dict(cls), nodes, ledger):
        units = reclaimable(spot_holds(name, on_node.get(name, ()), {}, spot))
        total += units
        most = max(most, ledger.free(name, resource) + units)
    return total, most


def notice_message(vmi: str, order: str, order_class: str, node: str, at: datetime.datetime) -> str:
    return (
        f"VM {vmi} will be stopped at {conditions.stamp(at)} (preemptionGrace): guaranteed "
        f"claim {order} of class {order_class} needs the units it uses on node {node}; stop "
        "it before then to choose the moment yourself"
    )


def stopped_message(vmi: str, order: str) -> str:
    return f"VM {vmi} was stopped: guaranteed claim {order} takes back the units it used"


def cancelled_message() -> str:
    return "no guaranteed order needs the units of this claim's VM any more; it keeps running"


def notice(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The claim's :data:`CONDITION` when it is True."""
    status = claim.get("status")
    found = conditions.find(
        status.get("conditions") if isinstance(status, Mapping) else None, CONDITION
    )
    return found if found is not None and found.get("status") == "True" else None


def stop_at(claim: Mapping[str, Any], grace: float) -> datetime.datetime | None:
    """When the VM on ``claim`` is to be stopped: ``grace`` seconds after the notice was
    given (its condition's ``lastTransitionTime``); ``None`` without a notice."""
    found = notice(claim)
    since = conditions.parse_stamp(found.get("lastTransitionTime")) if found else None
    return None if since is None else since + datetime.timedelta(seconds=grace)
