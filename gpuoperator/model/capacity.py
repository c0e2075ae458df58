"""Free GPU units per node and per class (docs/design.md §5 "Capacity", "Holds are the
operator's ledger, not kubelet's").

For node N and resource R::

    free(N, R) = allocatable(N, R) - Σ count of bound claims on N whose class uses R
                                   - Σ usage of R by the pods on N that no claim accounts for

clamped at 0. kube-scheduler does not see holds, so pods can reach units the ledger has
promised to claims; the amount below zero is the node's *overrun* and the pods using R there
are reported as over-committing, instead of showing a negative free.

The :class:`Ledger` keeps these figures incrementally: each update touches only the node(s)
involved (the pod's node, or its old and new node when it moved; a rebound claim's old and
new node), never the whole cluster, and returns the names of the nodes whose figures changed
so callers recompute only those. Choices where docs/design.md is silent:

* A claim holds units while ``status.phase == "Bound"`` with a ``status.nodeName``, **even
  while it is being deleted**: budgets stop charging a claim once it is being deleted
  (§3), but the claim protection finalizer keeps such a claim while its VM still runs on the
  units, so capacity releases them only when the claim is gone (or stops being Bound).
* A pod counts on its ``spec.nodeName`` while it is not terminated (scheduled-but-pending
  pods included: the scheduler has already given them the units), with
  :func:`gpuoperator.model.pods.pod_usage`; pods without GPU use are not stored at all.
* "No claim accounts for" is decided by ownership (docs/design.md §5, §10): the launcher pods a
  VMI controls on node N (:func:`gpuoperator.model.pods.launcher_vmi`) are covered, per
  resource and all together, by at most the units that VMI's Bound claims hold on N
  (:func:`gpuoperator.model.claims.covering_vmi`); whatever they use beyond that counts like
  any pod's. A label never covers anything, and two pods claiming one VMI share its cover
  instead of each getting it. A held claim covers through its ``status.attachment.uid`` only
  (the attachments controller records name and UID together; an attachment without UID, left
  by an earlier version, covers nothing until it has one): a launcher pod on the node
  meanwhile counts in full (fewer free units, never more).
* **Transient holds** (docs/design.md §5 "Live migration",
  :func:`gpuoperator.model.migrations.transient_hold`). A Bound claim with
  ``status.migration`` holds its ``spec.count`` units on ``status.migration.targetNode`` as
  well as on ``status.nodeName``, until the field is cleared (not charged to budgets: budgets
  count claims, not nodes). The transient hold covers, on its target node, only the VMI's
  migration target pods of that migration (``kubevirt.io/migrationJobUID`` equal to
  ``status.migration.uid``, :func:`gpuoperator.model.pods.migration_job`), as the claim covers
  the launcher pod on its node. A target pod of another migration, or on another node, or of
  a migration without a transient hold, is covered by nothing there and counts in full. The
  claim's own hold covers every pod its VMI controls on the claim's node, migration target
  pods included: once a migration has succeeded the claim is on the target node and the
  target pod, which keeps its label, is the VM's launcher pod.
* So every unit is counted at least once: a VMI's pods on one node get, per resource, at most
  what its claims hold there (their own holds for any of its pods, a transient hold only for
  the pods of its migration), and each hold is counted in ``claimed`` whoever it covers.
* Pods and claims are kept per node name even when the node itself is unknown or removed
  (a node's object can go before the pods on it): free on an unknown node is 0, and the
  figures come back consistent if a node of that name reappears.

Keys of pods and claims are ``(namespace, name)`` tuples. A Ledger is not thread-safe: the
caller serialises updates and reads (one lock, or a single owning thread).

Functions here are pure and idempotent; the Ledger is a plain in-memory structure whose
setters can be replayed (setting the same object twice changes nothing).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

from gpuoperator.model import claims, eligibility, migrations, pods, quantities
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]
Key = claims.Key


class Device(TypedDict):
    """One entry of ``GPUNode.status.devices``."""

    resourceName: str
    capacity: int
    allocatable: int
    allocated: int
    free: int


class ClassFree(TypedDict):
    """One entry of ``GPUNode.status.classes``."""

    name: str
    free: int


def _counts(resources: Any) -> dict[str, int]:
    if not isinstance(resources, dict):
        return {}
    return {
        resource: quantities.parse_count(quantity)
        for resource, quantity in resources.items()
        if quantities.is_extended(resource)
    }


@dataclasses.dataclass(frozen=True)
class _Hold:
    """Where a claim holds units: ``count`` of ``resource`` on ``node``, covering the pods of
    the VMI ``user`` (``(namespace, uid)``; ``None``: no pod) there: any of them for the
    claim's own hold (``job`` ``""``), only the target pods of migration ``job`` for a
    transient hold."""

    node: str
    resource: str
    count: int
    user: Key | None
    job: str = ""


@dataclasses.dataclass(frozen=True)
class _Use:
    """Where a pod takes units: ``usage`` (resource → units, none at 0) on ``node``; ``vmi``
    is the ``(namespace, uid)`` of the VMI controlling it when it is a launcher pod, ``job``
    the migration it is the target pod of (``""``: none)."""

    node: str
    usage: tuple[tuple[str, int], ...]
    vmi: Key | None
    job: str = ""


@dataclasses.dataclass
class _Group:
    """The launcher pods of one VMI on one node and the units its claims hold there.

    Invariants: ``usage[J][R]`` is the sum of usage of R over the ``pods`` of migration ``J``
    (``""``: pods that are no migration's target); ``cover[R]`` the sum of ``count`` over the
    VMI's claims holding R on this node; ``job_cover[J][R]`` the same over the transient
    holds of migration ``J`` on this node. A transient hold covers only its migration's pods,
    a claim's own hold any pod of the group, so the group's contribution to the node's
    ``requested`` is ``Σ_R max(0, Σ_J max(0, usage[J][R] - job_cover[J][R]) - cover[R])``
    (its pods together get at most what its holds there cover, whatever the number of pods).
    Kept while it has a pod or a hold."""

    pods: set[Key] = dataclasses.field(default_factory=set)
    claims: int = 0
    usage: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    cover: dict[str, int] = dataclasses.field(default_factory=dict)
    job_cover: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def excess(self) -> dict[str, int]:
        left: dict[str, int] = {}
        for job, used in self.usage.items():
            kept = self.job_cover.get(job, {}) if job else {}
            for r, units in used.items():
                if units > kept.get(r, 0):
                    left[r] = left.get(r, 0) + units - kept.get(r, 0)
        return {
            r: units - self.cover.get(r, 0)
            for r, units in left.items()
            if units > self.cover.get(r, 0)
        }

    def use(self, job: str, usage: Iterable[tuple[str, int]], sign: int) -> None:
        used = self.usage.setdefault(job, {})
        for resource, units in usage:
            _shift(used, resource, sign * units)
        if not used:
            del self.usage[job]

    def hold(self, hold: _Hold, sign: int) -> None:
        self.claims += sign
        if not hold.job:
            _shift(self.cover, hold.resource, sign * hold.count)
            return
        kept = self.job_cover.setdefault(hold.job, {})
        _shift(kept, hold.resource, sign * hold.count)
        if not kept:
            del self.job_cover[hold.job]


@dataclasses.dataclass
class _NodeFigures:
    """The figures of one node name.

    Invariants: ``claimed[R]`` is the sum of ``count`` over the claims holding R here;
    ``requested[R]`` the sum of usage of R over the ``pods`` no VMI group covers plus each
    group's excess of R (:class:`_Group`); no entry is kept at 0. The record exists while the
    node is known or anything is held on it (then it is dropped).
    """

    known: bool = False
    capacity: dict[str, int] = dataclasses.field(default_factory=dict)
    allocatable: dict[str, int] = dataclasses.field(default_factory=dict)
    claimed: dict[str, int] = dataclasses.field(default_factory=dict)
    requested: dict[str, int] = dataclasses.field(default_factory=dict)
    pods: dict[Key, dict[str, int]] = dataclasses.field(default_factory=dict)
    groups: dict[Key, _Group] = dataclasses.field(default_factory=dict)
    claims: int = 0

    def empty(self) -> bool:
        return not self.known and not self.pods and not self.claims

    def change_group(self, vmi: Key, change: Callable[[_Group], None]) -> None:
        """Apply ``change`` to the VMI's group, keeping ``requested`` equal to the sum
        described in the class docstring."""
        group = self.groups.get(vmi)
        if group is None:
            group = self.groups[vmi] = _Group()
        for resource, units in group.excess().items():
            _shift(self.requested, resource, -units)
        change(group)
        for resource, units in group.excess().items():
            _shift(self.requested, resource, units)
        if not group.pods and not group.claims:
            del self.groups[vmi]


def _shift(figures: dict[str, int], resource: str, delta: int) -> None:
    value = figures.get(resource, 0) + delta
    if value:
        figures[resource] = value
    else:
        figures.pop(resource, None)


def _holds_of(claim: Obj, resource_name: str | None) -> tuple[_Hold, ...]:
    """What ``claim`` holds (see :meth:`Ledger.set_claim`): nothing, its hold on its node, or
    that and its transient hold on a migration's target node."""
    count = quantities.parse_count((claim.get("spec") or {}).get("count"))
    if not (claims.is_bound(claim) and resource_name and count):
        return ()
    user = claims.covering_vmi(claim)
    own = _Hold(claims.node_name(claim), resource_name, count, user)
    transient = migrations.transient_hold(claim)
    if transient is None:
        return (own,)
    return (own, _Hold(transient.target_node, resource_name, count, user, transient.uid))


class Ledger:
    """Per-node figures of GPU units: allocatable, held by bound claims, used by other pods.

    Invariants: a pod key appears in at most one node's figures (its current node) and only
    while it uses something; a claim key holds on at most one node plus the target node of
    its transient hold, and keeps at most one *released* version's holds
    (:meth:`keep_released`); every figure equals a recomputation from the
    current nodes, pods and claims given to the setters. Not thread-safe: callers serialise
    access.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeFigures] = {}
        self._pods: dict[Key, _Use] = {}
        #: claim key -> its holds (its node's, and a transient hold's), never empty
        self._claims: dict[Key, tuple[_Hold, ...]] = {}
        #: claim key -> the holds of a stored version kept while its release is unconfirmed
        self._released: dict[Key, tuple[_Hold, ...]] = {}

    # -- updates -------------------------------------------------------------------------

    def _figures(self, node: str) -> _NodeFigures:
        figures = self._nodes.get(node)
        if figures is None:
            figures = self._nodes[node] = _NodeFigures()
        return figures

    def _tidy(self, node: str) -> None:
        figures = self._nodes.get(node)
        if figures is not None and figures.empty():
            del self._nodes[node]

    def set_node(self, node: Obj) -> set[str]:
        """Record a node's capacity and allocatable (extended resources only). Returns
        ``{name}`` when its figures changed, else an empty set. Eligibility (Ready, cordon,
        taints) is not a figure: callers judge it from the node object."""
        name = eligibility.node_name(node)
        if not name:
            return set()
        status = node.get("status") or {}
        capacity = {r: n for r, n in _counts(status.get("capacity")).items() if n}
        allocatable = {r: n for r, n in _counts(status.get("allocatable")).items() if n}
        figures = self._figures(name)
        if figures.known and figures.capacity == capacity and figures.allocatable == allocatable:
            return set()
        figures.known = True
        figures.capacity = capacity
        figures.allocatable = allocatable
        return {name}

    def remove_node(self, name: str) -> set[str]:
        """Forget a node's capacity (its object is gone). Pods and claims on it keep their
        place until they are removed or move. Returns ``{name}`` if the node was known."""
        figures = self._nodes.get(name)
        if figures is None or not figures.known:
            return set()
        figures.known = False
        figures.capacity = {}
        figures.allocatable = {}
        self._tidy(name)
        return {name}

    def set_pod(self, pod: Obj) -> set[str]:
        """Record a pod's current use (see :func:`gpuoperator.model.pods.pod_usage`) on its
        node, replacing what it used before; a launcher pod's units are covered by what its
        VMI's claims hold on that node (:func:`gpuoperator.model.pods.launcher_vmi`). Returns
        the nodes whose figures changed: none, its node, or its old and new node when it
        moved."""
        key = claims.key(pod)
        node = pods.node_name(pod)
        usage = pods.pod_usage(pod) if node else {}
        new = (
            _Use(
                node, tuple(sorted(usage.items())), pods.launcher_vmi(pod), pods.migration_job(pod)
            )
            if usage
            else None
        )
        old = self._pods.get(key)
        if old == new:
            return set()
        touched = {u.node for u in (old, new) if u is not None}
        groups = {u.vmi for u in (old, new) if u is not None and u.vmi is not None}
        before = {n: self._fingerprint(n, groups, key) for n in touched}
        self._drop_pod(key)
        if new is not None:
            self._pods[key] = new
            figures = self._figures(new.node)
            figures.pods[key] = dict(new.usage)
            if new.vmi is None:
                for resource, units in new.usage:
                    _shift(figures.requested, resource, units)
            else:

                def join(group: _Group) -> None:
                    group.pods.add(key)
                    group.use(new.job, new.usage, 1)

                figures.change_group(new.vmi, join)
        return {n for n in touched if self._fingerprint(n, groups, key) != before[n]}

    def remove_pod(self, key: Key) -> set[str]:
        """Forget a pod (deleted). Returns its node if its figures changed."""
        old = self._pods.get(key)
        if old is None:
            return set()
        groups = {old.vmi} if old.vmi is not None else set()
        before = self._fingerprint(old.node, groups, key)
        self._drop_pod(key)
        return {old.node} if self._fingerprint(old.node, groups, key) != before else set()

    def _drop_pod(self, key: Key) -> set[str]:
        old = self._pods.pop(key, None)
        if old is None:
            return set()
        figures = self._nodes[old.node]
        del figures.pods[key]
        if old.vmi is None:
            for resource, units in old.usage:
                _shift(figures.requested, resource, -units)
        else:

            def leave(group: _Group) -> None:
                group.pods.discard(key)
                group.use(old.job, old.usage, -1)

            figures.change_group(old.vmi, leave)
        self._tidy(old.node)
        return {old.node}

    def set_claim(self, claim: Obj, resource_name: str | None) -> set[str]:
        """Record a claim's hold: ``spec.count`` units of ``resource_name`` (its class's
        resource; ``None``/``""`` when the class is unknown, which holds nothing) on
        ``status.nodeName`` while ``status.phase`` is ``Bound``, even while the claim is
        being deleted (see the module docstring); the hold covers the launcher pods of the
        VMI it serves there (:func:`gpuoperator.model.claims.covering_vmi`). Returns the
        nodes whose figures changed: none, the claim's node, or its old and new node when it
        was rebound."""
        return self._set_hold(self._claims, claims.key(claim), _holds_of(claim, resource_name))

    def keep_released(self, claim: Obj, resource_name: str | None) -> set[str]:
        """Keep counting the hold of ``claim`` — a stored version that a newer state, not
        confirmed yet, releases or moves — beside the claim's current hold (:meth:`set_claim`),
        until :meth:`drop_released` or :meth:`remove_claim`: if the release never lands the
        stored version still holds those units. A hold on a node where the claim's current
        hold (:meth:`set_claim`, called first) holds its resource is not counted twice (a
        claim moving to its transient hold's node); call it again after each
        :meth:`set_claim` of the claim. Returns the nodes whose figures changed."""
        key = claims.key(claim)
        current = {(h.node, h.resource) for h in self._claims.get(key, ())}
        kept = tuple(
            h for h in _holds_of(claim, resource_name) if (h.node, h.resource) not in current
        )
        return self._set_hold(self._released, key, kept)

    def drop_released(self, key: Key) -> set[str]:
        """Stop counting the released hold of claim ``key`` (its release is confirmed, or
        forgotten). Returns its node if its figures changed."""
        return self._set_hold(self._released, key, ())

    def remove_claim(self, key: Key) -> set[str]:
        """Forget a claim (deleted): its hold and its released hold. Returns the nodes whose
        figures changed."""
        return self._set_hold(self._claims, key, ()) | self._set_hold(self._released, key, ())

    def _set_hold(
        self, table: dict[Key, tuple[_Hold, ...]], key: Key, new: tuple[_Hold, ...]
    ) -> set[str]:
        old = table.get(key, ())
        if old == new:
            return set()
        touched = {h.node for h in (*old, *new)}
        groups = {h.user for h in (*old, *new) if h.user is not None}
        before = {n: self._fingerprint(n, groups) for n in touched}
        self._drop_hold(table, key)
        if new:
            table[key] = new
        for hold in new:
            figures = self._figures(hold.node)
            figures.claims += 1
            _shift(figures.claimed, hold.resource, hold.count)
            if hold.user is not None:
                figures.change_group(hold.user, functools.partial(_Group.hold, hold=hold, sign=1))
        return {n for n in touched if self._fingerprint(n, groups) != before[n]}

    def _drop_hold(self, table: dict[Key, tuple[_Hold, ...]], key: Key) -> None:
        for old in table.pop(key, ()):
            figures = self._nodes[old.node]
            figures.claims -= 1
            _shift(figures.claimed, old.resource, -old.count)
            if old.user is not None:
                figures.change_group(old.user, functools.partial(_Group.hold, hold=old, sign=-1))
            self._tidy(old.node)

    def _fingerprint(self, node: str, groups: set[Key], pod: Key | None = None) -> tuple[Any, ...]:
        """The figures a reader can see on ``node`` that an update of ``pod`` (or of a claim)
        touching the VMI ``groups`` there can change: updates report the node only when this
        changed (a launcher pod whose claims cover all it uses can change without changing
        anything visible). Other plain pods are untouched by such an update, so only the pods
        of ``groups`` and ``pod`` itself are looked at: the cost stays that of one VMI's pods.
        """
        figures = self._nodes.get(node) or _NodeFigures()
        keys = {key for vmi in groups if vmi in figures.groups for key in figures.groups[vmi].pods}
        if pod is not None and pod in figures.pods:
            keys.add(pod)
        uncovered = set()
        for key in keys:
            vmi = self._pods[key].vmi
            excess = figures.groups[vmi].excess() if vmi is not None else None
            uncovered |= {
                (key, resource)
                for resource in figures.pods[key]
                if excess is None or resource in excess
            }
        return (dict(figures.claimed), dict(figures.requested), uncovered)

    # -- reads ---------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        """The nodes set and not removed, sorted."""
        return sorted(name for name, f in self._nodes.items() if f.known)

    def pod_keys(self) -> frozenset[Key]:
        """The pods the ledger counts (those using units on a node): after a relist, the
        caller removes the keys no longer in its cache."""
        return frozenset(self._pods)

    def claim_keys(self) -> frozenset[Key]:
        """The claims holding units, for the same resync as :meth:`pod_keys`."""
        return frozenset(self._claims)

    def _node(self, node: str) -> _NodeFigures:
        return self._nodes.get(node) or _NodeFigures()

    def capacity(self, node: str, resource: str) -> int:
        """What the node reports as its capacity of ``resource`` (0 when unknown)."""
        return self._node(node).capacity.get(resource, 0)

    def allocatable(self, node: str, resource: str) -> int:
        """What kubelet counts as allocatable (0 when the node is unknown)."""
        return self._node(node).allocatable.get(resource, 0)

    def held(self, node: str, resource: str) -> int:
        """Units of ``resource`` held on ``node`` by bound claims."""
        return self._node(node).claimed.get(resource, 0)

    def requested(self, node: str, resource: str) -> int:
        """Units of ``resource`` used on ``node`` by pods no claim accounts for."""
        return self._node(node).requested.get(resource, 0)

    def allocated(self, node: str, resource: str) -> int:
        """Units held by bound claims plus units used by other pods (may exceed allocatable)."""
        figures = self._node(node)
        return figures.claimed.get(resource, 0) + figures.requested.get(resource, 0)

    def free(self, node: str, resource: str) -> int:
        """allocatable - allocated, clamped at 0."""
        return max(0, self.allocatable(node, resource) - self.allocated(node, resource))

    def overrun(self, node: str, resource: str) -> int:
        """How far allocated exceeds allocatable (0 when it does not)."""
        return max(0, self.allocated(node, resource) - self.allocatable(node, resource))

    def devices(self, node: str, resources: Iterable[str] | None = None) -> list[Device]:
        """``GPUNode.status.devices``: one entry per resource the node reports or anything
        holds on it, sorted by name; restricted to ``resources`` when given (e.g. the
        resources the classes name, leaving out ``devices.kubevirt.io/kvm`` and the like)."""
        figures = self._node(node)
        names = (
            figures.capacity.keys()
            | figures.allocatable.keys()
            | figures.claimed.keys()
            | figures.requested.keys()
        )
        if resources is not None:
            names &= set(resources)
        return [
            Device(
                resourceName=resource,
                capacity=self.capacity(node, resource),
                allocatable=self.allocatable(node, resource),
                allocated=self.allocated(node, resource),
                free=self.free(node, resource),
            )
            for resource in sorted(names)
        ]

    def overcommitting_pods(self, node: str, resource: str) -> list[Key]:
        """The pods using ``resource`` on ``node`` that no claim fully accounts for (the
        pods of a VMI whose claims there hold less than they use count too), when the node's
        figures for it are overrun, sorted; empty when they are not."""
        if not self.overrun(node, resource):
            return []
        figures = self._node(node)

        def uncovered(key: Key) -> bool:
            vmi = self._pods[key].vmi
            return vmi is None or resource in figures.groups[vmi].excess()

        return sorted(
            key for key, usage in figures.pods.items() if resource in usage and uncovered(key)
        )


@dataclasses.dataclass(frozen=True)
class ClassFigures:
    """``GPUClass.status`` figures: units free on the eligible nodes that serve the class's
    resource, the most on one of them, and how many such nodes there are."""

    free: int
    max_free_per_node: int
    nodes: int
    #: units of idle preemptible holds a claim of the class could take back there, and the
    #: most units one claim can get on one node counting them (``model.preemption.room``;
    #: 0 and 0 for a class that takes nothing back)
    reclaimable: int = 0
    max_reclaimable_per_node: int = 0

    @property
    def max_room(self) -> int:
        """The largest order that fits on one node now, taking back what it may."""
        return max(self.max_free_per_node, self.max_reclaimable_per_node)

    @property
    def available(self) -> bool:
        """The class's ``Available`` condition: some eligible node serves its resource."""
        return self.nodes > 0


def serves(ledger: Ledger, node: Obj, cls: Obj) -> bool:
    """Whether ``node`` is eligible for ``cls`` and has allocatable units of its resource."""
    resource = gpuclasses.resource_name(cls)
    return (
        bool(resource)
        and ledger.allocatable(eligibility.node_name(node), resource) > 0
        and eligibility.is_eligible(node, cls)
    )


def class_figures(ledger: Ledger, cls: Obj, nodes: Iterable[Obj]) -> ClassFigures:
    """Sum the free units of ``cls``'s resource over the ``nodes`` that :func:`serve
    <serves>` it. Figures come from the ledger; eligibility from the node objects."""
    resource = gpuclasses.resource_name(cls)
    frees = [
        ledger.free(eligibility.node_name(node), resource)
        for node in nodes
        if serves(ledger, node, cls)
    ]
    return ClassFigures(free=sum(frees), max_free_per_node=max(frees, default=0), nodes=len(frees))


#: The most entries ``GPUNode.status.classes`` holds (the CRD's ``maxItems``).
MAX_NODE_CLASSES = 10000


def node_class_free(ledger: Ledger, node: Obj, classes: Iterable[Obj]) -> list[ClassFree]:
    """``GPUNode.status.classes``: each class the node :func:`serves` with its free units
    there, sorted by class name, at most :data:`MAX_NODE_CLASSES` of them (the first by
    name: a longer list would fail every status write; ``GPUClass.status`` is not affected).
    """
    name = eligibility.node_name(node)
    return sorted(
        (
            ClassFree(
                name=gpuclasses.name(cls),
                free=ledger.free(name, gpuclasses.resource_name(cls)),
            )
            for cls in classes
            if serves(ledger, node, cls)
        ),
        key=lambda entry: entry["name"],
    )[:MAX_NODE_CLASSES]
