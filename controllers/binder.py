"""The binder: binds Pending (and Lost) claims of a class to one eligible node each.

Key = class name, one worker: a class's claims are decided together, in order of creation
(``model.binding.plan``: FIFO with a bounded bypass, binpack or spread, unexpired
``refusedNodes`` skipped), on the inventory's current figures, and each binding is written
to the claim's status with its resourceVersion as precondition and applied to the
inventory at once, so the next decision sees it. Budgets and the vGPU entitlement are
re-checked at bind time (two orders can pass the webhook together; template claims never
met it). A bound claim whose node is gone becomes ``Lost`` and is bound again.

A claim is bound only once it carries the claim-protection finalizer: that write is the
claim's first, and binding after it spares a conflict on every new claim.

Never over-allocating rests on three things: one worker decides at a time; a decision's
writes reach the inventory before the next one; and writes are fenced — a replica that
stops leading stops writing, and the next leader starts only after the Lease expired and
its own caches synced.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_CLASS, BY_NAMESPACE, Caches, class_of_claim, own_key
from gpuoperator.inventory import Inventory
from gpuoperator.model import binding, conditions, ordering, tenants
from gpuoperator.model import classes as gpuclasses
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.informing import Key
from gpuoperator.runtime.kinds import GPUClaim
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "binder"
BOUND = "Bound"


class Binder:
    def __init__(
        self,
        caches: Caches,
        inventory: Inventory,
        writer: Client,
        recorder: Recorder,
        settings: Settings,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.inventory = inventory
        self.writer = writer
        self.recorder = recorder
        self.settings = settings
        self.clock = clock
        self._bypass: dict[str, dict[binding.Key, int]] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bind")

    def reconcile(self, key: Key) -> Result | None:
        with self.inventory.decisions:
            return self._reconcile(key[1])

    def _reconcile(self, class_name: str) -> Result | None:
        claims = self.caches.claims.store.by_index(BY_CLASS, class_name)
        cls = self.caches.classes.store.get(("", class_name))
        if cls is None:
            for claim in claims:
                if binding.is_waiting(claim):
                    self._wait(
                        claim,
                        "ClassNotFound",
                        f"class {class_name} does not exist (kubectl get gpuclasses)",
                    )
            return None
        lost = [c for c in claims if _phase(c) == BOUND and not self.inventory.has_node(_node(c))]
        for claim in lost:
            self._lose(claim)
        claims = self.caches.claims.store.by_index(BY_CLASS, class_name)
        candidates = []
        for claim in claims:
            if not binding.is_waiting(claim) or claim["metadata"].get("deletionTimestamp"):
                continue
            if names.CLAIM_PROTECTION_FINALIZER not in claim["metadata"].get("finalizers", []):
                # Bound only once protected: the protection controller's write comes first
                # (it enqueues the class again), so the bind does not race it into a 409.
                continue
            why = self._refusal(claim, cls)
            if why is not None:
                self._wait(claim, *why)
            else:
                candidates.append(claim)
        now = self.clock.now()
        plan = self.inventory.plan(
            candidates, cls, self.settings.placement_policy, now, self._bypass.get(class_name, {})
        )
        self._bypass[class_name] = plan.bypass_counts
        by_key = {binding.claim_key(c): c for c in candidates}
        # The plan never over-allocates, so its writes are independent: send them together
        # (each in a copy of this reconcile's log context).
        futures = [
            self._pool.submit(contextvars.copy_context().run, self._bind, by_key[key_], node)
            for key_, node in plan.bindings
        ]
        for future in futures:
            future.result()
        for claim_key, waiting in plan.waiting.items():
            self._wait(by_key[claim_key], waiting.reason.value, waiting.message)
        if plan.waiting and any(_refusals(c) for c in by_key.values()):
            return Result(requeue_after=30.0)  # a refusal expires: look again
        return None

    # ---- decisions --------------------------------------------------------------------
    def _refusal(self, claim: Obj, cls: Obj) -> tuple[str, str] | None:
        ns = claim["metadata"]["namespace"]
        namespace = self.caches.namespaces.store.get(("", ns))
        if gpuclasses.is_vgpu(cls) and not tenants.vgpu_entitled(namespace):
            return (
                "NotEntitled",
                f"class {gpuclasses.name(cls)} is a vGPU class; namespace "
                f"{ns} is not entitled to vGPU (label {names.VGPU_ENTITLED_LABEL}=true)",
            )
        quotas = self.caches.quotas.store.by_index(BY_NAMESPACE, ns)
        if not quotas:
            return None  # no budget in this namespace: nothing to add up
        refusals = ordering.order_refusals_for_binding(
            claim, quotas, self.caches.claims.store.by_index(BY_NAMESPACE, ns)
        )
        if refusals:
            return ("BudgetExceeded", "; ".join(refusals))
        return None

    def _bind(self, claim: Obj, node: str) -> None:
        now = self.clock.now()
        status = dict(claim.get("status") or {})
        status.update(
            phase=BOUND,
            nodeName=node,
            boundTime=conditions.stamp(now),
            observedGeneration=claim["metadata"].get("generation"),
            conditions=conditions.set_condition(
                status.get("conditions"),
                BOUND,
                True,
                "Bound",
                f"bound to node {node}",
                now=now,
                observed_generation=claim["metadata"].get("generation"),
            ),
        )
        try:
            written = self.writer.replace_status(GPUClaim, {**claim, "status": status})
        except errors.ConflictError:
            log.info(
                "claim changed meanwhile; deciding again", reason="Conflict", claim=_key_text(claim)
            )
            return
        self.inventory.apply_claim(written)
        log.info(
            "claim bound",
            reason="Bound",
            claim=_key_text(claim),
            node=node,
            count=claim["spec"]["count"],
        )
        self.recorder.event(
            written,
            "Normal",
            "Bound",
            f"bound to node {node} ({claim['spec']['count']} unit(s))",
            kind=names.GPU_CLAIM,
        )

    def _wait(self, claim: Obj, reason: str, message: str) -> None:
        status = dict(claim.get("status") or {})
        current = conditions.find(status.get("conditions"), BOUND)
        if (
            current
            and (current.get("reason"), current.get("message")) == (reason, message)
            and status.get("phase")
        ):
            return
        now = self.clock.now()
        status["phase"] = status.get("phase") or "Pending"
        status["observedGeneration"] = claim["metadata"].get("generation")
        status["conditions"] = conditions.set_condition(
            status.get("conditions"),
            BOUND,
            False,
            reason,
            message,
            now=now,
            observed_generation=claim["metadata"].get("generation"),
        )
        try:
            self.writer.replace_status(GPUClaim, {**claim, "status": status})
        except (errors.ConflictError, errors.NotFoundError):
            return
        if not current or current.get("reason") != reason:
            log.info("claim waits", reason=reason, claim=_key_text(claim), detail=message)
            self.recorder.event(
                claim,
                "Normal" if reason in ("Queued",) else "Warning",
                reason,
                message,
                kind=names.GPU_CLAIM,
            )

    def _lose(self, claim: Obj) -> None:
        node = _node(claim)
        now = self.clock.now()
        status = dict(claim.get("status") or {})
        status["phase"] = "Lost"
        status["conditions"] = conditions.set_condition(
            status.get("conditions"),
            BOUND,
            False,
            "NodeLost",
            f"node {node} is gone; the claim will be bound again",
            now=now,
        )
        try:
            written = self.writer.replace_status(GPUClaim, {**claim, "status": status})
        except errors.ConflictError:
            return
        self.inventory.apply_claim(written)
        log.warning("claim lost its node", reason="NodeLost", claim=_key_text(claim), node=node)
        self.recorder.event(
            claim,
            "Warning",
            "NodeLost",
            f"node {node} is gone; the claim will be bound again",
            kind=names.GPU_CLAIM,
        )


def _phase(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("phase") or "")


def _node(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("nodeName") or "")


def _refusals(claim: Obj) -> bool:
    return bool((claim.get("status") or {}).get("refusedNodes"))


def _key_text(claim: Obj) -> str:
    return f"{claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}"


def register(
    manager: Manager, caches: Caches, inventory: Inventory, recorder: Recorder, settings: Settings
) -> Controller[Key]:
    binder = Binder(caches, inventory, manager.writer, recorder, settings, clock=manager.clock)
    controller = manager.controller(NAME, binder, workers=1, seed=caches.class_keys)
    inventory.on_change(lambda _nodes, classes: controller.enqueue_many(("", c) for c in classes))

    def every_class(_obj: Obj) -> list[Key]:
        return caches.class_keys()

    manager.add_controller(
        controller,
        [
            (caches.claims, class_of_claim),
            (caches.classes, own_key),
            (caches.quotas, every_class),
            (caches.namespaces, every_class),
        ],
    )
    return controller
