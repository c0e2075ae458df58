"""Class figures kept incrementally (``GPUClass.status``: free, maxFreePerNode, nodes).

For every class the catalog remembers each node's contribution: the node's free units of
the class's resource when the node serves the class (eligible, with allocatable units),
nothing otherwise. A change on one node re-derives that node's contributions to the classes
that use its resources and adjusts each class's running sum and its histogram of per-node
free values; reading a class's figures costs nothing. So one pod, claim or node event costs
O(classes on that node), whatever the cluster's size. Only a class's own change (new class,
new tolerations) walks every node, for that class.

Figures equal :func:`capacity.class_figures` computed from scratch (a property test holds
the two together). Not thread-safe: the owner serialises calls, as for the Ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from gpuoperator.model import capacity
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]


class Catalog:
    def __init__(self) -> None:
        self._classes: dict[str, Obj] = {}
        self._by_resource: dict[str, set[str]] = {}
        self._contrib: dict[str, dict[str, int]] = {}  # class -> node -> free
        self._sum: dict[str, int] = {}
        self._allocatable: dict[str, int] = {}  # class -> allocatable units on its nodes
        self._node_alloc: dict[tuple[str, str], int] = {}  # (class, node) -> allocatable
        self._hist: dict[str, Counter[int]] = {}
        self._node_classes: dict[str, set[str]] = {}  # node -> classes it contributes to

    # ---- classes --------------------------------------------------------------------
    def set_class(self, cls: Obj, ledger: capacity.Ledger, nodes: Mapping[str, Obj]) -> None:
        """Add or replace a class and derive its figures over every node (O(nodes))."""
        name = gpuclasses.name(cls)
        self.remove_class(name)
        self._classes[name] = cls
        self._by_resource.setdefault(gpuclasses.resource_name(cls), set()).add(name)
        self._contrib[name] = {}
        self._sum[name] = 0
        self._allocatable[name] = 0
        self._hist[name] = Counter()
        for node_name, node in nodes.items():
            self._place(name, node_name, node, ledger)

    def remove_class(self, name: str) -> None:
        cls = self._classes.pop(name, None)
        if cls is None:
            return
        users = self._by_resource.get(gpuclasses.resource_name(cls))
        if users is not None:
            users.discard(name)
        for node_name in self._contrib.pop(name, {}):
            self._node_classes.get(node_name, set()).discard(name)
            self._node_alloc.pop((name, node_name), None)
        self._sum.pop(name, None)
        self._allocatable.pop(name, None)
        self._hist.pop(name, None)

    def class_names(self) -> list[str]:
        return sorted(self._classes)

    def classes_using(self, resource: str) -> set[str]:
        return set(self._by_resource.get(resource, ()))

    def resources(self) -> set[str]:
        """Resource names some class uses."""
        return {r for r, users in self._by_resource.items() if users}

    # ---- nodes ----------------------------------------------------------------------
    def update_nodes(
        self, node_names: Iterable[str], ledger: capacity.Ledger, nodes: Mapping[str, Obj]
    ) -> set[str]:
        """Re-derive the contributions of ``node_names`` (nodes whose ledger figures, object
        or existence changed); return the classes whose figures changed."""
        changed: set[str] = set()
        for node_name in node_names:
            node = nodes.get(node_name)
            candidates = set(self._node_classes.get(node_name, ()))
            if node is not None:
                for resource in (node.get("status") or {}).get("allocatable") or {}:
                    candidates |= self._by_resource.get(resource, set())
            for class_name in candidates:
                before = self._contrib[class_name].get(node_name)
                self._place(class_name, node_name, node, ledger)
                if self._contrib[class_name].get(node_name) != before:
                    changed.add(class_name)
        return changed

    def allocatable(self, name: str) -> int:
        """Units kubelet counts of the class's resource on the nodes that serve it."""
        return self._allocatable.get(name, 0)

    def largest_allocatable(self, name: str) -> int:
        """The most units of the class's resource that one node serving the class has
        allocatable (0 when none serves it): no claim of more can ever bind. O(nodes serving
        the class)."""
        return max(
            (self._node_alloc.get((name, node), 0) for node in self._contrib.get(name, {})),
            default=0,
        )

    def figures(self, name: str) -> capacity.ClassFigures:
        hist = self._hist.get(name) or Counter()
        present = [free for free, count in hist.items() if count > 0]
        return capacity.ClassFigures(
            free=self._sum.get(name, 0),
            max_free_per_node=max(present, default=0),
            nodes=sum(hist.values()),
        )

    def _place(
        self, class_name: str, node_name: str, node: Obj | None, ledger: capacity.Ledger
    ) -> None:
        contrib = self._contrib[class_name]
        old = contrib.pop(node_name, None)
        if old is not None:
            self._sum[class_name] -= old
            self._hist[class_name][old] -= 1
            if self._hist[class_name][old] == 0:
                del self._hist[class_name][old]
            self._node_classes.get(node_name, set()).discard(class_name)
            self._allocatable[class_name] -= self._node_alloc.pop((class_name, node_name), 0)
        cls = self._classes[class_name]
        if node is not None and capacity.serves(ledger, node, cls):
            resource = gpuclasses.resource_name(cls)
            free = ledger.free(node_name, resource)
            alloc = ledger.allocatable(node_name, resource)
            self._node_alloc[(class_name, node_name)] = alloc
            self._allocatable[class_name] += alloc
            contrib[node_name] = free
            self._sum[class_name] += free
            self._hist[class_name][free] += 1
            self._node_classes.setdefault(node_name, set()).add(class_name)
