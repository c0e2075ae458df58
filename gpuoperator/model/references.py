"""A VM's GPU claim references (DESIGN.md §2 GPUClaim, §4 names, §5 "VMs"), decided once for
the VMI webhook, the pod webhook, the template controller and the placement controller.

A VMI labelled ``gpu.cozystack.io/claims: "true"`` names its GPUs in the annotation
``gpu.cozystack.io/claims``: a JSON list of 1 to 16 references, each either a **held** claim
(``{"claim": "hold-a"}``, a GPUClaim the tenant ordered) or a **claim template**
(``{"claimTemplate": {"className": "a10", "count": 2}}``, a claim the operator orders for as
long as the VMI exists). KubeVirt copies every VMI label and annotation onto the launcher pod
and the temporary WaitForFirstConsumer pod, so the same parser reads pods.

What this module decides:

* :func:`parse` — the annotation's grammar; every error names the annotation, the 1-based
  item and what is allowed.
* :func:`vmi_refusals` — what the VMI webhook refuses without placement.
* :func:`gpu_entries` / :func:`gpus_patch` — the ``spec.domain.devices.gpus`` entries the
  VMI webhook writes, one per unit.
* :func:`attachment_patch` — what the VMI webhook records on each held claim.
* :func:`template_claim_name` / :func:`template_claim` — the claims the template controller
  makes.
* :func:`launcher_pod_kind`, :func:`gate_patch`, :func:`tolerations_patch` — the pod webhook.
* :func:`pin_and_ungate` — the placement controller's single pod update.

Choices where DESIGN.md is silent:

* Items are numbered from 1 in messages (``item 2`` is the second reference); the ``index``
  of :func:`template_claim_name` is the 0-based position of the reference in the whole list
  (held references included), so it stays stable whatever the other items are.
* ``parse(None)`` (the label without the annotation) is an error, not "no references": the
  label promises references.
* JSON objects with a repeated key, ``NaN``/``Infinity`` and non-integer counts (``2.0``,
  ``"2"``, ``true``) are refused rather than guessed at. A template's ``count`` is capped at
  :data:`MAX_TEMPLATE_COUNT` (the webhook writes one ``gpus`` entry per unit, so an unbounded
  count would be an unbounded response); the class's maxCount is checked separately.
* A held claim may be referenced once per VMI; the same template may appear twice (two claims).
* ``hostDevices`` beside references are refused when they name the resourceName of any
  class (DESIGN.md §10), judged on the classes that exist at admission; other host devices
  (NICs, USB...) stay allowed.
* Besides the refusals DESIGN.md lists, :func:`vmi_refusals` refuses a held claim that is
  being deleted, a held claim whose class no longer exists, a held claim named by another
  live VMI's annotation even when its attachment is not recorded (yet), and held references
  on a VMI without ``metadata.name`` (``generateName``: a mutating webhook sees no name yet,
  and the attachment records the VMI by name).
* With ``gpuForVMs`` off only that refusal is returned: nothing else matters until it is on.
* The operator's ``gpus`` entries are named ``gpuop-<n>`` (units counted from 0 across the
  VMI); entries with that prefix are not counted as the tenant's raw entries, because
  :func:`gpus_patch` rewrites the whole list anyway (a re-invoked webhook stays idempotent).
* Template claim names are ``<vmi>-gpu-<index>``, hashed when long, bounded by 244 so the usage
  record ``gpuclaim-<claim>`` stays a valid name too.
* The temporary WaitForFirstConsumer pod is recognised by the presence of its annotation, as
  KubeVirt itself does; a migration target is recognised first and never touched.
* Tolerations compare by key, operator (default ``Equal``), value and effect.
* The pin is ``matchFields`` ``metadata.name In [node]`` appended to every non-empty
  required term (an empty term matches no node, and stays so).

Every function is pure and idempotent: no I/O, plain dicts in and out (inputs are never
mutated), the same inputs give the same answer, and applying a result twice changes nothing
(the JSON patches come back empty once applied).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, NoReturn

from gpuoperator import names
from gpuoperator.model import claims, hostdevices, orders, tenants
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]

#: At most this many references on one VMI.
MAX_REFERENCES: Final = 16
#: At most this many units one claimTemplate may order (see the module docstring).
MAX_TEMPLATE_COUNT: Final = 64
#: At most this many names are listed after "known:" / "permitted:" in messages.
MAX_LISTED: Final = 20

CLAIM_KEY: Final = "claim"
TEMPLATE_KEY: Final = "claimTemplate"
CLASS_NAME_KEY: Final = "className"
COUNT_KEY: Final = "count"
EXAMPLE: Final = '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":2}}]'

#: Prefix of the ``gpus`` entries the operator writes (:func:`gpu_entries`).
GPU_ENTRY_PREFIX: Final = "gpuop-"

# KubeVirt's names, spelt in names.py; re-exported for the callers that read them here.
KUBEVIRT_API_VERSION: Final = names.KUBEVIRT_API_VERSION
VMI_KIND: Final = names.VMI_KIND
KUBEVIRT_LABEL: Final = names.KUBEVIRT_LABEL
VIRT_LAUNCHER: Final = names.VIRT_LAUNCHER
EPHEMERAL_ANNOTATION: Final = names.EPHEMERAL_ANNOTATION
MIGRATION_LABEL: Final = names.MIGRATION_LABEL
#: The node field the pin selects on (a node's own name, not a label that may differ).
NODE_NAME_FIELD: Final = "metadata.name"
#: The label earlier versions pinned on (still read by :func:`pinned_node`).
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"

#: Template claim names leave room for the usage record's ``gpuclaim-`` prefix
#: (:func:`names.workload_name`), so the record's name is a valid DNS subdomain too.
MAX_TEMPLATE_CLAIM_NAME: Final = 253 - len(names.WORKLOAD_PREFIX)
_TEMPLATE_INFIX: Final = "-gpu-"
_HASH_CHARS: Final = 10

_DNS_LABEL: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS_LABEL_MAX: Final = 63
_SHOWN_MAX: Final = 80

LauncherPodKind = Literal["launcher", "ephemeral", "migration-target", "other"]


# -- the references ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HeldRef:
    """A reference to a GPUClaim the tenant ordered and holds (``{"claim": name}``)."""

    claim: str


@dataclasses.dataclass(frozen=True)
class TemplateRef:
    """A claim template (``{"claimTemplate": {"className": c, "count": n}}``): the template
    controller orders a marked claim owned by the VMI (:func:`template_claim`)."""

    class_name: str
    count: int


Reference = HeldRef | TemplateRef


class ReferenceError(ValueError):  # the module's own, read as ``references.ReferenceError``
    """The annotation is malformed; the message names the annotation, the item and what is
    allowed, ready to be returned by a webhook."""


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> Obj:
    out: Obj = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _no_constants(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON number")


def _where() -> str:
    return f"annotation {names.CLAIMS_ANNOTATION}"


def _at(index: int) -> str:
    """The message prefix naming the ``index``-th (0-based) reference as ``item <index+1>``."""
    return f"{_where()}: item {index + 1}"


def _show(value: Any) -> str:
    """A JSON value as the tenant wrote it, shortened for a message."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return _show(value)


def _is_dns_label(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= _DNS_LABEL_MAX
        and _DNS_LABEL.fullmatch(value) is not None
    )


_DNS_LABEL_TEXT: Final = "a DNS label: lowercase letters, digits and '-', at most 63 characters"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_template(at: str, template: Any) -> TemplateRef:
    if not isinstance(template, dict):
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY} must be an object "
            f'{{"{CLASS_NAME_KEY}": <class>, "{COUNT_KEY}": <integer >= 1>}}, '
            f"got {_kind(template)}"
        )
    unknown = sorted(set(template) - {CLASS_NAME_KEY, COUNT_KEY})
    if unknown:
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY} has unknown key {', '.join(map(_show, unknown))}; "
            f"allowed: {CLASS_NAME_KEY}, {COUNT_KEY}"
        )
    if CLASS_NAME_KEY not in template:
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY}.{CLASS_NAME_KEY} is required (a class name, {_DNS_LABEL_TEXT})"
        )
    class_name = template[CLASS_NAME_KEY]
    if not _is_dns_label(class_name):
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY}.{CLASS_NAME_KEY} must be a class name ({_DNS_LABEL_TEXT}), "
            f"got {_show(class_name)}"
        )
    if COUNT_KEY not in template:
        raise ReferenceError(f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} is required (an integer >= 1)")
    count = template[COUNT_KEY]
    if not _is_count(count) or count < 1:
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} must be an integer >= 1, got {_show(count)}"
        )
    if count > MAX_TEMPLATE_COUNT:
        raise ReferenceError(
            f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} must be at most {MAX_TEMPLATE_COUNT}, got {count}"
        )
    return TemplateRef(class_name=class_name, count=count)


def parse(annotation_value: str | None) -> list[Reference]:
    """The references of the annotation ``gpu.cozystack.io/claims``, in order.

    Raises :class:`ReferenceError` when the value is missing, not JSON, not a list, empty,
    longer than :data:`MAX_REFERENCES`, or an item is not an object with exactly one of
    ``claim`` (a DNS label) or ``claimTemplate`` (``{className: DNS label, count: 1..64}``),
    has unknown keys, or names a held claim already named by an earlier item.
    """
    where = _where()
    if annotation_value is None:
        raise ReferenceError(
            f"{where}: missing; an object labelled {names.CLAIMS_LABEL}={names.TRUE} must list "
            f"its GPU claim references here, e.g. {EXAMPLE}"
        )
    try:
        data = json.loads(
            annotation_value, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants
        )
    except _DuplicateKeyError as error:
        raise ReferenceError(
            f"{where}: the key {_show(error.key)} appears twice in one object; "
            "each key is allowed once"
        ) from None
    except (ValueError, RecursionError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        raise ReferenceError(
            f"{where}: not valid JSON ({reason or 'nested too deeply'}); "
            f"allowed: a JSON list such as {EXAMPLE}"
        ) from None
    if not isinstance(data, list):
        raise ReferenceError(
            f"{where}: must be a JSON list of references, got {_kind(data)}; "
            f"allowed: a list such as {EXAMPLE}"
        )
    if not data:
        raise ReferenceError(
            f"{where}: the list is empty; allowed: 1 to {MAX_REFERENCES} references (a VM "
            f"without GPU claims carries neither this annotation nor the label "
            f"{names.CLAIMS_LABEL})"
        )
    if len(data) > MAX_REFERENCES:
        raise ReferenceError(
            f"{where}: {len(data)} references, at most {MAX_REFERENCES} are allowed"
        )
    refs: list[Reference] = []
    held_at: dict[str, int] = {}
    for index, item in enumerate(data):
        at = _at(index)
        if not isinstance(item, dict):
            raise ReferenceError(
                f"{at}: must be an object with exactly one of {CLAIM_KEY} or {TEMPLATE_KEY}, "
                f"got {_kind(item)}"
            )
        unknown = sorted(set(item) - {CLAIM_KEY, TEMPLATE_KEY})
        if unknown:
            raise ReferenceError(
                f"{at}: unknown key {', '.join(map(_show, unknown))}; "
                f"allowed: {CLAIM_KEY} or {TEMPLATE_KEY}"
            )
        if len(item) != 1:
            got = "both" if item else "neither"
            raise ReferenceError(
                f"{at}: must have exactly one of {CLAIM_KEY} or {TEMPLATE_KEY}, got {got}"
            )
        if TEMPLATE_KEY in item:
            refs.append(_parse_template(at, item[TEMPLATE_KEY]))
            continue
        claim = item[CLAIM_KEY]
        if not _is_dns_label(claim):
            raise ReferenceError(
                f"{at}: {CLAIM_KEY} must be a GPUClaim name ({_DNS_LABEL_TEXT}), got {_show(claim)}"
            )
        if claim in held_at:
            raise ReferenceError(
                f"{at}: {CLAIM_KEY} {claim} is already referenced by item {held_at[claim] + 1}; "
                "each held claim may be referenced once"
            )
        held_at[claim] = index
        refs.append(HeldRef(claim=claim))
    return refs


def dump(refs: Iterable[Reference]) -> str:
    """The annotation value for ``refs`` (compact JSON); ``parse(dump(refs)) == refs`` for
    any list :func:`parse` accepts."""
    items: list[Obj] = [
        {CLAIM_KEY: ref.claim}
        if isinstance(ref, HeldRef)
        else {TEMPLATE_KEY: {CLASS_NAME_KEY: ref.class_name, COUNT_KEY: ref.count}}
        for ref in refs
    ]
    return json.dumps(items, separators=(",", ":"))


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    annotations = _meta(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def has_references(obj: Mapping[str, Any]) -> bool:
    """Whether a VMI or pod carries the label ``gpu.cozystack.io/claims: "true"`` (what the
    webhooks' objectSelectors match). An annotation without the label is ignored by every
    component: KubeVirt does not read it either."""
    return _labels(obj).get(names.CLAIMS_LABEL) == names.TRUE


def from_object(obj: Mapping[str, Any]) -> list[Reference]:
    """:func:`parse` of a VMI's or pod's annotation (raises :class:`ReferenceError`)."""
    value = _annotations(obj).get(names.CLAIMS_ANNOTATION)
    return parse(value if isinstance(value, str) else None)


def held_claims(refs: Iterable[Reference]) -> list[str]:
    """The names of the held claims, in reference order."""
    return [ref.claim for ref in refs if isinstance(ref, HeldRef)]


def claim_names(vmi_name: str, refs: Sequence[Reference]) -> list[str]:
    """Every claim the VMI uses, in reference order: held claims by their name, templates by
    :func:`template_claim_name` (what the placement controller waits on)."""
    return [
        ref.claim if isinstance(ref, HeldRef) else template_claim_name(vmi_name, index)
        for index, ref in enumerate(refs)
    ]


def class_names(refs: Iterable[Reference], claims: Mapping[str, Obj]) -> list[str]:
    """The classes the references use (a held claim's ``spec.className``, a template's
    className), first occurrence first, without repeats. Unknown held claims are skipped."""
    seen: dict[str, None] = {}
    for ref in refs:
        if isinstance(ref, TemplateRef):
            seen.setdefault(ref.class_name)
        elif ref.claim in claims:
            name = orders.ordered_class(claims[ref.claim])
            if name:
                seen.setdefault(name)
    return list(seen)


# -- template claims --------------------------------------------------------------------------


def template_claim_name(vmi_name: str, index: int) -> str:
    """The name of the claim made from the reference at ``index`` (0-based position in the
    annotation list) of the VMI ``vmi_name``: ``<vmi>-gpu-<index>``.

    The name is a valid DNS subdomain of at most :data:`MAX_TEMPLATE_CLAIM_NAME` characters
    (253 less the usage record's ``gpuclaim-`` prefix) for any valid VMI name. When the VMI
    name is too long, it is cut and a stable hash of the whole VMI name is inserted
    (``<cut vmi>-<10 hex of sha256(vmi)>-gpu-<index>``), so distinct (VMI, index) pairs give
    distinct names. The scheme is part of the contract: the template controller finds its
    claims by this name, so changing it would orphan the claims of running VMs.

    The claim carries no VMI name in a label (a VMI name can exceed a label value, DESIGN.md
    §2): it is tied to its VMI by this name and by its controller ownerReference
    (:func:`template_claim`), so garbage collection removes it with the VMI. A claim of this
    name that is not controlled by the VMI's UID (a tenant's own claim, or the claim of an
    earlier VMI of the same name still being collected) is never adopted.
    """
    if not 0 <= index < MAX_REFERENCES:
        raise ValueError(f"index must be from 0 to {MAX_REFERENCES - 1}, got {index}")
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
    meta = _meta(vmi)
    uid = meta.get("uid")
    name = meta.get("name")
    if not uid or not name:
        raise ValueError("a template claim is owned by an existing VMI: it needs a name and uid")
    return {
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": VMI_KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def template_claim(vmi: Mapping[str, Any], index: int, ref: TemplateRef) -> Obj:
    """The GPUClaim the template controller creates for the template reference ``ref`` at
    ``index`` of ``vmi`` (an existing VMI: its UID is needed for the ownerReference).

    In the VMI's namespace, named :func:`template_claim_name`, marked with
    ``gpu.cozystack.io/template-claim: "true"`` (so the order webhook lets it wait for
    capacity), controlled by the VMI (``blockOwnerDeletion``: the creator needs ``update`` on
    ``virtualmachineinstances/finalizers`` where OwnerReferencesPermissionEnforcement is on),
    and ordering ``ref``'s class and count.
    """
    meta = _meta(vmi)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": template_claim_name(str(meta.get("name") or ""), index),
            "namespace": str(meta.get("namespace") or ""),
            "labels": {names.TEMPLATE_CLAIM_LABEL: names.TRUE},
            "ownerReferences": [_vmi_owner(vmi)],
        },
        "spec": {"className": ref.class_name, "count": ref.count},
    }


def template_claims(vmi: Mapping[str, Any], refs: Sequence[Reference]) -> list[Obj]:
    """:func:`template_claim` for every template reference of ``vmi``, in order."""
    return [
        template_claim(vmi, index, ref)
        for index, ref in enumerate(refs)
        if isinstance(ref, TemplateRef)
    ]


def is_template_claim_of(claim: Mapping[str, Any], vmi: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is a marked claim controlled by this very VMI (same UID): the only
    claims the template controller treats as its own."""
    uid = _meta(vmi).get("uid")
    if not uid or not orders.is_template_claim(claim):
        return False
    owner = claims.controlling_vmi(claim)
    return owner is not None and owner.uid == uid


# -- the VMI webhook --------------------------------------------------------------------------


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
    return bool(_meta(obj).get("deletionTimestamp"))


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
        if other == vmi_name or not has_references(live):
            continue
        try:
            refs = from_object(live)
        except ReferenceError:
            continue
        if HeldRef(claim_name) in refs:
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
    if gpuclasses.is_vgpu(cls) and not tenants.vgpu_entitled(namespace):
        refusals.append(
            f"{at}: class {class_name} is a vGPU class; namespace {namespace_name} is not "
            f"entitled to vGPU (allowed only with the namespace label "
            f"{names.VGPU_ENTITLED_LABEL}={names.TRUE})"
        )
    resource = gpuclasses.resource_name(cls)
    if not hostdevices.is_permitted(resource, permitted):
        refusals.append(
            f"{at}: class {class_name} uses {resource or 'no resource'}, which the KubeVirt "
            f"CR's spec.configuration.permittedHostDevices does not permit (permitted: "
            f"{_listed(permitted or ())}); allowed: a class whose resource it lists"
        )
    return refusals


def vmi_refusals(
    vmi: Mapping[str, Any],
    refs: Sequence[Reference],
    *,
    classes: Mapping[str, Obj],
    claims: Mapping[str, Obj],
    live_vmis: Mapping[str, Obj],
    namespace: Mapping[str, Any] | None,
    permitted: frozenset[str] | None,
    gpu_for_vms: bool,
) -> list[str]:
    """Why the VMI webhook refuses ``vmi`` with the parsed ``refs`` (DESIGN.md §5 "VMs"),
    judged without placement; ``[]`` when it is admitted. Every applicable refusal is
    returned, in reference order, each naming the field (``annotation
    gpu.cozystack.io/claims: item N``, ``spec.domain.devices.gpus`` or ``metadata.name``) and
    what is allowed.

    ``classes`` are the GPUClasses by name, ``claims`` the namespace's GPUClaims by name,
    ``live_vmis`` the namespace's VMIs by name (the VMI being created is not among them),
    ``namespace`` the Namespace object (``None``: unknown, not entitled), ``permitted`` the
    KubeVirt table read by :func:`hostdevices.permitted_resources` (``None``: no table), and
    ``gpu_for_vms`` the feature switch.
    """
    if not refs:
        return []
    where = _where()
    if not gpu_for_vms:
        return [
            f"{where}: GPU claim references are switched off on this cluster (operator setting "
            f"gpuForVMs is off); allowed: a VM without the label {names.CLAIMS_LABEL} and "
            "this annotation"
        ]
    meta = _meta(vmi)
    vmi_name = str(meta.get("name") or "")
    namespace_name = str(_meta(namespace).get("name") or meta.get("namespace") or "")
    refusals: list[str] = []
    raw = raw_gpu_entries(vmi)
    if raw:
        shown = _listed(str(e.get("name")) if isinstance(e, Mapping) else _show(e) for e in raw)
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
    if not vmi_name and any(isinstance(ref, HeldRef) for ref in refs):
        refusals.append(
            f"metadata.name: a VM that names held claims in {where} needs a name "
            "(generateName is not supported: the claim records the VM by name); allowed: "
            "metadata.name set"
        )
    for index, ref in enumerate(refs):
        at = _at(index)
        if isinstance(ref, TemplateRef):
            field = f"{at}: {TEMPLATE_KEY}.{CLASS_NAME_KEY}"
            cls = classes.get(ref.class_name)
            if cls is None:
                refusals.append(
                    f"{field}: class {ref.class_name} does not exist (known: "
                    f"{_listed(classes)}); the classes are listed by kubectl get gpuclasses"
                )
                continue
            max_count = gpuclasses.effective_max_count(cls)
            if max_count is not None and ref.count > max_count:
                refusals.append(
                    f"{at}: {TEMPLATE_KEY}.{COUNT_KEY}: class {ref.class_name} allows at most "
                    f"{_plural(max_count, 'GPU', 'GPUs')} per claim, {ref.count} ordered"
                )
            refusals.extend(_class_refusals(field, cls, namespace, namespace_name, permitted))
            continue
        field = f"{at}: {CLAIM_KEY} {ref.claim}"
        claim = claims.get(ref.claim)
        if claim is None:
            refusals.append(
                f"{field}: no such GPUClaim in namespace {namespace_name} (known: "
                f"{_listed(n for n, c in claims.items() if not orders.is_template_claim(c))}"
                "); allowed: a claim you ordered, or a claimTemplate"
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
                f"{field}: the claim is attached to VM {other}, {state}, and a "
                f"claim serves one VM at a time; allowed: a claim no other live VM uses (stop "
                f"{other} first and retry once it is gone, or order another claim)"
            )
        class_name = orders.ordered_class(claim)
        cls = classes.get(class_name)
        if cls is None:
            refusals.append(
                f"{field}: the claim's class {class_name or '(none)'} does not exist; allowed: "
                "a claim of an existing class"
            )
            continue
        refusals.extend(_class_refusals(field, cls, namespace, namespace_name, permitted))
    return refusals


def gpu_entries(
    refs: Sequence[Reference], classes: Mapping[str, Obj], claims: Mapping[str, Obj]
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
        if isinstance(ref, TemplateRef):
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


def json_pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` inside a part are escaped."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def gpus_patch(vmi: Mapping[str, Any], entries: list[Obj]) -> list[Obj]:
    """JSON patch ops that make ``spec.domain.devices.gpus`` exactly ``entries`` (creating
    missing parents); ``[]`` when it already is. The whole list is written, so operator
    entries of an earlier pass are replaced, never doubled."""
    path = ("spec", "domain", "devices", "gpus")
    node: Mapping[str, Any] = vmi
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if not isinstance(child, Mapping):
            value: Any = copy.deepcopy(entries)
            for missing in reversed(path[depth + 1 :]):
                value = {missing: value}
            return [{"op": "add", "path": json_pointer(*path[: depth + 1]), "value": value}]
        node = child
    if node.get(path[-1]) == entries:
        return []
    # "add" on an existing member replaces it (RFC 6902), so one op serves both cases.
    return [{"op": "add", "path": json_pointer(*path), "value": copy.deepcopy(entries)}]


def attachment_patch(vmi_name: str, resource_version: str | None = None) -> Obj:
    """The JSON merge patch (for the claim's ``status`` subresource) that records the
    attachment of a held claim to the VMI ``vmi_name``: ``{vmi: <name>}``.

    No UID is recorded: the VMI webhook runs at CREATE, before the API server assigns the
    VMI's UID (mutating webhooks run first); the claims controller fills ``attachment.uid``
    once the VMI exists, and clears an attachment whose VMI never appeared, was deleted or has
    another UID. A UID left from an earlier VMI is removed (``null`` in a merge patch).
    Given ``resource_version`` (the claim's, as judged by :func:`vmi_refusals`), the patch
    fails with a conflict if the claim changed meanwhile: of two VMIs racing for one claim,
    one gets it.
    """
    patch: Obj = {"status": {"attachment": {"vmi": vmi_name, "uid": None}}}
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch


# -- the pod webhook --------------------------------------------------------------------------


def launcher_pod_kind(pod: Mapping[str, Any]) -> LauncherPodKind:
    """Which pod of a VM with claims this is.

    * ``other``: not a virt-launcher pod (label ``kubevirt.io=virt-launcher``) with the claims
      label — nothing to do;
    * ``migration-target``: a migration target (label ``kubevirt.io/migrationJobUID``) — left
      untouched (KubeVirt renders it afresh and deletes it when it stays pending);
    * ``ephemeral``: KubeVirt's temporary pod for WaitForFirstConsumer volumes (annotation
      ``kubevirt.io/ephemeral-provisioning``; like KubeVirt, its presence decides) — gated and
      pinned like the launcher, so the volume is provisioned on the claims' node;
    * ``launcher``: the VMI's launcher pod — gated, given the class tolerations, then pinned.
    """
    labels = _labels(pod)
    if labels.get(KUBEVIRT_LABEL) != VIRT_LAUNCHER or labels.get(names.CLAIMS_LABEL) != names.TRUE:
        return "other"
    if MIGRATION_LABEL in labels:
        return "migration-target"
    if EPHEMERAL_ANNOTATION in _annotations(pod):
        return "ephemeral"
    return "launcher"


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _gates(pod: Mapping[str, Any]) -> list[Any] | None:
    gates = _spec(pod).get("schedulingGates")
    return gates if isinstance(gates, list) else None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries the placement gate."""
    return any(
        isinstance(g, Mapping) and g.get("name") == names.PLACEMENT_GATE for g in _gates(pod) or []
    )


def gate_patch(pod: Mapping[str, Any]) -> list[Obj]:
    """JSON patch ops adding the scheduling gate ``gpu.cozystack.io/placement`` once: ``[]``
    when the pod already has it (a duplicate gate fails pod validation); the whole list when
    the pod has no ``spec.schedulingGates``."""
    if is_gated(pod):
        return []
    gate = {"name": names.PLACEMENT_GATE}
    if "spec" not in pod or not isinstance(pod.get("spec"), Mapping):
        return [{"op": "add", "path": json_pointer("spec"), "value": {"schedulingGates": [gate]}}]
    if _gates(pod) is None:
        return [{"op": "add", "path": json_pointer("spec", "schedulingGates"), "value": [gate]}]
    return [{"op": "add", "path": json_pointer("spec", "schedulingGates", "-"), "value": gate}]


def _toleration_key(toleration: Mapping[str, Any]) -> tuple[str, str, str, str]:
    operator = str(toleration.get("operator") or "Equal")
    value = "" if operator == "Exists" else str(toleration.get("value") or "")
    return (str(toleration.get("key") or ""), operator, value, str(toleration.get("effect") or ""))


def _pod_toleration(key: tuple[str, str, str, str]) -> Obj:
    name, operator, value, effect = key
    out: Obj = {}
    if name:
        out["key"] = name
    out["operator"] = operator
    if value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def tolerations_patch(pod: Mapping[str, Any], classes: Iterable[Obj]) -> list[Obj]:
    """JSON patch ops adding each toleration of ``classes`` (the classes of the pod's claims)
    that the pod does not carry yet; ``[]`` when it carries them all.

    Tolerations compare by key, operator (default ``Equal``), value (ignored with ``Exists``)
    and effect; a pod toleration with ``tolerationSeconds`` that matches otherwise counts as
    present (adding ours would not change when the taint manager evicts). Repeats across
    classes are added once.
    """
    existing = _spec(pod).get("tolerations")
    present = {_toleration_key(t) for t in existing or [] if isinstance(t, Mapping)}
    adding: list[Obj] = []
    for cls in classes:
        for toleration in gpuclasses.tolerations(cls):
            key = _toleration_key(toleration)
            if key not in present:
                present.add(key)
                adding.append(_pod_toleration(key))
    if not adding:
        return []
    if not isinstance(_spec(pod).get("tolerations"), list):
        if not isinstance(pod.get("spec"), Mapping):
            return [{"op": "add", "path": json_pointer("spec"), "value": {"tolerations": adding}}]
        return [{"op": "add", "path": json_pointer("spec", "tolerations"), "value": adding}]
    return [
        {"op": "add", "path": json_pointer("spec", "tolerations", "-"), "value": toleration}
        for toleration in adding
    ]


# -- the placement controller -----------------------------------------------------------------


def _pin(node_name: str) -> Obj:
    return {"key": NODE_NAME_FIELD, "operator": "In", "values": [node_name]}


def pin_and_ungate(pod: Mapping[str, Any], node_name: str) -> Obj:
    """The placement controller's ONE pod update, as a JSON merge patch body:
    ``{"metadata": {"resourceVersion": ...}, "spec": {"affinity": ..., "schedulingGates":
    ...}}``. It adds a required node affinity on the node's name (``matchFields``
    ``metadata.name In [node_name]``) and removes the placement gate, keeping every other
    gate. The API server accepts the affinity change only while the pod is gated, hence one
    update. The pin names the Node object itself: the ``kubernetes.io/hostname`` label can
    differ from the node's name (a kubelet hostname override, some clouds), and a pin on it
    would match no node at all.

    The pin is merged with the pod's affinity: kube-scheduler ORs ``nodeSelectorTerms`` and
    ANDs the requirements inside a term, and for a gated pod the API server allows only adding
    requirements to existing terms, so the pin is appended to every term's ``matchFields``
    (a term already carrying it is left alone; an empty term, which matches no node, stays
    empty); without terms, one term with the pin is set. The rest of ``spec.affinity`` is
    carried over unchanged.

    Pass the full pod as read from the API server (slim cached pods lack ``affinity``) and
    send the result as ``application/merge-patch+json``, or merge its ``spec`` into the full
    pod for an update: a strategic merge patch would merge ``schedulingGates`` by name and
    keep the gate. ``resourceVersion`` makes a stale update fail with a conflict.
    """
    if not node_name:
        raise ValueError("a pod is pinned to a named node")
    spec = _spec(pod)
    affinity: Obj = copy.deepcopy(dict(spec.get("affinity") or {}))
    node_affinity: Obj = dict(affinity.get("nodeAffinity") or {})
    required: Obj = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms: list[Obj] = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = list(term.get("matchFields") or [])
        if (not fields and not term.get("matchExpressions")) or _pin(node_name) in fields:
            terms.append(term)
        else:
            terms.append({**term, "matchFields": [*fields, _pin(node_name)]})
    if not terms:
        terms = [{"matchFields": [_pin(node_name)]}]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    gates = [
        copy.deepcopy(g)
        for g in _gates(pod) or []
        if not (isinstance(g, Mapping) and g.get("name") == names.PLACEMENT_GATE)
    ]
    patch: Obj = {"spec": {"affinity": affinity, "schedulingGates": gates}}
    resource_version = _meta(pod).get("resourceVersion")
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch


def _pins(requirements: Any, key: str) -> list[str]:
    return [
        str(r["values"][0])
        for r in (requirements if isinstance(requirements, list) else ())
        if isinstance(r, Mapping)
        and r.get("key") == key
        and r.get("operator") == "In"
        and isinstance(r.get("values"), list)
        and len(r["values"]) == 1
    ]


def pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node the pod is pinned to by :func:`pin_and_ungate` (the node every non-empty
    required term pins with ``matchFields`` ``metadata.name In [node]``), ``None`` when it is
    not. A pin on ``kubernetes.io/hostname In [node]``, the form earlier versions wrote, is
    read too, so a pod pinned before an upgrade is still recognised."""
    affinity = _spec(pod).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    nodes: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not expressions and not fields:
            continue
        found = _pins(fields, NODE_NAME_FIELD) + _pins(expressions, HOSTNAME_LABEL)
        if not found:
            return None
        nodes.update(found)
    return nodes.pop() if len(nodes) == 1 else None
