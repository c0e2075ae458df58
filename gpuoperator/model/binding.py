"""Binding (DESIGN.md §5 "Binding"): which node each pending claim of a class is bound to,
and in which order.

A waiting claim (phase ``Pending``, ``Lost`` or none yet, not being deleted) is bound to one
node that is eligible for its class (:func:`eligibility.is_eligible`), has
``free >= spec.count`` units of the class's resource (:meth:`capacity.Ledger.free`), and is
not among the claim's unexpired ``status.refusedNodes``. Among those the ``placementPolicy``
chooses: ``binpack`` takes the node with the least free that fits (large blocks stay whole for
large orders), ``spread`` the most free; ties go to the smallest node name, so the choice is
deterministic and two replicas (or a replica after a leader change) decide alike.

**Order: strict FIFO per class with bounded bypass.** Claims of one class are considered in
order of creation (:func:`orders.creation_order`). A claim that fits nowhere does not stop
the queue at once: later claims may be bound past it (a small order should not idle while
capacity for a big one accumulates). But each such binding counts as one *bypass* of every
older claim still waiting, and once a waiting claim has been bypassed ``max_bypass`` times
(default :data:`DEFAULT_MAX_BYPASS`) it *blocks the head of the line*: nothing of that class
behind it is bound until it fits, so the capacity that frees goes to it. That is how "a small
order must not starve a big one forever" is kept. ``max_bypass=0`` is plain strict FIFO.

Choices where DESIGN.md is silent:

* Bypass counts are plain data the caller keeps between passes (a dict claim key -> count,
  passed in and returned updated). Losing them (restart, leader change) only restarts the
  counting: fairness is delayed, never capacity over-allocated.
* A claim that cannot fit on any eligible node even when that node is empty (``spec.count``
  above the largest allocatable) never blocks the line and is not counted: it would otherwise
  stop its class forever. Template claims skip the order webhook, so they can be like that.
* Budgets and the vGPU entitlement are not judged here: the caller drops the claims that
  :func:`orders.binding_refusal` refuses before planning (they wait with ``BudgetExceeded``
  or ``NotEntitled``), so such a claim never blocks the line either.
* One plan simulates its bindings on a local copy of the free units, so two claims of one
  plan never both take the last units of a node. The Ledger is only read.
* ``status.refusedNodes`` keeps at most :data:`MAX_REFUSED_NODES` entries, one per node; an
  entry whose ``until`` cannot be read counts as expired.

Every function is pure and idempotent: the same claims, nodes, figures, time and counts give
the same plan.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple

from gpuoperator.model import capacity, claims, conditions, eligibility, orders
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]
Key = capacity.Key
Policy = Literal["binpack", "spread"]

BINPACK: Final = "binpack"
SPREAD: Final = "spread"
#: The most ``status.refusedNodes`` entries a claim keeps (the CRD's maxItems).
MAX_REFUSED_NODES: Final = 16
#: How often a waiting claim may be bypassed before it blocks its class's line.
DEFAULT_MAX_BYPASS: Final = 8


class WaitReason(enum.StrEnum):
    """Why a claim is not bound by a plan; the values are condition reasons."""

    NO_CAPACITY = "NoCapacity"
    QUEUED = "Queued"
    INVALID_COUNT = "InvalidCount"


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A claim left waiting: a condition reason and a message a tenant understands.
    ``str()`` gives ``"<reason>: <message>"``."""

    reason: WaitReason
    message: str

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.message}"


class Plan(NamedTuple):
    """The outcome of :func:`plan`: the bindings to write in order, the bypass counts to keep
    for the next pass, and why every other waiting claim waits."""

    bindings: list[tuple[Key, str]]
    bypass_counts: dict[Key, int]
    waiting: dict[Key, Waiting]


def _key_text(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


# -- refused nodes ---------------------------------------------------------------------------


def _aware(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _refused_entries(refused_nodes: Any) -> dict[str, datetime.datetime | None]:
    """``{nodeName: until}`` (the latest ``until`` per node; ``None`` when unreadable)."""
    out: dict[str, datetime.datetime | None] = {}
    if not isinstance(refused_nodes, list):
        return out
    for entry in refused_nodes:
        if not isinstance(entry, Mapping) or not entry.get("nodeName"):
            continue
        node = str(entry["nodeName"])
        until = conditions.parse_stamp(entry.get("until"))
        previous = out.get(node)
        if node not in out or (until is not None and (previous is None or until > previous)):
            out[node] = until
    return out


def _claim_refusals(claim: Obj) -> dict[str, datetime.datetime | None]:
    return _refused_entries((claim.get("status") or {}).get("refusedNodes"))


def refused_until(claim: Obj, node_name: str, now: datetime.datetime) -> datetime.datetime | None:
    """Until when ``node_name`` is skipped for ``claim`` (``status.refusedNodes``); ``None``
    when it is not, or its refusal has expired (``until <= now``) or cannot be read."""
    until = _claim_refusals(claim).get(node_name)
    return until if until is not None and until > _aware(now) else None


def unexpired_refusals(claim: Obj, now: datetime.datetime) -> set[str]:
    """The nodes ``claim`` must skip at ``now``: its refusals whose ``until`` is later."""
    moment = _aware(now)
    return {n for n, until in _claim_refusals(claim).items() if until and until > moment}


def add_refusal(
    claim_status_refused_nodes: Any,
    node_name: str,
    until: datetime.datetime,
    *,
    now: datetime.datetime | None = None,
) -> list[Obj]:
    """A new ``status.refusedNodes`` with ``node_name`` refused until ``until`` (replacing its
    previous entry), at most :data:`MAX_REFUSED_NODES` entries, sorted by node name.

    Entries whose ``until`` cannot be read are always dropped (they would be skipped anyway
    and have no time to write back); with ``now``, expired entries are dropped too. Beyond
    the cap the entries that expire soonest go first, so expired ones go before live ones.
    The input list is not changed.
    """
    entries = {n: u for n, u in _refused_entries(claim_status_refused_nodes).items() if u}
    entries[node_name] = _aware(until)
    if now is not None:
        moment = _aware(now)
        entries = {n: u for n, u in entries.items() if u > moment}
    while len(entries) > MAX_REFUSED_NODES:
        soonest = min(entries, key=lambda n: (entries[n], n))
        del entries[soonest]
    return [{"nodeName": n, "until": conditions.stamp(u)} for n, u in sorted(entries.items())]


# -- candidates ------------------------------------------------------------------------------


def _serving(cls: Obj, nodes: Iterable[Obj], ledger: capacity.Ledger) -> dict[str, Obj]:
    """The nodes that serve the class (:func:`capacity.serves`), by name."""
    return {
        eligibility.node_name(node): node
        for node in nodes
        if eligibility.node_name(node) and capacity.serves(ledger, node, cls)
    }


class _FreeIndex:
    """The free units of a plan's nodes, kept by amount so each choice costs a walk over the
    few distinct amounts instead of a sort of every node: ``choose`` answers exactly what
    ``choose(_fitting(need, frees, refused), policy)`` does (binpack the least free that
    fits, spread the most, ties to the smallest name). ``frees`` is the same dict the caller
    reads, updated by ``take``."""

    def __init__(self, frees: dict[str, int]) -> None:
        self.frees = frees
        self._names: dict[int, list[str]] = {}
        for name in sorted(frees):
            self._names.setdefault(frees[name], []).append(name)

    def choose(self, need: int, refused: set[str], policy: Policy) -> str | None:
        if policy not in (BINPACK, SPREAD):
            raise ValueError(f"placementPolicy {policy!r}: binpack or spread are allowed")
        if need < 1:
            return None
        amounts = sorted((f for f in self._names if f >= need), reverse=policy == SPREAD)
        for amount in amounts:
            for name in self._names[amount]:  # sorted by name
                if name not in refused:
                    return name
        return None

    def take(self, name: str, units: int) -> None:
        before = self.frees[name]
        after = self.frees[name] = before - units
        names = self._names[before]
        del names[bisect.bisect_left(names, name)]
        if not names:
            del self._names[before]
        bisect.insort(self._names.setdefault(after, []), name)


def _fitting(need: int, frees: Mapping[str, int], refused: set[str]) -> list[tuple[str, int]]:
    if need < 1:
        return []
    return sorted((n, f) for n, f in frees.items() if f >= need and n not in refused)


def candidates(
    claim: Obj,
    cls: Obj,
    nodes: Iterable[Obj],
    ledger: capacity.Ledger,
    now: datetime.datetime,
) -> list[tuple[str, int]]:
    """The nodes ``claim`` may be bound to now, as ``(node name, free units)`` sorted by name:
    eligible for ``cls``, serving its resource with ``free >= spec.count``, not refused."""
    resource = gpuclasses.resource_name(cls)
    frees = {n: ledger.free(n, resource) for n in _serving(cls, nodes, ledger)}
    return _fitting(orders.ordered_count(claim), frees, unexpired_refusals(claim, now))


def choose(candidates: Iterable[tuple[str, int]], policy: Policy) -> str | None:
    """The node ``policy`` picks among ``candidates`` (``None`` when there are none):
    ``binpack`` the least free, ``spread`` the most free; ties to the smallest name."""
    if policy == BINPACK:
        best = min(candidates, key=lambda c: (c[1], c[0]), default=None)
    elif policy == SPREAD:
        best = min(candidates, key=lambda c: (-c[1], c[0]), default=None)
    else:
        raise ValueError(f"placementPolicy {policy!r}: binpack or spread are allowed")
    return None if best is None else best[0]


# -- the queue -------------------------------------------------------------------------------


def is_waiting(claim: Obj) -> bool:
    """Whether the claim waits for a node: phase ``Pending``, ``Lost`` or none yet, and not
    being deleted (a claim on its way out is not given units)."""
    return claims.phase(claim) in claims.WAITING_PHASES and not claims.is_deleting(claim)


def pending_in_order(claims: Iterable[Obj]) -> list[Obj]:
    """The waiting claims (:func:`is_waiting`) in order of creation, then namespace/name:
    the FIFO queue of one class when given one class's claims."""
    return sorted((c for c in claims if is_waiting(c)), key=orders.creation_order)


def head_of_line_blocks(
    bypass_counts: Mapping[Key, int], key: Key, max_bypass: int = DEFAULT_MAX_BYPASS
) -> bool:
    """Whether the waiting claim ``key`` has been bypassed ``max_bypass`` times: then nothing
    of its class behind it is bound until it fits."""
    return bypass_counts.get(key, 0) >= max_bypass


def _units(n: int, adjective: str = "") -> str:
    word = f"{adjective} unit" if adjective else "unit"
    return f"{n} {word}{'' if n == 1 else 's'}"


def _no_capacity(
    cls: Obj,
    need: int,
    frees: Mapping[str, int],
    refused: set[str],
    largest: int,
) -> Waiting:
    resource = gpuclasses.resource_name(cls)
    if not resource:
        message = f"class {gpuclasses.name(cls)} names no device-plugin resource"
    elif not frees:
        message = f"no eligible node serves {resource}"
    elif need > largest:
        message = (
            f"no eligible node has {_units(need)} of {resource} even when empty "
            f"(the most on one node: {largest})"
        )
    else:
        usable = [f for n, f in frees.items() if n not in refused]
        message = (
            f"no eligible node has {_units(need, 'free')} of {resource} "
            f"(most free on one node: {max(usable, default=0)})"
        )
        skipped = sorted(n for n in refused if frees.get(n, 0) >= need)
        if skipped:
            message += f"; skipped until their refusal expires: {', '.join(skipped)}"
    return Waiting(WaitReason.NO_CAPACITY, message)


def plan(
    claims_of_class: Iterable[Obj],
    cls: Obj,
    nodes: Iterable[Obj],
    ledger: capacity.Ledger,
    policy: Policy,
    now: datetime.datetime,
    bypass_counts: Mapping[Key, int],
    *,
    max_bypass: int = DEFAULT_MAX_BYPASS,
) -> Plan:
    """Plan one pass of the binder for class ``cls``: the bindings to write, in order, the
    updated bypass counts, and why each other waiting claim waits.

    ``claims_of_class`` may include bound claims and claims of other classes: only waiting
    claims (:func:`is_waiting`) of ``cls`` are planned. Each binding is simulated on a local
    copy of the free units, so the plan never places more on a node than its free units. The
    returned counts keep only claims still waiting; the caller passes them back next pass.
    """
    name = gpuclasses.name(cls)
    resource = gpuclasses.resource_name(cls)
    serving = _serving(cls, nodes, ledger)
    frees = {n: ledger.free(n, resource) for n in serving}
    by_free = _FreeIndex(frees)
    largest = max((ledger.allocatable(n, resource) for n in serving), default=0)
    queue = [c for c in pending_in_order(claims_of_class) if orders.ordered_class(c) == name]

    bindings: list[tuple[Key, str]] = []
    counts: dict[Key, int] = {}
    waiting: dict[Key, Waiting] = {}
    passed: list[Key] = []  # older claims that wait and may still be bypassed
    blocker: Key | None = None
    for claim in queue:
        key = claims.key(claim)
        need = orders.ordered_count(claim)
        if blocker is not None:
            waiting[key] = Waiting(
                WaitReason.QUEUED, f"waiting behind older claim {_key_text(blocker)}"
            )
            if key in bypass_counts:
                counts[key] = bypass_counts[key]
            continue
        if need < 1:
            waiting[key] = Waiting(
                WaitReason.INVALID_COUNT, "spec.count must be a whole number of at least 1"
            )
            continue
        refused = unexpired_refusals(claim, now)
        node = by_free.choose(need, refused, policy)
        if node is not None:
            by_free.take(node, need)
            bindings.append((key, node))
            for older in passed:
                counts[older] += 1
            blocker = next((k for k in passed if counts[k] >= max_bypass), None)
            continue
        waiting[key] = _no_capacity(cls, need, frees, refused, largest)
        if need > largest:
            continue  # fits nowhere even when empty: never blocks the line
        counts[key] = bypass_counts.get(key, 0)
        if head_of_line_blocks(counts, key, max_bypass):
            blocker = key
        else:
            passed.append(key)
    return Plan(bindings, counts, waiting)
