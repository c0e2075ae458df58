"""The VMI webhook: mutating, VirtualMachineInstance CREATE, fail closed (DESIGN.md §5 "VMs").

Registered with an objectSelector on the label ``gpu.cozystack.io/claims: "true"``, so it sees
only VMIs that name their GPUs by reference. For such a VMI it:

1. parses the annotation ``gpu.cozystack.io/claims`` (a missing or malformed annotation is
   refused with the parser's message);
2. refuses what needs no placement to judge (``vmi_admission.vmi_refusals``: unknown class or
   claim, a claim another live VMI uses, a template claim named directly, count > maxCount,
   missing vGPU entitlement, raw ``gpus`` entries or ``hostDevices`` naming any class's
   resource next to references, a resource the KubeVirt
   CR's ``permittedHostDevices`` does not permit, the feature switched off);
3. records the attachment of each held claim (``status.attachment = {vmi: <name>}``, a merge
   patch on the status subresource with the cached claim's resourceVersion as precondition) —
   its one side effect, skipped on dry run (registered with ``sideEffects: NoneOnDryRun``);
4. admits the VMI with a JSON patch writing one ``spec.domain.devices.gpus`` entry per unit.

It binds, moves and creates nothing. It runs on every replica, so it writes through the plain
(unfenced) client, never the leader's fenced writer: the resourceVersion precondition, not
leadership, keeps two webhooks (or two VMIs) from attaching one claim twice.

Choices where DESIGN.md is silent:

* A failed attachment write refuses the VMI (fail closed: a VMI is never admitted with a
  claim that could not be attached): a conflict or a vanished claim with 409 Conflict, any
  other API error with 500; both messages say to retry. Claims attached earlier in the same
  request stay attached by name; the claims controller clears an attachment whose VMI never
  appeared.
* Besides ``vmi_refusals``, two refusals guard the side effect (code 409, "retry"):
  - a held claim whose recorded attachment names another VMI that has no UID yet and is not
    in the cache: that VMI's create may be in flight right now (its webhook wrote the
    attachment, the VMI has not reached this replica's cache), and admitting would attach
    the claim to two VMIs. Such an attachment clears itself: the VMI appears (and the
    model's live-VMI check takes over) or the claims controller clears it;
  - held references on a VMI whose name a cached VMI not being deleted already has: the API
    server would refuse the create with AlreadyExists, but only after this webhook had
    attached the claims to that name (and so to the existing VMI). A VMI being deleted is
    no obstacle: that is a VM restarting, whose new VMI takes the same claims.
* A name longer than the API server accepts (253) is refused with code 400 before
  anything is written: the attachment would otherwise carry it.
* With held references, the same decision is made on dry run and for real; only the writes
  differ.
* A malformed annotation is refused with the parser's message even when ``gpuForVMs`` is
  off (both refuse; the parser's message is the one that names the field).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.kinds import GPUClaim
from gpuoperator.model import echo, references, vmi_admission
from gpuoperator.runtime import errors
from gpuoperator.runtime.admitting import Admission, AdmissionRequest
from gpuoperator.runtime.client import Kind
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
PATH = "/mutate-vmi"
#: The longest object name the API server accepts (a DNS subdomain).
MAX_NAME = 253
WEBHOOK = "vmis"


class StatusClient(Protocol):
    """What the webhook writes through: ``runtime.client.Client.patch`` (a merge patch)."""

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj: ...

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj: ...


class PermittedHostDevices(Protocol):
    """The KubeVirt CR's permitted resources (``inventory.Inventory.permitted``)."""

    def permitted(self) -> frozenset[str] | None: ...


def _by_name(objs: Sequence[Obj]) -> dict[str, Obj]:
    return {str((o.get("metadata") or {}).get("name") or ""): o for o in objs}


def _pending_elsewhere(
    claim: Mapping[str, Any], vmi_name: str, live_vmis: Mapping[str, Obj]
) -> str:
    """The VMI a held claim is being attached to right now ("" when none): an attachment
    that names another VMI, records no UID yet, and whose VMI is not cached."""
    status = claim.get("status")
    attachment = status.get("attachment") if isinstance(status, Mapping) else None
    if not isinstance(attachment, Mapping):
        return ""
    other = str(attachment.get("vmi") or "")
    if not other or other == vmi_name or attachment.get("uid") or other in live_vmis:
        return ""
    return other


class VmiWebhook:
    def __init__(
        self,
        caches: Caches,
        inventory: PermittedHostDevices,
        settings: Settings,
        client: StatusClient,
    ) -> None:
        self.caches = caches
        self.inventory = inventory
        self.settings = settings
        self.client = client

    def __call__(self, request: AdmissionRequest) -> Admission:
        if request.operation != "CREATE" or not references.has_references(request.obj):
            return Admission.allow()
        namespace = request.namespace
        meta = request.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        # The namespace is the request's (a create's body may omit it).
        vmi: Obj = {**request.obj, "metadata": {**meta, "namespace": namespace}}
        vmi_name = str(meta.get("name") or "")
        shown_name = echo.clip(vmi_name) if vmi_name else "(generated)"
        who = f"VirtualMachineInstance {echo.clip(namespace)}/{shown_name}: "
        if len(vmi_name) > MAX_NAME:
            # The API server would refuse the name, but only after this webhook had
            # written it into the claims' attachments: refuse first.
            return Admission.refuse(
                f"{who}metadata.name: has {len(vmi_name)} characters; allowed: a name of at "
                f"most {MAX_NAME}",
                reason="BadRequest",
                code=400,
            )
        try:
            refs = references.from_object(vmi)
        except references.AnnotationError as exc:
            return Admission.refuse(who + str(exc))

        classes = _by_name(self.caches.classes.store.values())
        claims = _by_name(self.caches.claims.store.by_index(BY_NAMESPACE, namespace))
        cached_vmis = _by_name(self.caches.vmis.store.by_index(BY_NAMESPACE, namespace))
        live_vmis = {name: v for name, v in cached_vmis.items() if name != vmi_name}
        refusals = vmi_admission.vmi_refusals(
            vmi,
            refs,
            classes=classes,
            claims=claims,
            live_vmis=live_vmis,
            namespace=self.caches.namespaces.store.get(("", namespace)),
            permitted=self.inventory.permitted(),
            gpu_for_vms=self.settings.gpu_for_vms,
        )
        if refusals:
            return Admission.refuse(who + "; ".join(refusals))

        held = references.held_claims(refs)
        retry = self._retry_refusals(refs, vmi_name, namespace, claims, live_vmis, cached_vmis)
        if retry:
            return Admission.refuse(who + "; ".join(retry), reason="Conflict", code=409)

        patch = vmi_admission.gpus_patch(vmi, vmi_admission.gpu_entries(refs, classes, claims))
        if request.dry_run:
            return Admission.allow(patch=patch)
        for claim_name in held:
            failure = self._attach(claim_name, claims[claim_name], vmi_name, namespace)
            if failure is not None:
                message, reason, code = failure
                return Admission.refuse(who + message, reason=reason, code=code)
        return Admission.allow(patch=patch)

    @staticmethod
    def _retry_refusals(
        refs: Sequence[references.Reference],
        vmi_name: str,
        namespace: str,
        claims: Mapping[str, Obj],
        live_vmis: Mapping[str, Obj],
        cached_vmis: Mapping[str, Obj],
    ) -> list[str]:
        """The guards of the attachment write (see the module docstring)."""
        if not references.held_claims(refs):
            return []
        same_name = cached_vmis.get(vmi_name)
        if same_name is not None and not (same_name.get("metadata") or {}).get("deletionTimestamp"):
            return [
                f"metadata.name: a VirtualMachineInstance {vmi_name} already exists in "
                f"namespace {namespace}; allowed: a name no VirtualMachineInstance uses (once "
                "the old one is gone, retry)"
            ]
        out: list[str] = []
        for index, ref in enumerate(refs):
            if not isinstance(ref, references.HeldRef):
                continue
            other = _pending_elsewhere(claims[ref.claim], vmi_name, live_vmis)
            if other:
                out.append(
                    f"annotation {names.CLAIMS_ANNOTATION}: item {index + 1}: "
                    f"claim {ref.claim}: the claim is being attached to VM {other}, whose "
                    "creation is in progress or failed (a failed attachment is cleared "
                    "shortly); a claim serves one VM at a time; retry shortly"
                )
        return out

    def _write_attachment(
        self, claim_name: str, claim: Obj, vmi_name: str, namespace: str, attempts: int = 3
    ) -> None:
        """Patch the attachment with the claim's resourceVersion as precondition. The cache
        may lag behind a write of the operator's own (a finalizer, a bind): on a conflict,
        re-read the claim and try again — unless it is now attached to another VM."""
        for attempt in range(attempts):
            resource_version = str((claim.get("metadata") or {}).get("resourceVersion") or "")
            body = vmi_admission.attachment_patch(vmi_name, resource_version or None)
            try:
                self.client.patch(GPUClaim, claim_name, body, namespace, subresource="status")
                return
            except errors.ConflictError:
                if attempt == attempts - 1:
                    raise
            claim = self.client.get(GPUClaim, claim_name, namespace)
            other = ((claim.get("status") or {}).get("attachment") or {}).get("vmi")
            if other and other != vmi_name:
                raise errors.ConflictError(409, "Conflict", f"attached to VM {other} meanwhile")

    def _attach(
        self, claim_name: str, claim: Obj, vmi_name: str, namespace: str
    ) -> tuple[str, str, int] | None:
        """Record the attachment of ``claim_name`` to the VMI; the refusal (message, reason,
        code) when the write fails."""
        key = f"{namespace}/{vmi_name}"
        try:
            self._write_attachment(claim_name, claim, vmi_name, namespace)
        except (errors.ConflictError, errors.NotFoundError) as exc:
            log.info(
                "claim attachment failed",
                webhook=WEBHOOK,
                key=key,
                claim=claim_name,
                reason=exc.reason,
                error=exc.message,
            )
            what = "was deleted" if isinstance(exc, errors.NotFoundError) else "changed"
            return (
                f"claim {claim_name}: could not record its attachment to this VM (the claim "
                f"{what} meanwhile, perhaps taken by another VM); retry the create",
                "Conflict",
                409,
            )
        except errors.ApiError as exc:
            log.warning(
                "claim attachment failed",
                webhook=WEBHOOK,
                key=key,
                claim=claim_name,
                reason=exc.reason,
                error=exc.message,
            )
            return (
                f"claim {claim_name}: could not record its attachment to this VM ({exc.code} "
                f"{exc.reason}); retry shortly",
                "InternalError",
                500,
            )
        log.info("claim attached", webhook=WEBHOOK, key=key, claim=claim_name, reason="Attached")
        return None
