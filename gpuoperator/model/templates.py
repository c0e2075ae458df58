"""Template claims (docs/design.md §2 GPUClaim, §5 "VMs"): the GPUClaims the template controller
makes for a VMI's ``claimTemplate`` references, and which claims a VMI uses.

Choices where docs/design.md is silent:

* The ``index`` of :func:`template_claim_name` is the 0-based position of the reference in
  the whole annotation list (held references included), so it stays stable whatever the
  other items are.
* Template claim names are ``<vmi>-gpu-<index>``, hashed when long, bounded by 244 so the
  usage record ``gpuclaim-<claim>`` stays a valid name too.
* **Only admitted references order claims** (:func:`creation_refusals`). A VMI's references
  are ordered from only when its ``spec.domain.devices.gpus`` are exactly what the VMI
  webhook writes for them (proof that the webhook judged this annotation: a VMI created
  without the claims label is skipped by the webhook's objectSelector, and a label or
  annotation added later was never judged), and each template passes the webhook's own
  template judgement again (class, maxCount, vGPU entitlement, the KubeVirt CR's table,
  a count no larger than the largest allocatable of one node) on the state of now. The
  entries alone prove little against a tenant who writes them herself; the second check is
  what holds then: she gets no claim the webhook would have refused her.

Every function is pure and idempotent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims, objects, orders, references, vmi_admission

Obj = dict[str, Any]

#: Template claim names leave room for the usage record's ``gpuclaim-`` prefix
#: (:func:`names.workload_name`), so the record's name is a valid DNS subdomain too.
MAX_TEMPLATE_CLAIM_NAME: Final = 253 - len(names.WORKLOAD_PREFIX)
_TEMPLATE_INFIX: Final = "-gpu-"
_HASH_CHARS: Final = 10


def claim_names(vmi_name: str, refs: Sequence[references.Reference]) -> list[str]:
    """Every claim the VMI uses, in reference order: held claims by their name, templates by
    :func:`template_claim_name` (what the placement controller waits on)."""
    return [
        ref.claim if isinstance(ref, references.HeldRef) else template_claim_name(vmi_name, index)
        for index, ref in enumerate(refs)
    ]


def template_claim_name(vmi_name: str, index: int) -> str:
    """The name of the claim made from the reference at ``index`` (0-based position in the
    annotation list) of the VMI ``vmi_name``: ``<vmi>-gpu-<index>``.

    The name is a valid DNS subdomain of at most :data:`MAX_TEMPLATE_CLAIM_NAME` characters
    (253 less the usage record's ``gpuclaim-`` prefix) for any valid VMI name. When the VMI
    name is too long, it is cut and a stable hash of the whole VMI name is inserted
    (``<cut vmi>-<10 hex of sha256(vmi)>-gpu-<index>``), so distinct (VMI, index) pairs give
    distinct names. The scheme is part of the contract: the template controller finds its
    claims by this name, so changing it would orphan the claims of running VMs.

    The claim carries no VMI name in a label (a VMI name can exceed a label value, docs/design.md
    §2): it is tied to its VMI by this name and by its controller ownerReference
    (:func:`template_claim`), so garbage collection removes it with the VMI. A claim of this
    name that is not controlled by the VMI's UID (a tenant's own claim, or the claim of an
    earlier VMI of the same name still being collected) is never adopted.
    """
    if not 0 <= index < references.MAX_REFERENCES:
        raise ValueError(f"index must be from 0 to {references.MAX_REFERENCES - 1}, got {index}")
    if not vmi_name:
        raise ValueError("a template claim needs the VMI's name")
    suffix = f"{_TEMPLATE_INFIX}{index}"
    if len(vmi_name) + len(suffix) <= MAX_TEMPLATE_CLAIM_NAME:
        return vmi_name + suffix
    digest = hashlib.sha256(vmi_name.encode()).hexdigest()[:_HASH_CHARS]
    room = MAX_TEMPLATE_CLAIM_NAME - len(suffix) - len(digest) - 1
    # A cut can end in "-" or "."; a DNS subdomain's labels end in a letter or digit.
    prefix = vmi_name[:room].rstrip("-.")
    return f"{prefix}-{digest}{suffix}"


def _vmi_owner(vmi: Mapping[str, Any]) -> Obj:
    meta = objects.meta(vmi)
    uid = meta.get("uid")
    name = meta.get("name")
    if not uid or not name:
        raise ValueError("a template claim is owned by an existing VMI: it needs a name and uid")
    return {
        "apiVersion": names.KUBEVIRT_API_VERSION,
        "kind": names.VMI_KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def template_claim(vmi: Mapping[str, Any], index: int, ref: references.TemplateRef) -> Obj:
    """The GPUClaim the template controller creates for the template reference ``ref`` at
    ``index`` of ``vmi`` (an existing VMI: its UID is needed for the ownerReference).

    In the VMI's namespace, named :func:`template_claim_name`, marked with
    ``gpu.cozystack.io/template-claim: "true"`` (so the order webhook lets it wait for
    capacity), controlled by the VMI (``blockOwnerDeletion``: the creator needs ``update`` on
    ``virtualmachineinstances/finalizers`` where OwnerReferencesPermissionEnforcement is on),
    and ordering ``ref``'s class and count. It is created protected (the claim-protection
    finalizer in the create), so its first write after that is its binding.
    """
    meta = objects.meta(vmi)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": template_claim_name(str(meta.get("name") or ""), index),
            "namespace": str(meta.get("namespace") or ""),
            "labels": {names.TEMPLATE_CLAIM_LABEL: names.TRUE},
            "ownerReferences": [_vmi_owner(vmi)],
            "finalizers": [names.CLAIM_PROTECTION_FINALIZER],
        },
        "spec": {"className": ref.class_name, "count": ref.count},
    }


def template_claims(vmi: Mapping[str, Any], refs: Sequence[references.Reference]) -> list[Obj]:
    """:func:`template_claim` for every template reference of ``vmi``, in order."""
    return [
        template_claim(vmi, index, ref)
        for index, ref in enumerate(refs)
        if isinstance(ref, references.TemplateRef)
    ]


def is_template_claim_of(claim: Mapping[str, Any], vmi: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is a marked claim controlled by this very VMI (same UID): the only
    claims the template controller treats as its own."""
    uid = objects.meta(vmi).get("uid")
    if not uid or not orders.is_template_claim(claim):
        return False
    owner = claims.controlling_vmi(claim)
    return owner is not None and owner.uid == uid


def creation_refusals(
    vmi: Mapping[str, Any],
    refs: Sequence[references.Reference],
    *,
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    namespace: Mapping[str, Any] | None,
    permitted: frozenset[str] | None,
    largest_allocatable: Mapping[str, int],
) -> list[str]:
    """Why the template controller may not create the claims of ``vmi``'s template
    references (see the module docstring); ``[]`` when it may. ``claims`` are the
    namespace's GPUClaims by name (a held reference's count sizes the webhook's entries),
    the rest as :func:`vmi_admission.template_refusals` takes them."""
    try:
        names_used = claim_names(str(objects.meta(vmi).get("name") or ""), refs)
    except ValueError as exc:
        return [f"{references.field()}: {exc}"]
    unadmitted = vmi_admission.unadmitted_entries(vmi, refs, classes, claims, names_used)
    if unadmitted is not None:
        return [unadmitted]
    namespace_name = str(
        objects.meta(namespace).get("name") or objects.meta(vmi).get("namespace") or ""
    )
    return [
        refusal
        for index, ref in enumerate(refs)
        if isinstance(ref, references.TemplateRef)
        for refusal in vmi_admission.template_refusals(
            index,
            ref,
            classes=classes,
            namespace=namespace,
            namespace_name=namespace_name,
            permitted=permitted,
            largest_allocatable=largest_allocatable,
        )
    ]
