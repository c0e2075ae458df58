"""Node inventory: one GPUNode per Kubernetes node that has GPU resources.

A GPUNode has the Node's name and a controller ownerReference to it (garbage collection
removes it with the node); it is deleted when the node no longer has any GPU resource (one
named by a class or permitted in the KubeVirt CR) nor any device of a DRA class. Its status
carries, per resource, what kubelet counts and what the ledger holds (``devices``), the
eligible classes with their free units (``classes``), per DRA class the node's devices,
allocated, tainted and free (``draDevices``, ``model.dra_nodes``), ``Schedulable`` (Ready
and not cordoned) and ``Overcommitted`` (pods without claims overrun the holds: the pods are
named, and a Warning Event says so once per episode).

The figures change with every claim bound on the node: a node's changes are gathered for
``statusInterval`` from the first one seen and written together (``runtime.pacing``), so a
GPUNode's figures are never more than ``statusInterval`` behind the ledger and a burst of
bindings on a node costs one write; a GPUNode without any status yet is written at once. A
status this controller wrote counts as the current one until the cache delivers it or a
newer version (so the next pass does not send a write based on a version already replaced,
which the server would refuse).
"""

from __future__ import annotations

from typing import Protocol

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from gpuoperator import names
from gpuoperator.caches import Caches, own_key
from gpuoperator.kinds import GPUNode
from gpuoperator.ledger import Ledger, NodeView, changed_nodes
from gpuoperator.model import conditions, eligibility
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.runtime.own_writes import OwnWrites
from gpuoperator.runtime.pacing import Pacer
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "node-inventory"
SCHEDULABLE = "Schedulable"
OVERCOMMITTED = "Overcommitted"


@per_registry
def _gauge(registry: CollectorRegistry) -> Gauge:
    return Gauge(
        "gpuoperator_node_gpu_units",
        "GPU units per node and resource: allocatable (kubelet), allocated (held by "
        "claims plus used by other pods) and free",
        ["node", "resource", "kind"],
        registry=registry,
    )


class ApiAccess(protocols.Creates, protocols.ReplacesStatus, protocols.Deletes, Protocol):
    """What node inventory asks of the API server: GPUNodes created, their status replaced, and
    deleted."""


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: the writer of this controller among them."""

    def writer_for(self, component: str) -> ApiAccess: ...


class NodeInventory:
    def __init__(
        self,
        caches: Caches,
        ledger: Ledger,
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry = REGISTRY,
        status_interval: float = 0.0,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.writer = writer
        self.recorder = recorder
        self.clock = clock
        self.gauge = _gauge(registry)
        self._exported: dict[str, set[str]] = {}
        self._pacer: Pacer[str] = Pacer(status_interval, clock=clock)
        #: node -> the GPUNode as this controller last wrote it
        self._written: OwnWrites[str] = OwnWrites()

    def reconcile(self, key: Key) -> Result | None:
        name = key[1]
        view = self.ledger.node(name)
        cached = self.caches.gpunodes.store.get(("", name))
        current = self._written.current(name, cached)
        if view is None:
            self._unexport(name)
            self._written.forget(name)
            self._pacer.forget(name)
            if current is not None:
                self._delete(current, "the node is gone or has no GPU resource")
            return None
        self._export(name, view)
        if current is None:
            current = self._create(view.node)
            if current is None:
                return Result(requeue_after=1.0)
        waiting = self._pacer.waiting(name)
        if waiting > 0:
            # A change already waits to be written: this one joins it, and the status is
            # worked out once, when the wait is over (one per node per interval, not one
            # per binding).
            return Result(requeue_after=waiting)
        status = self._status(view, current)
        if status != current.get("status"):
            wait = self._pacer.delay(name) if current.get("status") else 0.0
            if wait > 0:
                return Result(requeue_after=wait)  # the changes of an interval, written once
            was_over = conditions.is_true(
                (current.get("status") or {}).get("conditions"), OVERCOMMITTED
            )
            try:
                self._written.wrote(
                    name, self.writer.replace_status(GPUNode, {**current, "status": status})
                )
            except errors.ConflictError:
                self._written.forget(name)  # changed meanwhile: read the cache again
                raise
            self._pacer.wrote(name)
            now_over = conditions.is_true(status["conditions"], OVERCOMMITTED)
            if now_over and not was_over:
                message = conditions.find(status["conditions"], OVERCOMMITTED)["message"]  # type: ignore[index]
                log.warning("node overcommitted", reason=OVERCOMMITTED, node=name, detail=message)
                self.recorder.event(current, "Warning", OVERCOMMITTED, message, kind=names.GPU_NODE)
        return None

    # ---- pieces ---------------------------------------------------------------------
    def _status(self, view: NodeView, current: Obj) -> Obj:
        now = self.clock.now()
        old = (current.get("status") or {}).get("conditions")
        node = view.node
        if not eligibility.node_ready(node):
            sched = (False, "NotReady", "the node is not Ready")
        elif eligibility.node_cordoned(node):
            sched = (False, "Cordoned", "the node is cordoned (spec.unschedulable)")
        else:
            sched = (True, "Ready", "the node is Ready and not cordoned")
        conds = conditions.set_condition(old, SCHEDULABLE, *sched, now=now)
        if view.overcommitted:
            parts = [
                f"{resource}: pods {', '.join('/'.join(k) for k in pods)} use units held by claims"
                for resource, pods in sorted(view.overcommitted.items())
            ]
            conds = conditions.set_condition(
                conds, OVERCOMMITTED, True, "PodsOverrunHolds", "; ".join(parts), now=now
            )
        else:
            conds = conditions.set_condition(
                conds,
                OVERCOMMITTED,
                False,
                "WithinCapacity",
                "holds and pods fit the allocatable units",
                now=now,
            )
        return {
            "devices": [dict(d) for d in view.devices],
            "classes": [dict(c) for c in view.classes],
            "draDevices": [dict(d) for d in view.dra],
            "conditions": conds,
            "observedGeneration": current["metadata"].get("generation", 0),
        }

    def _create(self, node: Obj) -> Obj | None:
        meta = node["metadata"]
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_NODE,
            "metadata": {
                "name": meta["name"],
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": meta["name"],
                        "uid": meta.get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
        }
        try:
            created = self.writer.create(GPUNode, body)
        except errors.AlreadyExistsError:
            return None  # the cache will show it; look again shortly
        log.info("gpunode created", reason="GPUResources", node=meta["name"])
        return created

    def _delete(self, current: Obj, why: str) -> None:
        meta = current["metadata"]
        try:
            self.writer.delete(GPUNode, meta["name"], uid=meta.get("uid"))
        except errors.NotFoundError:
            return
        log.info("gpunode deleted", reason="NoGPUResources", node=meta["name"], detail=why)

    def _export(self, name: str, view: NodeView) -> None:
        exported = set()
        for d in view.devices:
            for kind in ("allocatable", "allocated", "free"):
                self.gauge.labels(name, d["resourceName"], kind).set(d[kind])
            exported.add(d["resourceName"])
        for resource in self._exported.get(name, set()) - exported:
            for kind in ("allocatable", "allocated", "free"):
                self.gauge.remove(name, resource, kind)
        self._exported[name] = exported

    def _unexport(self, name: str) -> None:
        for resource in self._exported.pop(name, set()):
            for kind in ("allocatable", "allocated", "free"):
                self.gauge.remove(name, resource, kind)


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    """Wire the controller: node and GPUNode events, and ledger changes, enqueue nodes."""
    reconciler = NodeInventory(
        caches,
        ledger,
        manager.writer_for(NAME),
        recorder,
        clock=manager.clock,
        registry=manager.registry,
        status_interval=settings.status_interval,
    )
    controller = manager.controller(
        NAME,
        reconciler,
        workers=workers,
        seed=lambda: [("", n) for n in ledger.node_names()] + list(caches.gpunodes.store),
    )
    manager.add_controller(
        controller,
        [
            (caches.nodes, own_key),
            (caches.gpunodes, own_key),
            (ledger.changes, changed_nodes),
        ],
    )
    return controller
