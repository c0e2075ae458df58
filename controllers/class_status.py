"""Class status: ``free``, ``maxFreePerNode``, ``nodes``, the ``Available`` condition and
``observedGeneration`` of every GPUClass, and its protection finalizer; on a DRA class also
the ``DevicesHeldOutside`` condition: True, naming the devices and their ResourceClaims,
while allocations of ResourceClaims that are not the GPU claims' holds hold devices of the
class (``model.dra_holds.held_outside``: a pod of an exempt namespace, another DeviceClass
selecting the same devices), with a Warning Event when it turns True; False otherwise.

The figures come from the ledger's catalog, which keeps them incrementally: a pod,
claim or node event re-derives one node's contribution, and this controller only copies
the result of the classes that changed. The finalizer
``gpu.cozystack.io/class-protection`` holds a class while any claim names it.

The figures change with every binding of the class: a class's changes are gathered for
``statusInterval`` from the first one seen and written together (``runtime.pacing``), so they
are never more than ``statusInterval`` behind the ledger, except a change that raises
``maxFreePerNode`` or turns the class Available, and a class's first status, which are
written at once (the order webhook refuses counts above the published
figure); a status this controller wrote counts as the current one until the cache delivers
it or a newer version.
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.caches import Caches, class_of_claim, own_key
from gpuoperator.kinds import GPUClass
from gpuoperator.ledger import Ledger, changed_classes
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import conditions, dra_holds
from gpuoperator.model.capacity import ClassFigures
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

NAME = "class-status"
AVAILABLE = "Available"
HELD_OUTSIDE = "DevicesHeldOutside"
FINALIZER = names.CLASS_PROTECTION_FINALIZER


@per_registry
def _gauge(registry: CollectorRegistry) -> Gauge:
    return Gauge(
        "gpuoperator_class_gpu_units",
        "GPU units per class on its eligible nodes: allocatable, allocated and free",
        ["gpuclass", "kind"],
        registry=registry,
    )


class ApiAccess(protocols.Replaces, protocols.ReplacesStatus, Protocol):
    """What class status asks of the API server: the class replaced (its finalizer) and its
    status replaced."""


class ManagerAccess(managing.Controls, managing.Clocked, managing.Measured, Protocol):
    """What ``register`` uses of the manager: the writer of this controller among them."""

    def writer_for(self, component: str) -> ApiAccess: ...


class ClassStatus:
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
        #: class name -> the last "deletion waits" message told (told again only on change)
        self._held: dict[str, str] = {}
        self._held_lock = threading.Lock()
        self._pacer: Pacer[str] = Pacer(status_interval, clock=clock)
        #: class name -> the GPUClass as this controller last wrote its status
        self._written: OwnWrites[str] = OwnWrites()

    def reconcile(self, key: Key) -> Result | None:
        name = key[1]
        cached = self.caches.classes.store.get(("", name))
        cls = self._written.current(name, cached)
        if cls is None:
            self._pacer.forget(name)
            for kind in ("allocatable", "allocated", "free"):
                self.gauge.remove(name, kind)
            with self._held_lock:
                self._held.pop(name, None)
            return None
        meta = cls["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            return self._release(cls, finalizers)
        if FINALIZER not in finalizers:
            cls = self.writer.replace(
                GPUClass, {**cls, "metadata": {**meta, "finalizers": [*finalizers, FINALIZER]}}
            )
        figures = self.ledger.class_figures(name)
        allocatable = self.ledger.class_allocatable(name)
        self.gauge.labels(name, "allocatable").set(allocatable)
        self.gauge.labels(name, "allocated").set(allocatable - figures.free)
        self.gauge.labels(name, "free").set(figures.free)
        status = dict(cls.get("status") or {})
        generation = meta.get("generation")
        if figures.available:
            available = (
                True,
                "EligibleNodes",
                f"{figures.nodes} eligible node(s) serve "
                f"{_resource(cls)}; {figures.free} unit(s) free",
            )
        else:
            available = (
                False,
                "NoEligibleNode",
                f"no Ready, uncordoned node whose taints the class tolerates has "
                f"allocatable {_resource(cls)}",
            )
        conds = conditions.set_condition(
            status.get("conditions"),
            AVAILABLE,
            *available,
            now=self.clock.now(),
            observed_generation=generation,
        )
        outside = self._held_outside(cls)
        if outside is not None:
            conds = conditions.set_condition(
                conds,
                HELD_OUTSIDE,
                *outside,
                now=self.clock.now(),
                observed_generation=generation,
            )
        desired = {
            **{k: v for k, v in status.items() if k not in _RECLAIMABLE_FIELDS},
            "free": figures.free,
            "maxFreePerNode": figures.max_free_per_node,
            "nodes": figures.nodes,
            **_reclaimable(figures),
            "observedGeneration": generation,
            "conditions": conds,
        }
        if desired != status:
            was = conditions.is_true(status.get("conditions"), AVAILABLE)
            # The order webhook refuses a count above the published maxFreePerNode: a figure
            # that grows (or a class turning Available) is published at once, or orders that
            # fit would be refused meanwhile. Shrinking figures may wait: the binder checks
            # the live ones.
            grows = (
                figures.max_free_per_node > int(status.get("maxFreePerNode") or 0)
                or figures.max_reclaimable_per_node > int(status.get("maxReclaimablePerNode") or 0)
                or was != figures.available
            )
            wait = 0.0 if grows or not status else self._pacer.delay(name)
            if wait > 0:
                return Result(requeue_after=wait)  # written at most once per interval
            try:
                self._written.wrote(
                    name, self.writer.replace_status(GPUClass, {**cls, "status": desired})
                )
            except errors.ConflictError:
                self._written.forget(name)  # changed meanwhile: read the cache again
                raise
            self._pacer.wrote(name)
            if outside is not None:
                self._tell_outside(cls, status, outside)
            if was != figures.available or "conditions" not in status:
                log.info(
                    "class availability",
                    reason=available[1],
                    gpuclass=name,
                    free=figures.free,
                    nodes=figures.nodes,
                )
        return None

    def _held_outside(self, cls: Obj) -> tuple[bool, str, str] | None:
        """A DRA class's ``DevicesHeldOutside`` condition, ``None`` for any other class."""
        source = gpuclasses.dra(cls)
        holds = self.ledger.dra_held_outside(cls["metadata"]["name"])
        if source is None or holds is None:
            return None
        return dra_holds.outside_condition(source.device_class_name, holds)

    def _tell_outside(self, cls: Obj, old: Obj, outside: tuple[bool, str, str]) -> None:
        """One log line when the condition changes status; an Event when it turns True."""
        held, reason, message = outside
        before = conditions.find(old.get("conditions"), HELD_OUTSIDE)
        if before is not None and (before.get("status") == "True") == held:
            return
        name = cls["metadata"]["name"]
        log.info("class devices held outside", controller=NAME, key=name, reason=reason)
        if held:
            self.recorder.event(cls, "Warning", HELD_OUTSIDE, message, kind=names.GPU_CLASS)

    def _release(self, cls: Obj, finalizers: list[str]) -> Result | None:
        name = cls["metadata"]["name"]
        claims = self.caches.claims.store.index_keys(cachesmod.BY_CLASS, name)
        if FINALIZER not in finalizers:
            return None
        if claims:
            shown = ", ".join("/".join(k) for k in sorted(claims)[:5])
            more = f" and {len(claims) - 5} more" if len(claims) > 5 else ""
            message = (
                f"deletion waits: {len(claims)} claim(s) still name this class ({shown}{more})"
            )
            with self._held_lock:
                told = self._held.get(name) == message
                self._held[name] = message
            if told:  # every pass sees it again: tell it once per change
                log.debug("class deletion still held", gpuclass=name, claims=len(claims))
                return None
            log.info(
                "class deletion held", reason="ClaimsRemain", gpuclass=name, claims=len(claims)
            )
            self.recorder.event(cls, "Normal", "DeletionHeld", message, kind=names.GPU_CLASS)
            return None  # a claim's deletion enqueues the class again
        meta = cls["metadata"]
        self.writer.replace(
            GPUClass,
            {**cls, "metadata": {**meta, "finalizers": [f for f in finalizers if f != FINALIZER]}},
        )
        log.info("class released", reason="NoClaims", gpuclass=name)
        return None


def _resource(cls: Obj) -> str:
    """What serves the class: its resource name, or ``dra:<DeviceClass>``."""
    return gpuclasses.backend(cls) or "?"


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    reconciler = ClassStatus(
        caches,
        ledger,
        manager.writer_for(NAME),
        recorder,
        clock=manager.clock,
        registry=manager.registry,
        status_interval=settings.status_interval,
    )
    controller = manager.controller(NAME, reconciler, workers=workers, seed=caches.class_keys)
    manager.add_controller(
        controller,
        [
            (caches.classes, own_key),
            (caches.claims, class_of_claim),
            (ledger.changes, changed_classes),
        ],
    )
    return controller


_RECLAIMABLE_FIELDS = ("reclaimable", "maxReclaimablePerNode")


def _reclaimable(figures: ClassFigures) -> Obj:
    """``reclaimable`` and ``maxReclaimablePerNode``, on a class that may take preemptible
    holds back (absent on any other: a figure that is always 0 would say nothing)."""
    if not figures.max_reclaimable_per_node:
        return {}
    return {
        "reclaimable": figures.reclaimable,
        "maxReclaimablePerNode": figures.max_reclaimable_per_node,
    }
