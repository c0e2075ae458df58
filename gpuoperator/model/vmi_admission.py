"""The VMI admission decision (docs/design.md §5 "VMs"): what the VMI webhook refuses, judged
without placement, and what it writes for an admitted VMI with references.

* :func:`vmi_refusals` — what the VMI webhook refuses.
* :func:`template_refusals` — what a ``claimTemplate`` reference is refused for, judged as an
  order is (the VMI webhook at admission, the template controller again before it creates).
* :func:`gpu_entries` / :func:`gpus_patch` — the ``spec.domain.devices.gpus`` entries the
  VMI webhook writes, one per unit; :func:`unadmitted_entries` says when a VMI's entries are
  not exactly those (its references were not judged by the webhook as they stand).
* :func:`dra_shape` / :func:`resource_claims_patch` — KubeVirt's DRA shape for references to
  claims of DRA classes (``spec.resourceClaims`` naming each claim's hold, ``gpus`` entries
  with ``claimName``/``requestName``, docs/design.md §5 "DRA classes"), written by
  :func:`admission_patch` (:func:`admitted_devices` says which shape a VMI gets).

The webhook writes nothing but its answer: the attachment of a held claim is recorded by the
attachments controller once the VMI exists.

Choices where docs/design.md is silent:

* ``hostDevices`` beside references are refused when they name the resourceName of any
  class (docs/design.md §10), judged on the classes that exist at admission; other host devices
  (NICs, USB...) stay allowed.
* Besides the refusals docs/design.md lists, :func:`vmi_refusals` refuses a held claim that is
  being deleted, a held claim whose class no longer exists, and a held claim named by another
  live VMI's annotation even when its attachment is not recorded (yet).
* A template's class is judged with the order's own rules and messages (maxCount and the
  vGPU entitlement, :mod:`gpuoperator.model.orders`), and its count against the most units
  of the class's resource that one node serving the class has allocatable (a count above it
  could never fit; with no node serving the class, every count is refused until one does).
* **Refusals name nothing the review did not bring** beyond facts about the objects it
  names: no list of the namespace's claims, of the classes or of the KubeVirt CR's permitted
  resources, no name of another VM. A review's requester cannot be verified by the webhook
  (its userInfo is the review's own word), so a message must be one any caller who can reach
  the webhook may read: what it learns is whether a claim it names exists in the namespace
  it names and whether that claim is in use, nothing it did not guess.
* **Claims of DRA classes**: a VM with one is refused references to device-plugin classes
  beside it (a mixed VM would need a pin and a claim kube-scheduler places), and more than one
  (the binder binds each on its own and DRA claims are never moved together, so two could
  never meet on one node); one claim may hold several devices. A DRA claimTemplate needs the
  VMI's name (its hold is named after the claim, which is named after the VMI). KubeVirt's
  ``permittedHostDevices`` do not apply to a DRA class.
* With ``gpuForVMs`` off only that refusal is returned: nothing else matters until it is on.
* The operator's ``gpus`` entries are named ``gpuop-<n>`` (units counted from 0 across the
  VMI); entries with that prefix are not counted as the tenant's raw entries, because
  :func:`gpus_patch` rewrites the whole list anyway (a re-invoked webhook stays idempotent).

Every function is pure and idempotent: no I/O, plain dicts in and out (inputs are never
mutated), and applying a result twice changes nothing (the JSON patch comes back empty once
applied).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import (
    claims,
    dra_holds,
    hostdevices,
    objects,
    orders,
    patches,
    references,
)
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]

#: At most this many names are listed in messages (entries of the VMI under review).
MAX_LISTED: Final = 20

#: Prefix of the ``gpus`` entries the operator writes (:func:`gpu_entries`).
GPU_ENTRY_PREFIX: Final = "gpuop-"


def _gpus(vmi: Mapping[str, Any]) -> list[Any]:
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, Mapping) else None
    devices = domain.get("devices") if isinstance(domain, Mapping) else None
    gpus = devices.get("gpus") if isinstance(devices, Mapping) else None
    return gpus if isinstance(gpus, list) else []


def is_operator_entry(entry: Any) -> bool:
    """Whether a ``gpus`` entry is one the operator wrote (:data:`GPU_ENTRY_PREFIX`)."""
    return isinstance(entry, Mapping) and str(entry.get("name") or "").startswith(GPU_ENTRY_PREFIX)


def raw_gpu_entries(vmi: Mapping[str, Any]) -> list[Any]:
    """The VMI's own ``spec.domain.devices.gpus`` entries: all but the operator's (which a
    re-invoked webhook, or a VMI re-created from a dump, already carries). :func:`gpus_patch`
    replaces the whole list, so an entry that only looks like the operator's is dropped."""
    return [entry for entry in _gpus(vmi) if not is_operator_entry(entry)]


def _listed(values: Iterable[str]) -> str:
    items = sorted(set(values))
    if not items:
        return "none"
    more = len(items) - MAX_LISTED
    return ", ".join(items[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(objects.meta(obj).get("deletionTimestamp"))


def _user_elsewhere(
    claim_name: str, claim: Mapping[str, Any], vmi_name: str, live_vmis: Mapping[str, Obj]
) -> str | None:
    """Another live VMI that uses the held claim: the one its attachment names, when that
    VMI is a live user (:func:`claims.is_live_user`: it exists with the attachment's UID when
    recorded, being deleted or not — a VMI being deleted may still hold the GPU), else one
    whose own annotation references it (an attachment not recorded yet). ``None`` when no
    other VMI does."""
    attached = claims.attachment(claim)
    if (
        attached is not None
        and attached.name != vmi_name
        and claims.is_live_user(attached, live_vmis.get(attached.name))
    ):
        return attached.name
    for other in sorted(live_vmis):
        live = live_vmis[other]
        if other == vmi_name or not references.has_references(live):
            continue
        try:
            refs = references.from_object(live)
        except references.AnnotationError:
            continue
        if references.HeldRef(claim_name) in refs:
            return other
    return None


def _class_refusals(
    at: str,
    cls: Obj,
    namespace: Mapping[str, Any] | None,
    namespace_name: str,
    permitted: frozenset[str] | None,
) -> list[str]:
    class_name = gpuclasses.name(cls)
    refusals: list[str] = []
    not_entitled = orders.entitlement_refusal(cls, namespace, namespace_name)
    if not_entitled is not None:
        refusals.append(f"{at}: {not_entitled}")
    resource = gpuclasses.resource_name(cls)
    # A DRA class serves no extended resource: KubeVirt's permittedHostDevices do not apply.
    if gpuclasses.dra(cls) is None and not hostdevices.is_permitted(resource, permitted):
        refusals.append(
            f"{at}: class {class_name} uses {resource or 'no resource'}, which the KubeVirt "
            "CR's spec.configuration.permittedHostDevices does not permit; allowed: a class "
            "whose resource the hoster permits there"
        )
    return refusals


def template_refusals(
    index: int,
    ref: references.TemplateRef,
    *,
    classes: Mapping[str, Obj],
    namespace: Mapping[str, Any] | None,
    namespace_name: str,
    permitted: frozenset[str] | None,
    largest_allocatable: Mapping[str, int],
) -> list[str]:
    """Why the ``claimTemplate`` reference ``ref`` at ``index`` (0-based) is refused, judged
    as an order is: its class exists, ``count`` is within the class's effective maxCount, the
    namespace is entitled to a vGPU class, the KubeVirt CR permits the class's resource, and
    ``count`` is at most ``largest_allocatable[class]`` — the most units of the class's
    resource one node serving the class has allocatable (missing: no node serves it), since a
    template claim of more could never fit. ``[]`` when it is admitted."""
    at = references.item_field(index)
    field = f"{at}: {references.TEMPLATE_KEY}.{references.CLASS_NAME_KEY}"
    count_field = f"{at}: {references.TEMPLATE_KEY}.{references.COUNT_KEY}"
    cls = classes.get(ref.class_name)
    if cls is None:
        return [
            f"{field}: class {ref.class_name} does not exist; allowed: a class of the catalog "
            "(kubectl get gpuclasses lists them)"
        ]
    refusals: list[str] = []
    too_many = orders.max_count_refusal(cls, ref.count)
    if too_many is not None:
        refusals.append(f"{count_field}: {too_many}")
    else:
        largest = int(largest_allocatable.get(ref.class_name, 0))
        if ref.count > largest:
            where = (
                f"the most one node serving class {ref.class_name} has allocatable is {largest}"
                if largest
                else f"no node serves class {ref.class_name} now"
            )
            refusals.append(
                f"{count_field}: {_plural(ref.count, 'GPU', 'GPUs')} of class "
                f"{ref.class_name} could never fit on one node: {where}; allowed: a count of "
                f"at most {largest}"
            )
    refusals.extend(_class_refusals(field, cls, namespace, namespace_name, permitted))
    return refusals


def _class_of(
    ref: references.Reference, classes: Mapping[str, Obj], claims: Mapping[str, Obj]
) -> Obj | None:
    if isinstance(ref, references.TemplateRef):
        return classes.get(ref.class_name)
    claim = claims.get(ref.claim)
    return None if claim is None else classes.get(orders.ordered_class(claim))


def is_dra_reference(
    ref: references.Reference, classes: Mapping[str, Obj], claims: Mapping[str, Obj]
) -> bool:
    """Whether ``ref`` is to a claim of a DRA class (``False`` when its claim or class is
    unknown)."""
    cls = _class_of(ref, classes, claims)
    return cls is not None and gpuclasses.dra(cls) is not None


def _dra_mix_refusals(
    refs: Sequence[references.Reference],
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    vmi_name: str,
) -> list[str]:
    dra = [i for i, ref in enumerate(refs) if is_dra_reference(ref, classes, claims)]
    if not dra:
        return []
    where = references.field()
    plugin = [
        i
        for i, ref in enumerate(refs)
        if i not in dra and _class_of(ref, classes, claims) is not None
    ]
    refusals: list[str] = []
    shown = ", ".join(str(i) for i in dra)
    if plugin:
        refusals.append(
            f"{where}: items {shown} are claims of DRA classes and items "
            f"{', '.join(str(i) for i in plugin)} of device-plugin classes; allowed: claims "
            "of DRA classes only or of device-plugin classes only in one VM"
        )
    if len(dra) > 1:
        refusals.append(
            f"{where}: items {shown} are {len(dra)} claims of DRA classes, which could be "
            "bound to different nodes and are never moved together; allowed: one claim of a "
            "DRA class per VM (its count may be above 1)"
        )
    if not vmi_name and any(isinstance(refs[i], references.TemplateRef) for i in dra):
        refusals.append(
            f"{where}: a claimTemplate of a DRA class names its claim after the VM instance, "
            "and this one has no metadata.name yet; allowed: a VM instance with a name"
        )
    return refusals


def vmi_refusals(
    vmi: Mapping[str, Any],
    refs: Sequence[references.Reference],
    *,
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    live_vmis: Mapping[str, Obj],
    namespace: Mapping[str, Any] | None,
    permitted: frozenset[str] | None,
    gpu_for_vms: bool,
    largest_allocatable: Mapping[str, int],
) -> list[str]:
    """Why the VMI webhook refuses ``vmi`` with the parsed ``refs`` (docs/design.md §5 "VMs"),
    judged without placement; ``[]`` when it is admitted. Every applicable refusal is
    returned, in reference order, each naming the field (``annotation
    gpu.cozystack.io/claims: item N``, ``spec.domain.devices.gpus`` or
    ``spec.domain.devices.hostDevices``) and what is allowed.

    ``classes`` are the GPUClasses by name, ``claims`` the namespace's GPUClaims by name,
    ``live_vmis`` the namespace's VMIs by name (the VMI being created is not among them),
    ``namespace`` the Namespace object (``None``: unknown, not entitled), ``permitted`` the
    KubeVirt table read by :func:`hostdevices.permitted_resources` (``None``: no table),
    ``gpu_for_vms`` the feature switch and ``largest_allocatable`` what
    :func:`template_refusals` compares a template's count with.
    """
    if not refs:
        return []
    where = references.field()
    if not gpu_for_vms:
        return [
            f"{where}: GPU claim references are switched off on this cluster (operator setting "
            f"gpuForVMs is off); allowed: a VM without the label {names.CLAIMS_LABEL} and "
            "this annotation"
        ]
    meta = objects.meta(vmi)
    vmi_name = str(meta.get("name") or "")
    namespace_name = str(objects.meta(namespace).get("name") or meta.get("namespace") or "")
    refusals: list[str] = []
    raw = raw_gpu_entries(vmi)
    if raw:
        shown = _listed(
            str(e.get("name")) if isinstance(e, Mapping) else references.shown(e) for e in raw
        )
        refusals.append(
            f"spec.domain.devices.gpus: {_plural(len(raw), 'entry', 'entries')} ({shown}) next "
            f"to claim references in {where}; allowed: either gpus entries or claim references, "
            "not both (the operator writes the gpus entries of claim references itself)"
        )
    gpu_resources = {gpuclasses.resource_name(c) for c in classes.values()} - {""}
    host_gpus = hostdevices.gpu_host_devices(vmi, gpu_resources)
    if host_gpus:
        shown = _listed(f"{name or '(unnamed)'} ({device})" for name, device in host_gpus)
        refusals.append(
            f"spec.domain.devices.hostDevices: {_plural(len(host_gpus), 'entry', 'entries')} "
            f"({shown}) name a GPU resource next to claim references in {where}; allowed: "
            "GPUs through claim references only (hostDevices that name no GPU class's resource "
            "stay allowed)"
        )
    refusals.extend(_dra_mix_refusals(refs, classes, claims, vmi_name))
    for index, ref in enumerate(refs):
        if isinstance(ref, references.TemplateRef):
            refusals.extend(
                template_refusals(
                    index,
                    ref,
                    classes=classes,
                    namespace=namespace,
                    namespace_name=namespace_name,
                    permitted=permitted,
                    largest_allocatable=largest_allocatable,
                )
            )
            continue
        field = f"{references.item_field(index)}: {references.CLAIM_KEY} {ref.claim}"
        claim = claims.get(ref.claim)
        if claim is None:
            refusals.append(
                f"{field}: no such GPUClaim in namespace {namespace_name}; allowed: a claim "
                f"ordered in this namespace (kubectl get gpuclaims -n {namespace_name} lists "
                "them), or a claimTemplate"
            )
            continue
        if orders.is_template_claim(claim):
            refusals.append(
                f"{field}: the operator made this claim from a VM's claim template (label "
                f"{names.TEMPLATE_CLAIM_LABEL}={names.TRUE}) and only that VM uses it; "
                "allowed: a claim you ordered, or a claimTemplate"
            )
            continue
        if _deleting(claim):
            refusals.append(
                f"{field}: the claim is being deleted; allowed: a claim that is not being deleted"
            )
            continue
        other = _user_elsewhere(ref.claim, claim, vmi_name, live_vmis)
        if other is not None:
            state = (
                "which is being deleted and may still hold the GPU"
                if _deleting(live_vmis[other])
                else "which still exists"
            )
            refusals.append(
                f"{field}: the claim is in use by another VM instance, {state}, and a claim "
                "serves one VM at a time; allowed: a claim no other live VM uses (kubectl get "
                f"gpuclaim {ref.claim} -n {namespace_name} shows the VM in its VM column: stop "
                "it and retry once it is gone, or order another claim)"
            )
        cls = classes.get(orders.ordered_class(claim))
        if cls is None:
            refusals.append(
                f"{field}: the claim's class no longer exists; allowed: a claim of an existing "
                "class"
            )
            continue
        refusals.extend(_class_refusals(field, cls, namespace, namespace_name, permitted))
    return refusals


def gpu_entries(
    refs: Sequence[references.Reference], classes: Mapping[str, Obj], claims: Mapping[str, Obj]
) -> list[Obj]:
    """The ``spec.domain.devices.gpus`` entries for ``refs``: one per unit, in reference
    order (a held claim's ``spec.count`` units, a template's ``count``), each
    ``{"name": "gpuop-<n>", "deviceName": <class resourceName>}`` with ``n`` counting units
    from 0 across the whole VMI.

    The names are unique within the VMI, DNS labels (as KubeVirt expects), and cannot collide
    with a tenant's own entries: a VMI with references may carry none
    (:func:`vmi_refusals`), and :func:`gpus_patch` replaces the list. Call after
    :func:`vmi_refusals` returned nothing: an unknown claim or class raises ``ValueError``.
    """
    entries: list[Obj] = []
    for ref in refs:
        if isinstance(ref, references.TemplateRef):
            class_name, count = ref.class_name, ref.count
        else:
            claim = claims.get(ref.claim)
            if claim is None:
                raise ValueError(f"claim {ref.claim} is unknown")
            class_name, count = orders.ordered_class(claim), orders.ordered_count(claim)
        cls = classes.get(class_name)
        if cls is None:
            raise ValueError(f"class {class_name} is unknown")
        resource = gpuclasses.resource_name(cls)
        first = len(entries)
        entries.extend(
            {"name": f"{GPU_ENTRY_PREFIX}{first + unit}", "deviceName": resource}
            for unit in range(count)
        )
    return entries


def _list_patch(vmi: Mapping[str, Any], path: tuple[str, ...], entries: list[Obj]) -> list[Obj]:
    node: Mapping[str, Any] = vmi
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if not isinstance(child, Mapping):
            value: Any = copy.deepcopy(entries)
            for missing in reversed(path[depth + 1 :]):
                value = {missing: value}
            return [{"op": "add", "path": patches.json_pointer(*path[: depth + 1]), "value": value}]
        node = child
    if node.get(path[-1]) == entries:
        return []
    # "add" on an existing member replaces it (RFC 6902), so one op serves both cases.
    return [{"op": "add", "path": patches.json_pointer(*path), "value": copy.deepcopy(entries)}]


def gpus_patch(vmi: Mapping[str, Any], entries: list[Obj]) -> list[Obj]:
    """JSON patch ops that make ``spec.domain.devices.gpus`` exactly ``entries`` (creating
    missing parents); ``[]`` when it already is. The whole list is written, so operator
    entries of an earlier pass are replaced, never doubled."""
    return _list_patch(vmi, ("spec", "domain", "devices", "gpus"), entries)


def resource_claims_patch(vmi: Mapping[str, Any], entries: list[Obj]) -> list[Obj]:
    """JSON patch ops that make ``spec.resourceClaims`` exactly ``entries`` (from
    :func:`dra_shape`); ``[]`` when it already is. As :func:`gpus_patch`, the whole list is
    written."""
    return _list_patch(vmi, ("spec", "resourceClaims"), entries)


def dra_shape(
    refs: Sequence[references.Reference],
    claim_names: Sequence[str],
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
) -> tuple[list[Obj], list[Obj]]:
    """KubeVirt's DRA shape (``GPUsWithDRA``) for ``refs``, all of claims of DRA classes:
    ``(resource_claims, gpus)``, the ``spec.resourceClaims`` and ``spec.domain.devices.gpus``
    lists, one entry of each per reference, in reference order.

    ``claim_names`` are the GPUClaims the references use, in the same order
    (:func:`gpuoperator.model.templates.claim_names`: a template's claim is named from the
    VMI before it exists). The reference at position ``n`` gives
    ``{"name": "gpuop-<n>", "resourceClaimName": <the claim's hold>}`` — the hold's name is
    deterministic from the claim's (:func:`dra_holds.resource_claim_name`), so a template
    claim's hold is named before the binder creates it — and
    ``{"name": "gpuop-<n>", "claimName": "gpuop-<n>", "requestName": dra_holds.REQUEST}``:
    one ``gpus`` entry per claim, since the hold's one request holds all its devices. Never a
    ``deviceName``: a DRA class serves no extended resource.

    The local names are DNS labels (a pod's resource claim names must be) whatever the
    claims' names. An unknown claim or class, a class that is not a DRA class, or
    ``claim_names`` not matching ``refs`` raise ``ValueError``.
    """
    if len(claim_names) != len(refs):
        raise ValueError(f"{len(refs)} references but {len(claim_names)} claim names")
    resource_claims: list[Obj] = []
    gpus: list[Obj] = []
    for index, (ref, claim_name) in enumerate(zip(refs, claim_names, strict=True)):
        if isinstance(ref, references.TemplateRef):
            class_name = ref.class_name
        else:
            claim = claims.get(ref.claim)
            if claim is None:
                raise ValueError(f"claim {ref.claim} is unknown")
            if claim_name != ref.claim:
                raise ValueError(f"claim name {claim_name} is not the reference's {ref.claim}")
            class_name = orders.ordered_class(claim)
        cls = classes.get(class_name)
        if cls is None:
            raise ValueError(f"class {class_name} is unknown")
        if gpuclasses.dra(cls) is None:
            raise ValueError(f"class {class_name} is not a DRA class")
        local = f"{GPU_ENTRY_PREFIX}{index}"
        hold = dra_holds.resource_claim_name({"metadata": {"name": claim_name}})
        resource_claims.append({"name": local, "resourceClaimName": hold})
        gpus.append({"name": local, "claimName": local, "requestName": dra_holds.REQUEST})
    return resource_claims, gpus


def admitted_devices(
    refs: Sequence[references.Reference],
    claim_names: Sequence[str],
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
) -> tuple[list[Obj] | None, list[Obj]]:
    """What the VMI webhook writes for ``refs`` (admitted by :func:`vmi_refusals`):
    ``(spec.resourceClaims, spec.domain.devices.gpus)``. References to claims of DRA classes
    get KubeVirt's DRA shape (:func:`dra_shape`); others the ``deviceName`` entries
    (:func:`gpu_entries`) and ``None``: the VMI's own ``spec.resourceClaims`` are left as
    they are. ``claim_names`` as :func:`dra_shape` takes them."""
    if any(is_dra_reference(ref, classes, claims) for ref in refs):
        return dra_shape(refs, claim_names, classes, claims)
    return None, gpu_entries(refs, classes, claims)


def admission_patch(
    vmi: Mapping[str, Any],
    refs: Sequence[references.Reference],
    claim_names: Sequence[str],
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
) -> list[Obj]:
    """The VMI webhook's JSON patch for an admitted ``vmi`` (:func:`admitted_devices`)."""
    resource_claims, gpus = admitted_devices(refs, claim_names, classes, claims)
    ops = gpus_patch(vmi, gpus)
    if resource_claims is not None:
        ops += resource_claims_patch(vmi, resource_claims)
    return ops


def _resource_claims(vmi: Mapping[str, Any]) -> Any:
    spec = vmi.get("spec")
    return spec.get("resourceClaims") if isinstance(spec, Mapping) else None


def unadmitted_entries(
    vmi: Mapping[str, Any],
    refs: Sequence[references.Reference],
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    claim_names: Sequence[str],
) -> str | None:
    """Why the VMI's ``spec.domain.devices.gpus`` (and, for claims of DRA classes, its
    ``spec.resourceClaims``) are not exactly what the VMI webhook writes for ``refs``
    (:func:`admitted_devices`); ``None`` when they are. Entries that differ show that the
    references were not judged by the webhook as they stand (the VMI was created without the
    claims label, which the webhook's objectSelector skips, and labelled or annotated
    afterwards), so nothing may be ordered from them."""
    try:
        resource_claims, wanted = admitted_devices(refs, claim_names, classes, claims)
    except ValueError as exc:
        return (
            f"{references.field()}: the gpus entries of these references cannot be derived "
            f"({exc}); allowed: references to claims and classes that exist"
        )
    if _gpus(vmi) != wanted:
        return (
            f"spec.domain.devices.gpus: {_plural(len(_gpus(vmi)), 'entry', 'entries')}, not "
            f"the {_plural(len(wanted), 'entry', 'entries')} the VMI webhook writes for the "
            f"references in {references.field()} (the references were not judged at admission)"
        )
    if resource_claims is not None and _resource_claims(vmi) != resource_claims:
        return (
            "spec.resourceClaims: not the entries the VMI webhook writes for the references "
            f"in {references.field()} (the references were not judged at admission)"
        )
    return None
