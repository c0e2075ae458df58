"""Naming a DRA hold raw (docs/design.md §5 "DRA classes"): which pods and VMIs may name, in
their ``spec.resourceClaims``, the ResourceClaim that holds a GPU claim's devices.

A hold is in the tenant's namespace and named after its claim, so a tenant's own pod
(``spec.resourceClaims[i].resourceClaimName``) or VMI (``spec.resourceClaims[i].
resourceClaimName``, which KubeVirt renders into the launcher pod) could name it and get the
devices from kube-scheduler without the catalog: without an attachment, without being
counted as serving. A ValidatingAdmissionPolicy cannot read the named ResourceClaim; the
webhooks can, from their caches. A name is **a hold's** (:func:`hold_of`) when the cached
ResourceClaim of that name is controlled by a GPUClaim (``dra_holds.is_hold``), or when a
GPUClaim of that name and of a DRA class is in the namespace (its hold is, or will be, named
after it).

* **a pod** naming a hold is admitted only when it is the launcher pod (or another pod
  KubeVirt's controller makes, as ``launcher_pods.creator_refusal`` recognises one: created
  by ``kubevirtServiceAccount``, controlled by a VMI) of the VMI the hold's claim serves: the
  claim's user (``claims.user``: its owner for a template claim, else its attachment) is
  that VMI, by name and by UID once recorded; a claim without a user yet is served by a VMI
  whose references (copied onto the pod by KubeVirt, and unchangeable on the VMI) name it;
* **a VMI** naming a hold is admitted only when it requests the hold's claim: a held
  reference naming it, or a ``claimTemplate`` whose claim (``templates.claim_names``) it is.

Pure: plain dicts in, refusal messages out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuoperator import names
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import dra_holds, echo, objects, references, templates

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Named:
    """A ResourceClaim an object names: the field path and the name."""

    field: str
    name: str


def named(obj: Mapping[str, Any]) -> list[Named]:
    """The ResourceClaims a pod's or a VMI's ``spec.resourceClaims[].resourceClaimName``
    name (the two kinds share the field's shape)."""
    spec = obj.get("spec")
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    out = []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
        if isinstance(name, str) and name:
            out.append(Named(f"spec.resourceClaims[{index}].resourceClaimName", name))
    return out


def hold_of(
    name: str,
    resource_claim: Mapping[str, Any] | None,
    claim_named: Callable[[str], Obj | None],
    class_named: Callable[[str], Obj | None],
) -> Obj | None:
    """The GPUClaim whose hold the ResourceClaim ``name`` (of the object's namespace) is,
    or ``None`` when it is nobody's hold (the module's rule). ``resource_claim`` is the
    cached one of that name, ``claim_named`` gives the namespace's GPUClaim of a name and
    ``class_named`` the GPUClass of a name (``None``: none). A hold controlled by a GPUClaim
    that is not cached (yet) is still a hold: the claim is given by the owner reference's
    name alone."""
    if resource_claim is not None and dra_holds.is_hold(resource_claim):
        owners = objects.meta(resource_claim).get("ownerReferences") or []
        owner = next(
            o
            for o in owners
            if isinstance(o, Mapping)
            and o.get("controller") is True
            and o.get("kind") == names.GPU_CLAIM
        )
        found = claim_named(str(owner.get("name") or ""))
        return found if found is not None else {"metadata": {"name": owner.get("name")}}
    claim = claim_named(name)
    if claim is None:
        return None
    cls = class_named(str((claim.get("spec") or {}).get("className") or ""))
    return claim if cls is not None and gpuclasses.is_dra(cls) else None


def _what(claim: Mapping[str, Any], name: str) -> str:
    claim_name = str(objects.meta(claim).get("name") or "")
    return f"ResourceClaim {echo.clip(name)} is the hold of GPUClaim {echo.clip(claim_name)}"


def _serves(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` (KubeVirt's, controlled by a VMI) is of the VMI ``claim`` serves."""
    vmi = gpuclaims.controlling_vmi(pod)
    if vmi is None:
        return False
    served = gpuclaims.user(claim)
    if served is not None:
        return served.name == vmi.name and (not served.uid or served.uid == vmi.uid)
    try:
        refs = references.from_object(pod)
    except references.AnnotationError:
        return False
    claim_name = str(objects.meta(claim).get("name") or "")
    return claim_name in templates.claim_names(vmi.name, refs) if vmi.name else False


def pod_refusals(
    pod: Mapping[str, Any],
    kubevirt_made: bool,
    find_hold: Callable[[str], Obj | None],
) -> list[str]:
    """Why ``pod`` may not name the holds it names (none: admitted). ``kubevirt_made``: the
    request comes from ``kubevirtServiceAccount`` (KubeVirt's controller); ``find_hold``
    gives :func:`hold_of` for a name of the pod's namespace."""
    out = []
    for entry in named(pod):
        claim = find_hold(entry.name)
        if claim is None or (kubevirt_made and _serves(claim, pod)):
            continue
        out.append(
            f"{entry.field}: {_what(claim, entry.name)}; only the launcher pod KubeVirt "
            "creates for the VM that claim serves may name it: reference the claim from a "
            f"VirtualMachineInstance (annotation {names.CLAIMS_ANNOTATION}) instead"
        )
    return out


def vmi_refusals(
    vmi: Mapping[str, Any],
    refs: Iterable[references.Reference],
    find_hold: Callable[[str], Obj | None],
) -> list[str]:
    """Why ``vmi`` may not name the holds it names (none: admitted): each must be the hold
    of a claim the VMI requests through its references ``refs``."""
    vmi_name = str(objects.meta(vmi).get("name") or "")
    listed = list(refs)
    # A VMI without a name yet has no template claims (their names need it).
    requested = set(
        templates.claim_names(vmi_name, listed) if vmi_name else references.held_claims(listed)
    )
    out = []
    for entry in named(vmi):
        claim = find_hold(entry.name)
        if claim is None or str(objects.meta(claim).get("name") or "") in requested:
            continue
        out.append(
            f"{entry.field}: {_what(claim, entry.name)}, which this VMI does not request; a "
            "VMI may name only the holds of the claims it references: reference the claim "
            f"in annotation {names.CLAIMS_ANNOTATION} and the webhook names its hold"
        )
    return out
