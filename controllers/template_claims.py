"""Template claims: the GPUClaim a VM's ``claimTemplate`` reference orders, for as long as the
VMI exists (docs/design.md §2 GPUClaim, §5 "VMs").

Key: a VMI ``(namespace, name)``. For every ``claimTemplate`` reference of a VMI that exists,
is not being deleted and has not finished, the claim ``templates.template_claims`` describes
is created: named ``<vmi>-gpu-<index>``, marked ``gpu.cozystack.io/template-claim: "true"``
and controlled by the VMI (ownerReference with its UID), so garbage collection removes it
when the VMI goes and no code here ever deletes one. The binder binds it like any claim and
the placement controller pins the VMI's launcher pod to its node.

A claim of that name that this VMI's UID does not control (a tenant's own claim, or the
claim of an earlier VMI of the same name that garbage collection has not removed yet) is
never adopted, changed or deleted: a Warning Event ``TemplateClaimConflict`` on the VMI says
which, and the VMI is looked at again after :data:`CONFLICT_RECHECK` seconds (a foreign
claim without an ownerReference to a VMI cannot be watched back to this VMI).

Choices where docs/design.md is silent:

* A claim that exists and is ours is left as it is, even if the annotation now orders
  another class or count there: a claim's spec is immutable, and a running VM's GPUs do not
  change under it.
* A VMI in a final phase (``Succeeded``, ``Failed``) gets no new claim: it will never run,
  and a fresh claim would hold capacity for nothing until the VMI is removed.
* With ``gpuForVMs`` off nothing is created (no new VM may use a GPU); the claims made
  earlier are left to garbage collection, which removes them with their VMIs.
* A malformed annotation (possible only if it was edited after admission) creates nothing
  and is reported once per message by a Warning Event ``InvalidClaimReferences``.
* **Only references the VMI webhook admitted order anything**
  (``templates.creation_refusals``): before creating a missing claim, the VMI's ``gpus``
  entries must be exactly those the webhook writes for its references, and every template is
  judged again as the webhook judges it (class, maxCount, vGPU entitlement, permitted
  resource, a count no larger than the largest allocatable of one node), on the caches and
  the ledger of now. Otherwise none of the VMI's missing claims is created (its VM could
  not run on part of them) and a Warning Event ``TemplateClaimRefused`` says why, once per
  message; the VMI is looked at again after :data:`CONFLICT_RECHECK` seconds (an
  entitlement or a node may come). Claims already made are never touched.
"""

from __future__ import annotations

import threading
from typing import Final, Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches, own_key
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import claims, references, templates
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.recording import EventType
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "template-claims"
#: Seconds after which a VMI blocked by a foreign claim is looked at again.
CONFLICT_RECHECK: Final = 60.0

CREATED = "TemplateClaimCreated"
CONFLICT = "TemplateClaimConflict"
INVALID = "InvalidClaimReferences"
REFUSED = "TemplateClaimRefused"


class ApiAccess(protocols.Creates, protocols.Gets, Protocol):
    """What the template-claims controller asks of the API server: it creates claims, and reads
    one live when its name is taken."""


class WebhookFigures(Protocol):
    """What the template judgement reads from ``ledger.Ledger``."""

    def permitted(self) -> frozenset[str] | None: ...

    def largest_allocatable(self, class_name: str) -> int: ...


class TemplateClaims:
    def __init__(
        self,
        caches: Caches,
        ledger: WebhookFigures,
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        settings: Settings,
    ) -> None:
        self.caches = caches
        self.ledger = ledger
        self.writer = writer
        self.recorder = recorder
        self.settings = settings
        #: VMI key -> the refusal last reported (Events and logs only on change)
        self._refused: dict[Key, str] = {}
        self._lock = threading.Lock()

    def reconcile(self, key: Key) -> Result | None:
        vmi = self.caches.vmis.store.get(key)
        if vmi is None or vmi["metadata"].get("deletionTimestamp"):
            with self._lock:
                self._refused.pop(key, None)
            return None  # garbage collection removes the claims of a VMI that goes
        if not references.has_references(vmi):
            return None
        if claims.is_vmi_final(vmi):
            phase = (vmi.get("status") or {}).get("phase")
            log.debug("no template claims for a finished VMI", reason="VMIFinished", phase=phase)
            return None
        try:
            refs = references.from_object(vmi)
        except references.AnnotationError as exc:
            log.warning("VMI references unreadable", reason=INVALID, error=str(exc))
            self._event(vmi, "Warning", INVALID, f"no claim made from claim templates: {exc}")
            return None
        wanted = templates.template_claims(vmi, refs)
        if not wanted:
            return None
        if not self.settings.gpu_for_vms:
            log.info("template claims not created", reason="GpuForVMsOff", claims=len(wanted))
            return None
        ns = key[0]
        if any(self.caches.claims.store.get((ns, c["metadata"]["name"])) is None for c in wanted):
            refusals = self._refusals(vmi, refs)
            if refusals:
                self._refuse(key, vmi, "; ".join(refusals))
                return Result(requeue_after=CONFLICT_RECHECK)
        with self._lock:
            self._refused.pop(key, None)
        blocked = False
        for claim in wanted:
            if not self._ensure(vmi, claim):
                blocked = True
        return Result(requeue_after=CONFLICT_RECHECK) if blocked else None

    def _refusals(self, vmi: Obj, refs: list[references.Reference]) -> list[str]:
        ns = str(vmi["metadata"].get("namespace") or "")
        classes = {c["metadata"]["name"]: c for c in self.caches.classes.store.values()}
        template_classes = {r.class_name for r in refs if isinstance(r, references.TemplateRef)}
        return templates.creation_refusals(
            vmi,
            refs,
            classes=classes,
            claims={
                c["metadata"]["name"]: c
                for c in self.caches.claims.store.by_index(BY_NAMESPACE, ns)
            },
            namespace=self.caches.namespaces.store.get(("", ns)),
            permitted=self.ledger.permitted(),
            largest_allocatable={
                name: self.ledger.largest_allocatable(name)
                for name in template_classes
                if name in classes
            },
        )

    def _refuse(self, key: Key, vmi: Obj, message: str) -> None:
        with self._lock:
            changed = self._refused.get(key) != message
            self._refused[key] = message
        if not changed:
            return
        log.warning("template claims not created", reason=REFUSED, detail=message)
        self._event(vmi, "Warning", REFUSED, f"no claim made from claim templates: {message}")

    def _ensure(self, vmi: Obj, want: Obj) -> bool:
        """Make sure ``want`` exists and is this VMI's; ``False`` when a foreign claim of its
        name blocks it."""
        ns, name = want["metadata"]["namespace"], want["metadata"]["name"]
        current = self.caches.claims.store.get((ns, name))
        if current is None:
            try:
                self.writer.create(GPUClaim, want)
            except errors.AlreadyExistsError:
                # The cache is behind: judge the claim as the API server has it.
                current = self.writer.get_or_none(GPUClaim, name, ns)
                if current is None:
                    raise  # created and deleted meanwhile: retry with backoff
            else:
                spec = want["spec"]
                log.info(
                    "template claim created",
                    reason=CREATED,
                    claim=name,
                    class_name=spec["className"],
                    count=spec["count"],
                )
                self._event(
                    vmi,
                    "Normal",
                    CREATED,
                    f"created GPUClaim {name} ({spec['count']} x {spec['className']}) from "
                    "its claim template; it is removed with this VM instance",
                )
                return True
        if templates.is_template_claim_of(current, vmi):
            return True
        log.warning("template claim name taken", reason=CONFLICT, claim=name)
        self._event(
            vmi,
            "Warning",
            CONFLICT,
            f"GPUClaim {name} already exists and is not a claim this VM instance made from "
            f"its claim template (no controller ownerReference to it and label "
            f"{names.TEMPLATE_CLAIM_LABEL}={names.TRUE}); it is left alone and this VM "
            "instance waits until that claim is gone",
        )
        return False

    def _event(self, vmi: Obj, type_: EventType, reason: str, message: str) -> None:
        self.recorder.event(
            vmi,
            type_,
            reason,
            message,
            kind=names.VMI_KIND,
            api_version=names.KUBEVIRT_API_VERSION,
        )


def owning_vmi(claim: Obj) -> list[Key]:
    """The key of the VMI that controls a claim (template claims), if any."""
    owner = claims.controlling_vmi(claim)
    return [] if owner is None else [(claims.key(claim)[0], owner.name)]


class ManagerAccess(managing.Controls, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


def register(
    manager: ManagerAccess,
    caches: Caches,
    ledger: Ledger,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    workers: int = 2,
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        TemplateClaims(caches, ledger, manager.writer, recorder, settings),
        workers=workers,
        seed=lambda: list(caches.vmis.store),
    )
    manager.add_controller(controller, [(caches.vmis, own_key), (caches.claims, owning_vmi)])
    return controller
