"""The operator's live ledger of GPU units: the model's ledger (``capacity.Ledger``: holds,
pod use, free units per node) and the class catalog (``catalog.Catalog``: figures per
class), fed by the shared caches, with the claim states counted ahead of the watch.

(Not to be confused with the node-inventory controller, which publishes each node's figures
as its GPUNode's status, nor with GPUNode itself.) One lock guards all of it.

Every event updates only the node(s) it touches (the model's ledger and the
Catalog are incremental) and then tells listeners which nodes and classes changed, so the
node-inventory and class-status controllers reconcile exactly those. The VMI webhook and the
controllers that decide where claims go (binder, placement, draining, template claims) read
through the same object. ``gpuoperator status`` feeds it one-shot lists instead
of informers.

**Assumed claims.** A claim state a controller is writing is counted before the write lands
and until the watch delivers a newer version: the assume cache, :mod:`gpuoperator.assumptions`
(its states and rules). This object keeps the ledger in step with it, under the same lock:
:meth:`Ledger.assume`, :meth:`~Ledger.confirm`, :meth:`~Ledger.forget` and
:meth:`~Ledger.expire_after` change an assumption and the holds it counts together, and
the stored hold an unconfirmed assumption releases is kept as the ledger's *released* hold.
A claim from the watch never goes back to an older resourceVersion than the one counted,
with or without an assumption.

**DRA classes** (docs/design.md §5 "DRA classes"). Their units are devices, not units of a
resource: the ledger also keeps the ResourceSlices, DeviceClasses and ResourceClaims, and
:meth:`Ledger.dra_inventory` counts a DRA class's devices from them
(``model.dra_devices``), with the devices that counted claims of DRA classes name held too
(``model.dra_holds.counted_inventory``): an assumed bind holds its devices before its
ResourceClaim's allocation is watched. A change of any of them tells listeners of every DRA
class (and of the slice's node, the allocation's node, or every node for a DeviceClass). Which
devices a class's selectors match is computed once per change of the slices or DeviceClasses
(the CEL evaluation is what costs); the allocations and counted claims are laid over it on
each read. :meth:`Ledger.node_dra` gives a node's figures per DRA class
(``GPUNode.status.draDevices``).
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuoperator import assumptions, names
from gpuoperator.caches import Caches
from gpuoperator.model import (
    binding,
    capacity,
    catalog,
    dra_devices,
    dra_health,
    dra_holds,
    dra_nodes,
    eligibility,
    hostdevices,
    preemption,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.feeding import Feed
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.informing import Handlers
from gpuoperator.runtime.versions import resource_version

Obj = dict[str, Any]


def changed_nodes(notice: Obj) -> list[Key]:
    """The keys of the nodes an ``Ledger.changes`` notice names (a watch-list mapper)."""
    return [("", n) for n in notice.get("nodes") or ()]


def changed_classes(notice: Obj) -> list[Key]:
    """The keys of the classes an ``Ledger.changes`` notice names."""
    return [("", c) for c in notice.get("classes") or ()]


@dataclass(frozen=True)
class NodeView:
    """What the GPUNode of one node should say."""

    node: Obj
    devices: list[capacity.Device]
    classes: list[capacity.ClassFree]
    #: resource → keys of the pods that overrun the holds there
    overcommitted: dict[str, list[tuple[str, str]]]
    #: the node's devices of each DRA class (``model.dra_nodes``)
    dra: list[dra_nodes.DraFigures] = dataclasses.field(default_factory=list)


class Ledger:
    def __init__(self, *, clock: Clock = SYSTEM) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._ledger = capacity.Ledger()
        self._catalog = catalog.Catalog()
        self._nodes: dict[str, Obj] = {}
        self._classes: dict[str, Obj] = {}
        #: class name -> claim key -> the claim as the watch last delivered it
        self._claims_by_class: dict[str, dict[Key, Obj]] = {}
        #: claim key -> the class it is filed under in ``_claims_by_class``
        self._claim_class: dict[Key, str] = {}
        #: the claim states counted ahead of the watch (see the module docstring)
        self._assumed = assumptions.Assumptions()
        self._permitted: frozenset[str] | None = None
        #: DRA objects as the caches hold them (see the module docstring)
        self._slices: dict[Key, Obj] = {}
        self._device_classes: dict[str, Obj] = {}
        self._taint_rules: dict[str, Obj] = {}
        self._resource_claims: dict[Key, Obj] = {}
        #: bumped by every change of the ResourceSlices or DeviceClasses: the inventories
        #: computed at an older value are stale (a class's own entry goes when its source
        #: changes; allocations are added to them on each read)
        self._dra_epoch = 0
        #: class name -> (epoch, its inventory before the counted claims' devices)
        self._dra_found: dict[str, tuple[int, dra_devices.Inventory]] = {}
        #: After each change, outside the lock: ``{"nodes": [...], "classes": [...]}``, the
        #: nodes and classes whose figures (or claims) changed. Controllers declare it in
        #: their watch list with ``changed_nodes`` or ``changed_classes``.
        self.changes = Feed("inventory")
        #: Guards the allocation of free units. Invariant: a decision that hands out units
        #: (a binder pass, placement's moves, draining's moves) holds it from reading the
        #: figures until every write it started has ended, each assumed here before it was
        #: sent; so two such decisions never give the same free units away.
        self.allocation_lock = threading.RLock()

    # ---- wiring ---------------------------------------------------------------------
    def connect(self, caches: Caches) -> None:
        """Feed this ledger from the shared informers (classes first, so claims find
        their class's resource)."""
        caches.classes.add_handlers(self._handlers(self.apply_class, self.delete_class))
        caches.nodes.add_handlers(self._handlers(self.apply_node, self.delete_node))
        caches.pods.add_handlers(self._handlers(self.apply_pod, self.delete_pod))
        caches.claims.add_handlers(self._handlers(self.apply_claim, self.delete_claim))
        caches.kubevirts.add_handlers(self._handlers(self.apply_kubevirt, self.delete_kubevirt))
        caches.resource_slices.add_handlers(
            self._handlers(self.apply_resource_slice, self.delete_resource_slice)
        )
        caches.device_classes.add_handlers(
            self._handlers(self.apply_device_class, self.delete_device_class)
        )
        caches.resource_claims.add_handlers(
            self._handlers(self.apply_resource_claim, self.delete_resource_claim)
        )
        caches.device_taint_rules.add_handlers(
            self._handlers(self.apply_device_taint_rule, self.delete_device_taint_rule)
        )

    @staticmethod
    def _handlers(apply: Callable[[Obj], None], delete: Callable[[Obj], None]) -> Handlers:
        return Handlers(on_add=apply, on_update=lambda _old, new: apply(new), on_delete=delete)

    def _notify(self, nodes: set[str], classes: set[str]) -> None:
        if nodes or classes:
            self.changes.publish({"nodes": sorted(nodes), "classes": sorted(classes)})

    def _nodes_changed(self, nodes: set[str]) -> tuple[set[str], set[str]]:
        classes = self._catalog.update_nodes(nodes, self._ledger, self._nodes)
        return nodes, classes

    # ---- events -----------------------------------------------------------------------
    def apply_node(self, node: Obj) -> None:
        name = eligibility.node_name(node)
        with self._lock:
            self._nodes[name] = node
            changed = self._nodes_changed(self._ledger.set_node(node) | {name})
        self._notify(*changed)

    def delete_node(self, node: Obj) -> None:
        """A node is gone: its figures change, and so does every class with a claim bound
        there (those claims are Lost now), even when the node served nothing any more
        (NotReady or cordoned before it went): the binder must hear of it."""
        name = eligibility.node_name(node)
        with self._lock:
            self._nodes.pop(name, None)
            nodes, classes = self._nodes_changed(self._ledger.remove_node(name) | {name})
            classes |= self._classes_bound_on(name)
        self._notify(nodes, classes)

    def _classes_bound_on(self, node: str) -> set[str]:
        found: set[str] = set()
        for class_name, members in self._claims_by_class.items():
            for key, claim in members.items():
                if gpuclaims.is_bound_to(self._assumed.counted(key, claim), node):
                    found.add(class_name)
                    break
        return found

    def apply_pod(self, pod: Obj) -> None:
        with self._lock:
            changed = self._nodes_changed(self._ledger.set_pod(pod))
        self._notify(*changed)

    def delete_pod(self, pod: Obj) -> None:
        with self._lock:
            changed = self._nodes_changed(self._ledger.remove_pod(key_of(pod)))
        self._notify(*changed)

    def apply_claim(self, claim: Obj) -> None:
        """A claim from the watch: counted unless an assumption or a counted version is
        newer (see the module docstring)."""
        key = key_of(claim)
        version = resource_version(claim)
        with self._lock:
            observed = self._observed(key)
            if observed is not None and _older(version, resource_version(observed)):
                return  # an older snapshot than the one counted: never go back
            self._store_observed(claim)
            if not self._assumed.superseded_by(key, version):
                # The stored hold an unconfirmed assumption releases is this version's now.
                changed = self._nodes_changed(self._count_released(key))
            else:
                self._assumed.forget(key)
                changed = self._count(claim)
            # A preemptible hold that starts or stops serving a VM changes what the
            # guaranteed classes on its resource may take back, not the free units.
            changed = (changed[0], changed[1] | self._taking_back_from(claim))
        self._notify(*changed)

    def delete_claim(self, claim: Obj) -> None:
        key = key_of(claim)
        with self._lock:
            self._claims_by_class.get(self._claim_class.pop(key, ""), {}).pop(key, None)
            self._assumed.forget(key)
            nodes = self._ledger.remove_claim(key)
            changed = self._nodes_changed(nodes)
        self._notify(*changed)

    def catch_up(self, claims: Iterable[Obj]) -> None:
        """Count a fresh list of every claim (read from the API server when this replica
        becomes leader): bindings the previous leader wrote just before it stopped may not
        have reached this replica's watch yet, and the first plan must not give their
        units away. Newer versions win as always, so nothing goes back."""
        for claim in claims:
            self.apply_claim(claim)

    # ---- assumptions ------------------------------------------------------------------
    def assume(self, claim: Obj) -> None:
        """Count ``claim`` (the state about to be written, its ``metadata.resourceVersion``
        the write's precondition) before the write lands. Follow with :meth:`confirm`,
        :meth:`forget` or :meth:`expire_after`."""
        with self._lock:
            self._assumed.assume(claim)
            changed = self._count(claim)
        self._notify(*changed)

    def confirm(self, written: Obj) -> None:
        """The write landed as ``written`` (the server's reply): count it until the watch
        delivers this version or a newer one (at once if it already has)."""
        key = key_of(written)
        version = resource_version(written)
        with self._lock:
            observed = self._observed(key)
            if observed is None:
                # Deleted meanwhile (its delete came before this reply): nothing to hold.
                self._assumed.forget(key)
                nodes = self._ledger.remove_claim(key)
                changed = self._nodes_changed(nodes)
            elif not _older(resource_version(observed), version):
                self._assumed.forget(key)  # the watch was quicker: it is the truth
                changed = self._count(observed)
            else:
                self._assumed.confirm(written)
                changed = self._count(written)
        self._notify(*changed)

    def forget(self, key: Key) -> None:
        """The write did not land: count the claim as the watch last delivered it."""
        with self._lock:
            changed = self._drop_assumption(key)
        self._notify(*changed)

    def expire_after(self, key: Key, seconds: float) -> None:
        """The write's outcome is unknown: keep the assumption until the watch supersedes
        it or ``seconds`` pass (then it is forgotten)."""
        with self._lock:
            self._assumed.expire_at(key, self._clock.monotonic() + seconds)

    def expire(self) -> None:
        """Forget the assumptions whose deadline has passed (readers call this)."""
        now = self._clock.monotonic()
        with self._lock:
            late = self._assumed.expired(now)

            nodes: set[str] = set()
            classes: set[str] = set()
            for key in late:
                n, c = self._drop_assumption(key)
                nodes |= n
                classes |= c
        self._notify(nodes, classes)

    def claim(self, key: Key) -> Obj | None:
        """The claim as counted: the assumed state, else the watch's."""
        with self._lock:
            assumed = self._assumed.claim(key)
            return assumed if assumed is not None else self._observed(key)

    def claims_of_class(self, class_name: str) -> list[Obj]:
        """The claims naming ``class_name`` as counted (assumed states included; an assumed
        claim the watch has not delivered yet is not listed)."""
        self.expire()
        with self._lock:
            members = self._claims_by_class.get(class_name, {})
            return [self._assumed.counted(k, claim) for k, claim in members.items()]

    def settled_claims_of_class(self, class_name: str) -> tuple[list[Obj], bool]:
        """The claims of ``class_name`` a decision may be taken on: as counted
        (:meth:`claims_of_class`), leaving out those whose last write is unconfirmed (in
        flight, or its outcome unknown; see :mod:`gpuoperator.assumptions`), and whether any
        was left out. Such a state is not stored (yet): a write based on it would carry the
        stored version's resourceVersion, so a bind planned on an unconfirmed unbinding (a
        node refusal) could land on the old binding and move the claim without a stored
        version releasing its first node. They are decided once the write is confirmed,
        forgotten or superseded by the watch."""
        counted = self.claims_of_class(class_name)
        with self._lock:
            settled = [c for c in counted if not self._assumed.unconfirmed(key_of(c))]
        return settled, len(settled) < len(counted)

    def next_expiry(self, class_name: str) -> float | None:
        """Seconds until the first assumption of ``class_name``'s claims expires (``None``
        when none has a deadline): the caller looks again then."""
        now = self._clock.monotonic()
        with self._lock:
            first = self._assumed.next_deadline(lambda k: self._claim_class.get(k) == class_name)
        return max(0.0, first - now) if first is not None else None

    def assumed_keys(self) -> set[Key]:
        with self._lock:
            return self._assumed.keys()

    def _drop_assumption(self, key: Key) -> tuple[set[str], set[str]]:
        if not self._assumed.forget(key):
            return set(), set()
        observed = self._observed(key)
        if observed is None:
            nodes = self._ledger.remove_claim(key)
            return self._nodes_changed(nodes)
        return self._count(observed)

    def _observed(self, key: Key) -> Obj | None:
        return self._claims_by_class.get(self._claim_class.get(key, ""), {}).get(key)

    def _store_observed(self, claim: Obj) -> None:
        key = key_of(claim)
        self._claims_by_class.get(self._claim_class.get(key, ""), {}).pop(key, None)
        class_name = str((claim.get("spec") or {}).get("className") or "")
        self._claims_by_class.setdefault(class_name, {})[key] = claim
        self._claim_class[key] = class_name

    def _count(self, claim: Obj) -> tuple[set[str], set[str]]:
        """Put ``claim``'s hold into the ledger, with the stored hold it releases while
        that is unconfirmed (under the lock)."""
        nodes = self._ledger.set_claim(claim, self._resource(claim))
        return self._nodes_changed(nodes | self._count_released(key_of(claim)))

    def _taking_back_from(self, claim: Obj) -> set[str]:
        """The classes that may take back ``claim``'s hold (under the lock): every class on
        its resource, when its class is preemptible."""
        cls = self._classes.get(str((claim.get("spec") or {}).get("className") or ""))
        if cls is None or not gpuclasses.preemptible(cls):
            return set()
        return self._catalog.classes_using(gpuclasses.resource_name(cls))

    def _resource(self, claim: Obj) -> str | None:
        cls = self._classes.get(str((claim.get("spec") or {}).get("className") or ""))
        return gpuclasses.resource_name(cls) if cls else None

    def _count_released(self, key: Key) -> set[str]:
        """Keep the stored version's hold counted while an unconfirmed assumption releases
        or moves it (see the module docstring); drop it otherwise. Returns the nodes whose
        figures changed."""
        observed = self._observed(key)
        if observed is None or not self._assumed.releases(key, observed):
            return self._ledger.drop_released(key)
        return self._ledger.keep_released(observed, self._resource(observed))

    def unconfirmed(self, key: Key) -> bool:
        """Whether the claim is counted in a state whose write is in flight or has an
        unknown outcome: decide nothing on it (a write based on it would rest on the
        stored version's resourceVersion, not on this state)."""
        with self._lock:
            return self._assumed.unconfirmed(key)

    def apply_class(self, cls: Obj) -> None:
        name = gpuclasses.name(cls)
        with self._lock:
            old = self._classes.get(name)
            if old is None or gpuclasses.dra(old) != gpuclasses.dra(cls):
                self._dra_found.pop(name, None)  # its source (topology) is what it reads
            self._classes[name] = cls
            self._catalog.set_class(cls, self._ledger, self._nodes)
            nodes: set[str] = set()
            if old is None or gpuclasses.resource_name(old) != gpuclasses.resource_name(cls):
                # Claims that arrived before their class now hold units of its resource.
                for key, claim in self._claims_by_class.get(name, {}).items():
                    counted = self._assumed.counted(key, claim)
                    nodes |= self._ledger.set_claim(counted, gpuclasses.resource_name(cls))
                    nodes |= self._count_released(key)
            changed = self._nodes_changed(nodes)
            # The class set changed: every node's GPUNode may list it (or its resource).
            everything = set(self._nodes) if old is None else nodes
        self._notify(everything | changed[0], changed[1] | {name})

    def delete_class(self, cls: Obj) -> None:
        name = gpuclasses.name(cls)
        with self._lock:
            self._dra_found.pop(name, None)
            self._classes.pop(name, None)
            self._catalog.remove_class(name)
            nodes: set[str] = set()
            for key, claim in self._claims_by_class.get(name, {}).items():
                nodes |= self._ledger.set_claim(claim, None)  # the class is gone: no hold
                nodes |= self._count_released(key)
            changed = self._nodes_changed(nodes)
            everything = set(self._nodes)
        self._notify(everything, changed[1] | {name})

    def apply_kubevirt(self, cr: Obj) -> None:
        with self._lock:
            self._permitted = hostdevices.permitted_resources(cr)
            everything = set(self._nodes)
        self._notify(everything, set())

    def delete_kubevirt(self, _cr: Obj) -> None:
        with self._lock:
            self._permitted = None
            everything = set(self._nodes)
        self._notify(everything, set())

    # ---- DRA ----------------------------------------------------------------------------
    def _dra_classes(self) -> set[str]:
        return {n for n, c in self._classes.items() if gpuclasses.is_dra(c)}

    def _dra_changed(self, nodes: set[str]) -> None:
        with self._lock:
            classes = self._dra_classes()
        self._notify(nodes, classes)

    @staticmethod
    def _slice_node(obj: Obj | None) -> set[str]:
        node = ((obj or {}).get("spec") or {}).get("nodeName")
        return {node} if isinstance(node, str) and node else set()

    @staticmethod
    def _allocation_node(obj: Obj | None) -> set[str]:
        """The node a ResourceClaim's allocation names (``metadata.name`` selector)."""
        return {dra_holds.allocation_node(obj)} - {""} if obj is not None else set()

    def apply_resource_slice(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            old = self._slices.get(key_of(obj))
            self._slices[key_of(obj)] = obj
        self._dra_changed(self._slice_node(old) | self._slice_node(obj))

    def delete_resource_slice(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            old = self._slices.pop(key_of(obj), None)
        self._dra_changed(self._slice_node(old) | self._slice_node(obj))

    def apply_device_class(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            self._device_classes[key_of(obj)[1]] = obj
            everything = set(self._nodes)  # every node's devices of its classes may change
        self._dra_changed(everything)

    def delete_device_class(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            self._device_classes.pop(key_of(obj)[1], None)
            everything = set(self._nodes)
        self._dra_changed(everything)

    def apply_device_taint_rule(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            self._taint_rules[key_of(obj)[1]] = obj
            everything = set(self._nodes)  # a rule may select devices of any node
        self._dra_changed(everything)

    def delete_device_taint_rule(self, obj: Obj) -> None:
        with self._lock:
            self._dra_epoch += 1
            self._taint_rules.pop(key_of(obj)[1], None)
            everything = set(self._nodes)
        self._dra_changed(everything)

    def apply_resource_claim(self, obj: Obj) -> None:
        with self._lock:
            old = self._resource_claims.get(key_of(obj))
            self._resource_claims[key_of(obj)] = obj
        self._dra_changed(self._allocation_node(old) | self._allocation_node(obj))

    def delete_resource_claim(self, obj: Obj) -> None:
        with self._lock:
            old = self._resource_claims.pop(key_of(obj), None)
        self._dra_changed(self._allocation_node(old) | self._allocation_node(obj))

    def resource_claim(self, key: Key) -> Obj | None:
        """The ResourceClaim as the cache last delivered it."""
        with self._lock:
            return self._resource_claims.get(key)

    def _found_inventory(self, class_name: str) -> dra_devices.Inventory | None:
        """The DRA class's devices from the slices and its DeviceClass, none held yet (under
        the lock), computed once per change of them: its selectors' CEL is the costly part,
        and allocations do not change which devices match (:meth:`_held_devices` adds them)."""
        cls = self._classes.get(class_name)
        source = gpuclasses.dra(cls) if cls is not None else None
        if source is None:
            return None
        cached = self._dra_found.get(class_name)
        if cached is not None and cached[0] == self._dra_epoch:
            return cached[1]
        device_class = self._device_classes.get(source.device_class_name)
        if device_class is None:
            missing = f"DeviceClass {source.device_class_name} not found"
            found = dra_devices.Inventory(nodes={}, reasons=(missing,))
        else:
            found = dra_devices.inventory(
                self._slices.values(),
                device_class,
                (),
                topology_attribute=source.topology_attribute,
                taint_rules=self._taint_rules.values(),
            )
        self._dra_found[class_name] = (self._dra_epoch, found)
        return found

    def _held_devices(self, but: Key | None = None) -> set[dra_devices.DeviceRef]:
        """The devices held (under the lock): by an allocation of a cached ResourceClaim,
        whoever wrote it, or named by a counted claim of a DRA class (other than ``but``)."""
        return dra_devices.held_devices(self._resource_claims.values()) | dra_holds.claimed(
            self._assumed.counted(k, claim)
            for name in self._dra_classes()
            for k, claim in self._claims_by_class.get(name, {}).items()
            if k != but
        )

    def dra_inventory(self, class_name: str) -> dra_devices.Inventory | None:
        """The devices of the DRA class ``class_name`` per node, with what the counted claims
        of DRA classes hold (see the module docstring); ``None`` for a class that is unknown
        or not a DRA class. A DeviceClass that is not there serves no device, and the
        inventory says so."""
        self.expire()
        with self._lock:
            found = self._found_inventory(class_name)
            if found is None:
                return None
            return dra_holds.counted_inventory(found, self._held_devices())

    def node_dra(self, name: str) -> list[dra_nodes.DraFigures]:
        """The node's devices of each DRA class (``GPUNode.status.draDevices``,
        ``model.dra_nodes``), the counted claims' devices held."""
        self.expire()
        with self._lock:
            claimed: set[dra_devices.DeviceRef] | None = None
            per_class: dict[str, tuple[str, dra_devices.Inventory]] = {}
            for class_name in sorted(self._dra_classes()):
                found = self._found_inventory(class_name)
                view = found.nodes.get(name) if found is not None else None
                if view is None:
                    continue
                if claimed is None:
                    claimed = self._held_devices()
                source = gpuclasses.dra(self._classes[class_name])
                assert source is not None
                one = dra_devices.Inventory(nodes={name: view}, reasons=())
                per_class[class_name] = (
                    source.device_class_name,
                    dra_holds.counted_inventory(one, claimed),
                )
            return dra_nodes.node_figures(name, per_class)

    def dra_held_outside(self, class_name: str) -> tuple[dra_holds.OutsideHold, ...] | None:
        """The DRA class's devices that allocations of ResourceClaims other than the holds
        hold (``model.dra_holds.held_outside``); ``None`` for a class that is unknown or not
        a DRA class."""
        inventory = self.dra_inventory(class_name)
        if inventory is None:
            return None
        with self._lock:
            return dra_holds.held_outside(inventory, list(self._resource_claims.values()))

    # ---- queries ----------------------------------------------------------------------
    def gpu_resources(self) -> set[str]:
        """Resources the operator counts as GPUs: those named by a class or permitted as
        host devices in the KubeVirt CR."""
        with self._lock:
            return self._catalog.resources() | set(self._permitted or ())

    def permitted(self) -> frozenset[str] | None:
        with self._lock:
            return self._permitted

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def class_names(self) -> list[str]:
        with self._lock:
            return sorted(self._classes)

    def node(self, name: str) -> NodeView | None:
        """The node's GPU figures, or None if the node is gone or has neither a GPU resource
        nor a device of a DRA class."""
        dra = self.node_dra(name)
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            gpu = self._catalog.resources() | set(self._permitted or ())
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            capacity_ = (node.get("status") or {}).get("capacity") or {}
            resources = sorted(r for r in gpu if r in allocatable or r in capacity_)
            if not resources and not dra:
                return None
            over = {
                r: self._ledger.overcommitting_pods(name, r)
                for r in resources
                if self._ledger.overrun(name, r) > 0
            }
            return NodeView(
                node=node,
                devices=self._ledger.devices(name, resources),
                classes=capacity.node_class_free(self._ledger, node, self._classes.values()),
                overcommitted=over,
                dra=dra,
            )

    def _dra_figures(self, name: str) -> tuple[dict[str, int], dict[str, int]] | None:
        """A DRA class's free and allocatable devices per eligible node
        (``binding.dra_figures``), ``None`` for any other class."""
        inventory = self.dra_inventory(name)
        if inventory is None:
            return None
        with self._lock:
            return binding.dra_figures(self._classes[name], self._nodes.values(), inventory)

    def class_figures(self, name: str) -> capacity.ClassFigures:
        """The class's status figures: the catalog's, or a DRA class's from its devices;
        for a guaranteed class beside preemptible ones, what it could take back
        (``model.preemption.room``)."""
        dra = self._dra_figures(name)
        if dra is not None:
            frees = dra[0]
            return capacity.ClassFigures(
                free=sum(frees.values()),
                max_free_per_node=max(frees.values(), default=0),
                nodes=len(frees),
            )
        with self._lock:
            figures = self._catalog.figures(name)
            cls = self._classes.get(name)
            spot = preemption.spot_classes(cls, self._classes.values()) if cls else []
            if not spot:
                return figures
            spot_claims = [
                self._assumed.counted(k, c)
                for s in spot
                for k, c in self._claims_by_class.get(s, {}).items()
            ]
            reclaimable, most = preemption.room(
                cls or {}, spot, self._nodes.values(), self._ledger, spot_claims
            )
            return dataclasses.replace(
                figures,
                reclaimable=reclaimable,
                max_reclaimable_per_node=most,
            )

    def class_allocatable(self, name: str) -> int:
        dra = self._dra_figures(name)
        if dra is not None:
            return sum(dra[1].values())
        with self._lock:
            return self._catalog.allocatable(name)

    def largest_allocatable(self, class_name: str) -> int:
        """The most units of the class's resource one node serving it has allocatable (of
        a DRA class: the most devices one eligible node has that no blocking taint keeps)."""
        dra = self._dra_figures(class_name)
        if dra is not None:
            return max(dra[1].values(), default=0)
        with self._lock:
            return self._catalog.largest_allocatable(class_name)

    def eligibility(self, node_name: str, class_name: str) -> list[str]:
        """Why ``node_name`` is not eligible for ``class_name`` (empty: it is)."""
        with self._lock:
            node, cls = self._nodes.get(node_name), self._classes.get(class_name)
            if node is None or cls is None:
                return ["unknown node or class"]
            return eligibility.reasons(node, cls)

    def has_node(self, name: str) -> bool:
        with self._lock:
            return name in self._nodes

    def plan(
        self,
        claims: Iterable[Obj],
        cls: Obj,
        policy: binding.Policy,
        now: datetime.datetime,
        *,
        devices: dra_devices.Inventory | None = None,
    ) -> binding.Plan:
        """A binding plan for ``cls`` on the current figures (see ``model.binding.plan``;
        ``devices``: a DRA class's inventory, :meth:`dra_inventory`)."""
        with self._lock:
            return binding.plan(
                claims, cls, self._nodes.values(), self._ledger, policy, now, devices=devices
            )

    def unplaced_order(self, cls: Obj, now: datetime.datetime) -> Obj | None:
        """The oldest waiting claim of ``cls`` the binder may bind (it carries its protection
        finalizer) when it fits on no node as things are, else ``None``: the order a
        take-back of preemptible holds would be for (``model.preemption``)."""
        claims, _ = self.settled_claims_of_class(gpuclasses.name(cls))
        order = next(
            (
                c
                for c in binding.pending_in_order(claims)
                if names.CLAIM_PROTECTION_FINALIZER in (c["metadata"].get("finalizers") or [])
            ),
            None,
        )
        if order is None or self.candidates(order, cls, now):
            return None
        return order

    def spot_claims(self, cls: Obj) -> list[Obj]:
        """The claims, as counted, of the preemptible classes a claim of ``cls`` may take
        holds back from (``model.preemption.spot_classes``). A claim with a write in flight
        (a VM being attached to it, say) is left out: it is decided once settled."""
        with self._lock:
            return [
                self._assumed.counted(k, c)
                for name in preemption.spot_classes(cls, self._classes.values())
                for k, c in self._claims_by_class.get(name, {}).items()
                if not self._assumed.unconfirmed(k)
            ]

    def take_back(
        self,
        claim: Obj,
        cls: Obj,
        spot_claims: list[Obj],
        vmis: Mapping[Key, Obj],
        policy: binding.Policy,
        now: datetime.datetime,
        *,
        running: bool = False,
    ) -> preemption.TakeBack | None:
        """What guaranteed ``claim`` takes back from ``spot_claims`` (:meth:`spot_claims`),
        on the current figures (``model.preemption.take_back_for``, running VMs too with
        ``running``); ``vmis`` are the VM instances they serve by ``(namespace, name)``."""
        with self._lock:
            spot = preemption.spot_classes(cls, self._classes.values())
            return preemption.take_back_for(
                claim,
                cls,
                spot,
                self._nodes.values(),
                self._ledger,
                spot_claims,
                vmis,
                policy,
                now,
                running=running,
            )

    def candidates(self, claim: Obj, cls: Obj, now: datetime.datetime) -> list[tuple[str, int]]:
        """The nodes ``claim`` could be bound to now (``model.binding.candidates``: eligible,
        free >= count, not refused), on the current figures."""
        with self._lock:
            return binding.candidates(claim, cls, self._nodes.values(), self._ledger, now)

    def migration_target(
        self,
        migrating: list[Obj],
        classes: Mapping[str, Obj],
        policy: binding.Policy,
        now: datetime.datetime,
        *,
        source: str,
        kept: Mapping[str, binding.Kept],
        only: str | None = None,
    ) -> binding.MigrationTarget | binding.NoMigrationTarget:
        """Where the transient holds of ``migrating`` go now (``model.binding.
        migration_target``), on the current figures; ``only``: that node or none (the
        node a migration's first transient holds already name)."""
        with self._lock:
            nodes = [n for name, n in self._nodes.items() if only is None or name == only]
            return binding.migration_target(
                migrating, classes, nodes, self._ledger, policy, now, source=source, kept=kept
            )

    def dra_move(
        self,
        claim: Obj,
        cls: Obj,
        inventory: dra_devices.Inventory,
        policy: binding.Policy,
        now: datetime.datetime,
    ) -> tuple[str, tuple[dra_devices.DeviceRef, ...]] | None:
        """Where a DRA claim with unhealthy devices moves now (``model.dra_health.
        move_target``), on the current nodes and ``inventory`` (:meth:`dra_inventory`)."""
        with self._lock:
            return dra_health.move_target(claim, cls, self._nodes.values(), inventory, policy, now)

    def dra_rehold(
        self,
        claim: Obj,
        cls: Obj,
        policy: binding.Policy,
        now: datetime.datetime,
        *,
        move: bool,
    ) -> dra_health.Rehold | None:
        """Where a Bound DRA claim whose hold is gone is held again (``model.dra_health.
        rehold_target``): on the class's devices with every allocation and every other
        counted claim's devices held, the devices this claim's status names not."""
        self.expire()
        with self._lock:
            found = self._found_inventory(str((cls.get("metadata") or {}).get("name") or ""))
            if found is None:
                return None
            inventory = dra_holds.counted_inventory(found, self._held_devices(but=key_of(claim)))
            return dra_health.rehold_target(
                claim, cls, self._nodes.values(), inventory, policy, now, move=move
            )

    def load(
        self,
        *,
        nodes: Iterable[Obj] = (),
        pods: Iterable[Obj] = (),
        classes: Iterable[Obj] = (),
        claims: Iterable[Obj] = (),
        kubevirt: Obj | None = None,
        resource_slices: Iterable[Obj] = (),
        device_classes: Iterable[Obj] = (),
        resource_claims: Iterable[Obj] = (),
        device_taint_rules: Iterable[Obj] = (),
    ) -> None:
        """Fill from one-shot lists (for ``gpuoperator status``)."""
        if kubevirt is not None:
            self.apply_kubevirt(kubevirt)
        for cls in classes:
            self.apply_class(cls)
        for obj in device_classes:
            self.apply_device_class(obj)
        for obj in device_taint_rules:
            self.apply_device_taint_rule(obj)
        for obj in resource_slices:
            self.apply_resource_slice(obj)
        for obj in resource_claims:
            self.apply_resource_claim(obj)
        for node in nodes:
            self.apply_node(node)
        for pod in pods:
            self.apply_pod(pod)
        for claim in claims:
            self.apply_claim(claim)


def _older(version: int | None, than: int | None) -> bool:
    """Whether resourceVersion ``version`` is older than ``than`` (unknown: not older)."""
    return version is not None and than is not None and version < than
