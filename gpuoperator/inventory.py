"""The live GPU inventory: the ledger and the class catalog, fed by the shared caches.

One lock guards both. Every event updates only the node(s) it touches (the Ledger and the
Catalog are incremental) and then tells listeners which nodes and classes changed, so the
node-inventory and class-status controllers reconcile exactly those. Webhooks and the
binder read through the same object. ``gpuoperator status`` feeds it one-shot lists instead
of informers.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuoperator.caches import Caches
from gpuoperator.model import binding, capacity, catalog, hostdevices, scheduling
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime.informing import Handlers, key_of

Obj = dict[str, Any]
Listener = Callable[[set[str], set[str]], None]


@dataclass(frozen=True)
class NodeView:
    """What the GPUNode of one node should say."""

    node: Obj
    devices: list[capacity.Device]
    classes: list[capacity.ClassFree]
    #: resource → keys of the pods that overrun the holds there
    overcommitted: dict[str, list[tuple[str, str]]]


class Inventory:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ledger = capacity.Ledger()
        self._catalog = catalog.Catalog()
        self._nodes: dict[str, Obj] = {}
        self._classes: dict[str, Obj] = {}
        self._claims_by_class: dict[str, dict[tuple[str, str], Obj]] = {}
        self._permitted: frozenset[str] | None = None
        self._listeners: list[Listener] = []
        #: Held by every decision that hands out units (the binder's passes, placement's
        #: moves) from reading the figures until its writes are applied here: two such
        #: decisions never give the same free units away.
        self.decisions = threading.RLock()

    # ---- wiring ---------------------------------------------------------------------
    def connect(self, caches: Caches) -> None:
        """Feed this inventory from the shared informers (classes first, so claims find
        their class's resource)."""
        caches.classes.add_handlers(self._handlers(self.apply_class, self.delete_class))
        caches.nodes.add_handlers(self._handlers(self.apply_node, self.delete_node))
        caches.pods.add_handlers(self._handlers(self.apply_pod, self.delete_pod))
        caches.claims.add_handlers(self._handlers(self.apply_claim, self.delete_claim))
        caches.kubevirts.add_handlers(self._handlers(self.apply_kubevirt, self.delete_kubevirt))

    @staticmethod
    def _handlers(apply: Callable[[Obj], None], delete: Callable[[Obj], None]) -> Handlers:
        return Handlers(on_add=apply, on_update=lambda _old, new: apply(new), on_delete=delete)

    def on_change(self, listener: Listener) -> None:
        """``listener(nodes, classes)`` after each change, outside the lock."""
        self._listeners.append(listener)

    def _notify(self, nodes: set[str], classes: set[str]) -> None:
        if nodes or classes:
            for listener in self._listeners:
                listener(nodes, classes)

    def _nodes_changed(self, nodes: set[str]) -> tuple[set[str], set[str]]:
        classes = self._catalog.update_nodes(nodes, self._ledger, self._nodes)
        return nodes, classes

    # ---- events -----------------------------------------------------------------------
    def apply_node(self, node: Obj) -> None:
        name = scheduling.node_name(node)
        with self._lock:
            self._nodes[name] = node
            changed = self._nodes_changed(self._ledger.set_node(node) | {name})
        self._notify(*changed)

    def delete_node(self, node: Obj) -> None:
        name = scheduling.node_name(node)
        with self._lock:
            self._nodes.pop(name, None)
            changed = self._nodes_changed(self._ledger.remove_node(name) | {name})
        self._notify(*changed)

    def apply_pod(self, pod: Obj) -> None:
        with self._lock:
            changed = self._nodes_changed(self._ledger.set_pod(pod))
        self._notify(*changed)

    def delete_pod(self, pod: Obj) -> None:
        with self._lock:
            changed = self._nodes_changed(self._ledger.remove_pod(key_of(pod)))
        self._notify(*changed)

    def apply_claim(self, claim: Obj) -> None:
        class_name = str((claim.get("spec") or {}).get("className") or "")
        with self._lock:
            for members in self._claims_by_class.values():
                members.pop(key_of(claim), None)
            self._claims_by_class.setdefault(class_name, {})[key_of(claim)] = claim
            cls = self._classes.get(class_name)
            resource = gpuclasses.resource_name(cls) if cls else None
            changed = self._nodes_changed(self._ledger.set_claim(claim, resource))
        self._notify(*changed)

    def delete_claim(self, claim: Obj) -> None:
        class_name = str((claim.get("spec") or {}).get("className") or "")
        with self._lock:
            self._claims_by_class.get(class_name, {}).pop(key_of(claim), None)
            changed = self._nodes_changed(self._ledger.remove_claim(key_of(claim)))
        self._notify(*changed)

    def apply_class(self, cls: Obj) -> None:
        name = gpuclasses.name(cls)
        with self._lock:
            old = self._classes.get(name)
            self._classes[name] = cls
            self._catalog.set_class(cls, self._ledger, self._nodes)
            nodes: set[str] = set()
            if old is None or gpuclasses.resource_name(old) != gpuclasses.resource_name(cls):
                # Claims that arrived before their class now hold units of its resource.
                for claim in self._claims_by_class.get(name, {}).values():
                    nodes |= self._ledger.set_claim(claim, gpuclasses.resource_name(cls))
            changed = self._nodes_changed(nodes)
            # The class set changed: every node's GPUNode may list it (or its resource).
            everything = set(self._nodes) if old is None else nodes
        self._notify(everything | changed[0], changed[1] | {name})

    def delete_class(self, cls: Obj) -> None:
        name = gpuclasses.name(cls)
        with self._lock:
            self._classes.pop(name, None)
            self._catalog.remove_class(name)
            nodes: set[str] = set()
            for claim in self._claims_by_class.get(name, {}).values():
                nodes |= self._ledger.set_claim(claim, None)
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
        """The node's GPU figures, or None if the node is gone or has no GPU resource."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            gpu = self._catalog.resources() | set(self._permitted or ())
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            capacity_ = (node.get("status") or {}).get("capacity") or {}
            resources = sorted(r for r in gpu if r in allocatable or r in capacity_)
            if not resources:
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
            )

    def class_figures(self, name: str) -> capacity.ClassFigures:
        with self._lock:
            return self._catalog.figures(name)

    def class_allocatable(self, name: str) -> int:
        with self._lock:
            return self._catalog.allocatable(name)

    def eligibility(self, node_name: str, class_name: str) -> list[str]:
        """Why ``node_name`` is not eligible for ``class_name`` (empty: it is)."""
        with self._lock:
            node, cls = self._nodes.get(node_name), self._classes.get(class_name)
            if node is None or cls is None:
                return ["unknown node or class"]
            return scheduling.eligibility(node, cls)

    def has_node(self, name: str) -> bool:
        with self._lock:
            return name in self._nodes

    def plan(
        self,
        claims: Iterable[Obj],
        cls: Obj,
        policy: binding.Policy,
        now: datetime.datetime,
        bypass: dict[binding.Key, int],
    ) -> binding.Plan:
        """A binding plan for ``cls`` on the current figures (see ``model.binding.plan``)."""
        with self._lock:
            return binding.plan(
                claims, cls, self._nodes.values(), self._ledger, policy, now, bypass
            )

    def load(
        self,
        *,
        nodes: Iterable[Obj] = (),
        pods: Iterable[Obj] = (),
        classes: Iterable[Obj] = (),
        claims: Iterable[Obj] = (),
        kubevirt: Obj | None = None,
    ) -> None:
        """Fill from one-shot lists (for ``gpuoperator status``)."""
        if kubevirt is not None:
            self.apply_kubevirt(kubevirt)
        for cls in classes:
            self.apply_class(cls)
        for node in nodes:
            self.apply_node(node)
        for pod in pods:
            self.apply_pod(pod)
        for claim in claims:
            self.apply_claim(claim)
