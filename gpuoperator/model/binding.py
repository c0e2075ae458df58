"""Binding (docs/design.md §5 "Binding"): which node each pending claim of a class is bound to,
and in which order.

A waiting claim (phase ``Pending``, ``Lost`` or none yet, not being deleted) is bound to one
node that is eligible for its class (:func:`eligibility.is_eligible`), has
``free >= spec.count`` units of the class's resource (:meth:`capacity.Ledger.free`), and is
not among the claim's unexpired ``status.refusedNodes``. Among those the ``placementPolicy``
chooses: ``binpack`` takes the node with the least free that fits (large blocks stay whole for
large orders), ``spread`` the most free; ties go to the smallest node name, so the choice is
deterministic and two replicas (or a replica after a leader change) decide alike.

**Order: FIFO per class with backfill, not head-of-line blocking.** Claims of one class are
considered in order of creation (:func:`orders.creation_order`) and each is bound as soon as
a node fits it. The oldest waiting claim that fits nowhere *nominates* the node where it will
fit soonest: among the nodes it may be bound to (serving the class, not in its unexpired
``refusedNodes``, with ``allocatable >= spec.count``), the one with the fewest units missing
(``spec.count - free``), ties to the smallest name. Younger claims of the class are then
bound anywhere except into the units that nomination needs — all of the nominated node's
free units, since fewer are free there than it needs — so a small order never idles while a
big one waits elsewhere, and the big one is never starved: the units that free on its node
stay free until it fits (:class:`Nomination`).

Choices where docs/design.md is silent:

* One nomination per class: only the oldest waiting claim that can ever fit nominates; a
  younger claim that fits nowhere else just waits (``NoCapacity``, or ``Queued`` when it
  would fit only into the kept units). Several nominations would let a burst of big orders
  keep every node's units idle.
* The nomination is not remembered: every pass nominates afresh on the figures it reads, so
  a nominated node that becomes ineligible (NotReady, cordoned, an untolerated taint) or
  gone, or that the claim's launcher pod was refused on (``refusedNodes``), is replaced at
  the next pass by the next nearest node, and a restart or a leader change loses nothing.
  Between passes the nomination cannot drift away from a node that is freeing up: younger
  claims never take its units, so the fewest units missing only ever goes down as units
  free; it moves only to a node that is nearer still.
* The nominated node is chosen by distance only, whatever ``placementPolicy`` says; the
  policy still picks, among the nodes that fit, where each claim (the nominating one once it
  fits, and every younger one outside the nominated node) is bound.
* A claim that cannot fit even on an empty node (``spec.count`` above the allocatable of
  every node it may be bound to) nominates nothing and keeps nothing: it would stop its
  class forever. Template claims skip the order webhook, so they can be like that.
* Nominations are per class. Classes that share one resource name have queues of their own:
  a claim of another class may take units a nomination keeps (as may a pod outside the
  holds); the nomination then moves or waits longer, it is never over-allocated.
* Budgets and the vGPU entitlement are not judged here: the caller drops the claims that
  :func:`orders.binding_refusal` refuses before planning (they wait with ``BudgetExceeded``
  or ``NotEntitled``), so such a claim never nominates.
* Messages name nodes and the class, never another claim: the claims of a class belong to
  many tenants, and a ``Bound`` condition is read by the claim's own tenant.
* One plan simulates its bindings on a local copy of the free units, so two claims of one
  plan never both take the last units of a node. The Ledger is only read.
* ``status.refusedNodes`` keeps at most :data:`MAX_REFUSED_NODES` entries, one per node; an
  entry whose ``until`` cannot be read counts as expired.

**Migration targets** (docs/design.md §5 "Live migration", :func:`migration_target`). A live
migration's transient holds go to one node for all the VM's claims, by these rules: each
claim's :func:`candidates` (eligible, free units, not refused), never the source, chosen by
``placementPolicy`` (the free units of the claims' resource rank the nodes, less what older
waiting claims keep there; with several resources, the fewest). A migration goes before
younger waiting claims, not before older ones: this module's :func:`plan` of each class's
waiting claims created before the youngest migrating claim (:func:`older_waiting`) says what
they keep (:func:`kept_by`): the units its bindings take on their nodes and the whole of
the node its nomination keeps. Waiting claims the binder would refuse for a budget or the
entitlement are not told apart: they may keep units from a migration, never the other way
round.

Every function is pure and idempotent: the same claims, nodes, figures and time give the same
plan.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

from gpuoperator.model import capacity, claims, conditions, dra_devices, eligibility, orders
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]
Key = capacity.Key
Policy = Literal["binpack", "spread"]

BINPACK: Final = "binpack"
SPREAD: Final = "spread"
#: The most ``status.refusedNodes`` entries a claim keeps (the CRD's maxItems).
MAX_REFUSED_NODES: Final = 16


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


@dataclasses.dataclass(frozen=True)
class Nomination:
    """The node the oldest waiting claim of a class that fits nowhere will fit on soonest:
    ``missing`` more units must free on ``node`` for its ``need``; younger claims of the
    class are not bound there meanwhile."""

    claim: Key
    node: str
    need: int
    missing: int


class Plan(NamedTuple):
    """The outcome of :func:`plan`: the bindings to write in order, why every other waiting
    claim waits, and the class's nomination (``None`` when no claim waits for one)."""

    bindings: list[tuple[Key, str]]
    waiting: dict[Key, Waiting]
    nomination: Nomination | None


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


def serving_nodes(cls: Obj, nodes: Iterable[Obj], ledger: capacity.Ledger) -> list[str]:
    """The names of the nodes that serve the class, sorted."""
    return sorted(_serving(cls, nodes, ledger))


def _preference(policy: Policy) -> Callable[[tuple[str, int]], tuple[int, str]]:
    """How ``policy`` ranks ``(node, free units)``: ``binpack`` the least free first,
    ``spread`` the most; ties by name."""
    if policy == BINPACK:
        return lambda c: (c[1], c[0])
    if policy == SPREAD:
        return lambda c: (-c[1], c[0])
    raise ValueError(f"placementPolicy {policy!r}: binpack or spread are allowed")


def policy_order(frees: Iterable[tuple[str, int]], policy: Policy) -> list[tuple[str, int]]:
    """``(node, free units)`` in the order ``policy`` prefers them (:func:`choose` takes the
    first)."""
    return sorted(frees, key=_preference(policy))


def dra_figures(
    cls: Obj, nodes: Iterable[Obj], devices: dra_devices.Inventory
) -> tuple[dict[str, int], dict[str, int]]:
    """A DRA class's free and allocatable devices per eligible node that has any device of
    it that no blocking taint keeps (docs/design.md §5 "DRA classes"): the plan's figures."""
    frees: dict[str, int] = {}
    allocatables: dict[str, int] = {}
    for node in nodes:
        name = eligibility.node_name(node)
        view = devices.nodes.get(name)
        if view is None or not eligibility.is_eligible(node, cls):
            continue
        usable = sum(1 for d in view.devices if not d.tainted)
        if usable:
            frees[name], allocatables[name] = view.free, usable
    return frees, allocatables


def _what(cls: Obj) -> str:
    """What serves a class's units, in messages: its resource, or its DeviceClass."""
    source = gpuclasses.dra(cls)
    if source is not None:
        return f"DeviceClass {source.device_class_name}"
    return gpuclasses.resource_name(cls)


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
    best = min(candidates, key=_preference(policy), default=None)
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


def _units(n: int, adjective: str = "") -> str:
    word = f"{adjective} unit" if adjective else "unit"
    return f"{n} {word}{'' if n == 1 else 's'}"


def _no_capacity(
    cls: Obj,
    need: int,
    frees: Mapping[str, int],
    refused: set[str],
    largest: int,
    *,
    dra_counted: bool = False,
) -> Waiting:
    resource = _what(cls)
    dra = gpuclasses.dra(cls)
    if dra is not None and not dra_counted:
        message = (
            f"class {gpuclasses.name(cls)} is a DRA class (spec.source.dra, DeviceClass "
            f"{dra.device_class_name}): binding claims to DRA devices is not built yet; "
            "classes with spec.source.devicePlugin are bound"
        )
    elif not resource:
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


def nominate(
    need: int,
    frees: Mapping[str, int],
    allocatables: Mapping[str, int],
    refused: set[str],
) -> tuple[str, int] | None:
    """The node a claim of ``need`` units that fits nowhere now will fit on soonest, with the
    units missing there: among the nodes of ``frees`` not in ``refused`` whose allocatable
    is at least ``need``, the fewest units missing (``need - free``), ties to the smallest
    name. ``None`` when no such node exists (it cannot fit even on an empty node)."""
    nearest = min(
        (
            (max(0, need - frees[n]), n)
            for n in frees
            if n not in refused and allocatables.get(n, 0) >= need
        ),
        default=None,
    )
    return None if nearest is None else (nearest[1], nearest[0])


def _nominated(base: Waiting, nomination: Nomination) -> Waiting:
    return Waiting(
        base.reason,
        f"{base.message}; waiting for {_units(nomination.missing, 'more')} on node "
        f"{nomination.node}, kept for this claim (younger claims of the class are not "
        "bound there)",
    )


def _kept(cls: Obj, need: int, nomination: Nomination) -> Waiting:
    return Waiting(
        WaitReason.QUEUED,
        f"{_units(need, 'free')} of {_what(cls)} "
        f"{'is' if need == 1 else 'are'} left only on node "
        f"{nomination.node}, kept for an older claim of class {gpuclasses.name(cls)} that "
        "waits for room there (claims of a class are served in order of creation)",
    )


def plan(
    claims_of_class: Iterable[Obj],
    cls: Obj,
    nodes: Iterable[Obj],
    ledger: capacity.Ledger,
    policy: Policy,
    now: datetime.datetime,
    *,
    devices: dra_devices.Inventory | None = None,
) -> Plan:
    """Plan one pass of the binder for class ``cls``: the bindings to write, in order, why
    each other waiting claim waits, and the class's nomination (module docstring).

    ``claims_of_class`` may include bound claims and claims of other classes: only waiting
    claims (:func:`is_waiting`) of ``cls`` are planned. Each binding is simulated on a local
    copy of the free units, so the plan never places more on a node than its free units.

    For a DRA class the units are the free devices of ``devices`` (the class's inventory,
    with what counted claims hold) on its eligible nodes, and allocatable those no blocking
    taint keeps; which devices each binding takes is ``dra_holds.assign``'s. Without
    ``devices`` a DRA class's claims wait, saying DRA binding is not built.
    """
    name = gpuclasses.name(cls)
    resource = gpuclasses.resource_name(cls)
    dra_counted = devices is not None and gpuclasses.is_dra(cls)
    if devices is not None and dra_counted:
        frees, allocatables = dra_figures(cls, nodes, devices)
    else:
        serving = _serving(cls, nodes, ledger)
        frees = {n: ledger.free(n, resource) for n in serving}
        allocatables = {n: ledger.allocatable(n, resource) for n in serving}
    by_free = _FreeIndex(frees)
    largest = max(allocatables.values(), default=0)
    queue = [c for c in pending_in_order(claims_of_class) if orders.ordered_class(c) == name]

    bindings: list[tuple[Key, str]] = []
    waiting: dict[Key, Waiting] = {}
    nomination: Nomination | None = None
    for claim in queue:
        key = claims.key(claim)
        need = orders.ordered_count(claim)
        if need < 1:
            waiting[key] = Waiting(
                WaitReason.INVALID_COUNT, "spec.count must be a whole number of at least 1"
            )
            continue
        refused = unexpired_refusals(claim, now)
        kept = {nomination.node} if nomination is not None else set()
        node = by_free.choose(need, refused | kept, policy)
        if node is not None:
            by_free.take(node, need)
            bindings.append((key, node))
            continue
        if nomination is None:
            nearest = nominate(need, frees, allocatables, refused)
            base = _no_capacity(cls, need, frees, refused, largest, dra_counted=dra_counted)
            if nearest is None:
                waiting[key] = base  # cannot fit even when empty: keeps nothing
            else:
                nomination = Nomination(key, nearest[0], need, nearest[1])
                waiting[key] = _nominated(base, nomination)
            continue
        if nomination.node not in refused and frees[nomination.node] >= need:
            waiting[key] = _kept(cls, need, nomination)
        else:
            waiting[key] = _no_capacity(cls, need, frees, refused, largest, dra_counted=dra_counted)
    return Plan(bindings, waiting, nomination)


# -- migration targets -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kept:
    """What the older waiting claims of one class keep from a migration: the units their
    plan's bindings take per node, and the node their nomination keeps (``""``: none)."""

    units: Mapping[str, int]
    nominated: str = ""


def older_waiting(claims_of_class: Iterable[Obj], migrating: Iterable[Obj]) -> list[Obj]:
    """The waiting claims (``pending_in_order``) created before the youngest of the
    ``migrating`` claims: those a migration does not go before."""
    youngest = max((orders.creation_order(c) for c in migrating), default=None)
    if youngest is None:
        return []
    return [c for c in pending_in_order(claims_of_class) if orders.creation_order(c) < youngest]


def kept_by(plan: Plan, queue: Iterable[Obj]) -> Kept:
    """What ``plan`` (the binder's plan of the ``queue`` of :func:`older_waiting` claims)
    keeps: its bindings' units per node and its nomination's node."""
    counts = {claims.key(c): orders.ordered_count(c) for c in queue}
    units: dict[str, int] = {}
    for key, node in plan.bindings:
        units[node] = units.get(node, 0) + counts.get(key, 0)
    return Kept(units, plan.nomination.node if plan.nomination is not None else "")


@dataclasses.dataclass(frozen=True)
class MigrationTarget:
    """The node chosen for a migration's transient holds."""

    node: str


@dataclasses.dataclass(frozen=True)
class NoMigrationTarget:
    """No node takes the migration: ``message`` says why, naming the units and class."""

    message: str


def migration_target(
    migrating: Sequence[Obj],
    classes: Mapping[str, Obj],
    nodes: Iterable[Obj],
    ledger: capacity.Ledger,
    policy: Policy,
    now: datetime.datetime,
    *,
    source: str,
    kept: Mapping[str, Kept],
) -> MigrationTarget | NoMigrationTarget:
    """One target node for the transient holds of ``migrating`` (the VM's claims, Bound on
    ``source``; ``classes`` by name) on the ledger's figures (module docstring, "Migration
    targets"); ``kept`` is :func:`kept_by` of each class."""
    nodes = list(nodes)
    need: dict[str, int] = {}
    resource_classes: dict[str, set[str]] = {}
    allowed: set[str] | None = None
    for claim in migrating:
        cls = classes[orders.ordered_class(claim)]
        resource = gpuclasses.resource_name(cls)
        need[resource] = need.get(resource, 0) + orders.ordered_count(claim)
        resource_classes.setdefault(resource, set()).add(gpuclasses.name(cls))
        fitting = {n for n, _ in candidates(claim, cls, nodes, ledger, now)}
        allowed = fitting if allowed is None else allowed & fitting
    nominated = {k.nominated for k in kept.values() if k.nominated}
    ranked: list[tuple[str, int]] = []
    for node in sorted((allowed or set()) - {source} - nominated):
        left = {
            resource: ledger.free(node, resource)
            - sum(kept[c].units.get(node, 0) for c in resource_classes[resource] if c in kept)
            for resource in need
        }
        if all(left[resource] >= units for resource, units in need.items()):
            ranked.append((node, min(left.values())))
    chosen = choose(ranked, policy)
    if chosen is not None:
        return MigrationTarget(chosen)
    return NoMigrationTarget(_no_target_message(migrating, classes, nodes, need, source, nominated))


def _no_target_message(
    migrating: Sequence[Obj],
    classes: Mapping[str, Obj],
    nodes: Sequence[Obj],
    need: Mapping[str, int],
    source: str,
    nominated: set[str],
) -> str:
    names_ = sorted({orders.ordered_class(c) for c in migrating})
    wanted = ", ".join(f"{_units(units)} of {resource}" for resource, units in sorted(need.items()))
    others = [
        eligibility.node_name(n)
        for n in nodes
        if eligibility.node_name(n) != source
        and all(eligibility.is_eligible(n, classes[c]) for c in names_)
    ]
    why = (
        f"no eligible node other than the source {source} has {wanted} free"
        if others
        else f"no node other than the source {source} is eligible for the class"
    )
    if nominated:
        why += f"; kept for older waiting claims (served first): {', '.join(sorted(nominated))}"
    return (
        f"live migration needs {wanted} (class {', '.join(names_)}) on another node: {why}; "
        "the migration was cancelled"
    )
