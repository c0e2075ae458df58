"""The VMI webhook: mutating, VirtualMachineInstance CREATE, fail closed (docs/design.md §5 "VMs").

Registered with an objectSelector on the label ``gpu.cozystack.io/claims: "true"``, so it sees
only VMIs that name their GPUs by reference. For such a VMI it:

1. parses the annotation ``gpu.cozystack.io/claims`` (a missing or malformed annotation is
   refused with the parser's message);
2. refuses what needs no placement to judge (``vmi_admission.vmi_refusals``: unknown class or
   claim, a claim another live VMI uses, a template claim named directly, a claim template
   judged as an order is — its class, count > maxCount, the vGPU entitlement — and whose
   count exceeds every node's allocatable of the class, raw ``gpus`` entries or
   ``hostDevices`` naming any class's resource next to references, a resource the KubeVirt
   CR's ``permittedHostDevices`` does not permit, the feature switched off);
3. admits the VMI with a JSON patch writing one ``spec.domain.devices.gpus`` entry per unit,
   or, for a claim of a DRA class, KubeVirt's DRA shape: ``spec.resourceClaims`` naming the
   claim's hold and one ``gpus`` entry naming it (``vmi_admission.admission_patch``).

A VMI (with references or not: the registration's second entry selects every VMI with
``spec.resourceClaims``) that names a DRA hold of a claim it does not request is refused
(``model.hold_admission.vmi_refusals``), outside ``exemptNamespaces``.

It writes nothing but its answer (registered with ``sideEffects: None``): it decides on the
shared caches and the inventory alone, holds no client, and is answered on the server's event
loop like the other webhooks. A review it receives therefore changes nothing in the cluster,
whoever sent it. The attachment of a held claim is recorded by the attachments controller
once the VMI exists (by name and UID); of two VMIs admitted at once for one held claim, the
older gets it and the other waits with its launcher pod gated.

Choices where docs/design.md is silent:

* A dry run is judged exactly as a real create (nothing differs: nothing is written).
* A malformed annotation is refused with the parser's message even when ``gpuForVMs`` is
  off (both refuse; the parser's message is the one that names the field).
* Held references on a VMI created with ``generateName`` are admitted: the attachment is
  recorded once the VMI exists, under the name the API server gave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import structlog

from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.model import echo, hold_admission, references, templates, vmi_admission
from gpuoperator.runtime.admitting import Admission, AdmissionRequest
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
PATH = "/mutate-vmi"
WEBHOOK = "vmis"


class WebhookInventory(Protocol):
    """What the webhook reads from ``ledger.Ledger``: the KubeVirt CR's permitted
    resources and the largest allocatable of one node per class."""

    def permitted(self) -> frozenset[str] | None: ...

    def largest_allocatable(self, class_name: str) -> int: ...


def _by_name(objs: Sequence[Obj]) -> dict[str, Obj]:
    return {str((o.get("metadata") or {}).get("name") or ""): o for o in objs}


class VmiWebhook:
    def __init__(self, caches: Caches, inventory: WebhookInventory, settings: Settings) -> None:
        self.caches = caches
        self.inventory = inventory
        self.settings = settings

    def __call__(self, request: AdmissionRequest) -> Admission:
        if request.operation != "CREATE":
            return Admission.allow()
        namespace = request.namespace
        meta = request.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        # The namespace is the request's (a create's body may omit it).
        vmi: Obj = {**request.obj, "metadata": {**meta, "namespace": namespace}}
        vmi_name = str(meta.get("name") or "")
        shown_name = echo.clip(vmi_name) if vmi_name else "(generated)"
        who = f"VirtualMachineInstance {echo.clip(namespace)}/{shown_name}: "
        with_refs = references.has_references(vmi)
        try:
            refs = references.from_object(vmi) if with_refs else []
        except references.AnnotationError as exc:
            return Admission.refuse(who + str(exc))
        if namespace not in self.settings.exempt_namespaces:
            held = hold_admission.vmi_refusals(vmi, refs, self.caches.hold_finder(namespace))
            if held:
                return Admission.refuse(who + "; ".join(held))
        if not with_refs:
            return Admission.allow()

        classes = _by_name(self.caches.classes.store.values())
        claims = _by_name(self.caches.claims.store.by_index(BY_NAMESPACE, namespace))
        cached_vmis = _by_name(self.caches.vmis.store.by_index(BY_NAMESPACE, namespace))
        live_vmis = {name: v for name, v in cached_vmis.items() if name != vmi_name}
        template_classes = {r.class_name for r in refs if isinstance(r, references.TemplateRef)}
        refusals = vmi_admission.vmi_refusals(
            vmi,
            refs,
            classes=classes,
            claims=claims,
            live_vmis=live_vmis,
            namespace=self.caches.namespaces.store.get(("", namespace)),
            permitted=self.inventory.permitted(),
            gpu_for_vms=self.settings.gpu_for_vms,
            largest_allocatable={
                name: self.inventory.largest_allocatable(name)
                for name in template_classes
                if name in classes
            },
        )
        if refusals:
            return Admission.refuse(who + "; ".join(refusals))
        # The DRA shape names a template's claim after the VMI; a VMI without a name yet was
        # refused such a template, so its names are only held claims' (unused otherwise).
        claim_names = (
            templates.claim_names(vmi_name, refs)
            if vmi_name
            else [r.claim if isinstance(r, references.HeldRef) else "" for r in refs]
        )
        return Admission.allow(
            patch=vmi_admission.admission_patch(vmi, refs, claim_names, classes, claims)
        )
