"""Cache transforms: keep only the fields the operator reads.

The operator watches every pod and node of the cluster (GPU use is counted on all of them),
so the caches store these slim copies: at 40,000 pods, full objects would not fit the
operator's memory goal. Extended resources (``domain/name``) are the only quantities kept:
GPU accounting needs nothing else. Pure functions of plain data.

**Most pods are kept as a stub.** A pod that requests no extended resource (in any
container, init container or its overhead, as a request or a limit), carries no KubeVirt
label (``kubevirt.io``: launcher and temporary pods, which placement reads) and no
scheduling gate uses no GPU unit and is nothing any controller acts on: the cache keeps
only its name, namespace, uid, resourceVersion, deletionTimestamp, ``spec.nodeName`` and
``status.phase``. That is enough for every reader: capacity counts its use as nothing
(``model.pods.requests`` of a stub is empty, as of the full pod), the node index still
finds it, and an update that gives it a GPU request cannot happen (container resources are
immutable; a resize of an extended resource is refused too), so a stub never hides a
change capacity would need. At 40,000 pods of which a few hundred use GPUs, this is most of
the operator's memory.

**VMIs and GPUClaims are made by tenants**, who can give them any number of labels,
annotations, finalizers and ownerReferences, and a VMI any spec, up to the API server's
object size: cached whole, a tenant's objects would grow the operator's memory without bound
(and the webhooks fail closed when it dies). :func:`slim_vmi` and :func:`slim_claim` keep
only what a reader uses, and bound what the tenant still controls there:

* a label, annotation or finalizer is kept only when it is one a reader looks up by name;
* a string a tenant chooses is cut just past the longest value that can be valid
  (:func:`clip`), so it still compares equal to exactly the valid names it equalled, and
  is still refused by every length check that refused it (the claims annotation is refused
  above ``references.MAX_ANNOTATION_LENGTH`` characters, with a message that does not
  depend on how far above);
* device lists keep at most :data:`MAX_DEVICE_ENTRIES` entries, the most the VMI webhook
  writes, each with only its names.
"""

from __future__ import annotations

from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import quantities, references

Obj = dict[str, Any]

#: The longest DNS label (names of claims, classes, device entries, requests).
MAX_LABEL: Final = 63
#: The longest DNS subdomain (object names, node names).
MAX_SUBDOMAIN: Final = 253
#: The longest qualified name with a prefix (``domain/name``: resource names, kinds' groups).
MAX_QUALIFIED: Final = MAX_SUBDOMAIN + 1 + MAX_LABEL
#: Entries kept of a VMI's ``gpus`` and of its ``hostDevices``: the most the VMI webhook
#: writes (one per unit, at most 16 references of at most 64 units).
MAX_DEVICE_ENTRIES: Final = references.MAX_REFERENCES * references.MAX_TEMPLATE_COUNT

_KEEP_ANNOTATION_PREFIXES = (names.DOMAIN + "/", names.KUBEVIRT_GROUP + "/")


def _extended(resources: Any) -> dict[str, str]:
    if not isinstance(resources, dict):
        return {}
    return {k: str(v) for k, v in resources.items() if quantities.is_extended(k)}


def _meta(meta: Obj, *, annotations: bool) -> Obj:
    out: Obj = {
        k: meta[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
        )
        if k in meta
    }
    if meta.get("labels"):
        out["labels"] = meta["labels"]
    if annotations:
        kept = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if k.startswith(_KEEP_ANNOTATION_PREFIXES)
        }
        if kept:
            out["annotations"] = kept
    owners = [
        {k: o[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in o}
        for o in meta.get("ownerReferences") or []
        if o.get("controller")
    ]
    if owners:
        out["ownerReferences"] = owners
    return out


def _container(c: Obj) -> Obj:
    out: Obj = {"name": c.get("name", "")}
    requests = _extended(quantities.requested(c.get("resources")))
    if requests:
        out["resources"] = {"requests": requests}
    if c.get("restartPolicy"):
        out["restartPolicy"] = c["restartPolicy"]
    return out


_STUB_META = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def _uses_extended(spec: Obj) -> bool:
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or []:
            resources = c.get("resources") or {} if isinstance(c, dict) else {}
            if _extended(resources.get("requests")) or _extended(resources.get("limits")):
                return True
    return bool(_extended(spec.get("overhead")))


def needs_full_pod(pod: Obj) -> bool:
    """Whether a reader may need more of ``pod`` than the stub (module docstring)."""
    spec = pod.get("spec") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        "kubevirt.io" in labels
        or names.CLAIMS_LABEL in labels
        or bool(spec.get("schedulingGates"))
        or _uses_extended(spec)
    )


def slim_pod(pod: Obj) -> Obj:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not needs_full_pod(pod):
        meta = pod.get("metadata") or {}
        stub: Obj = {
            "metadata": {k: meta[k] for k in _STUB_META if k in meta},
            "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
            "status": {"phase": status["phase"]} if status.get("phase") else {},
        }
        return stub
    out_spec: Obj = {"containers": [_container(c) for c in spec.get("containers") or []]}
    if spec.get("initContainers"):
        out_spec["initContainers"] = [_container(c) for c in spec["initContainers"]]
    for k in ("nodeName", "schedulingGates", "tolerations"):
        if spec.get(k):
            out_spec[k] = spec[k]
    if spec.get("schedulingGates") and spec.get("affinity"):
        # A gated pod keeps its affinity: the placement controller builds its one pin
        # update from the cached pod (``launcher_pods.pin_and_ungate``). Gated pods are few
        # and short-lived; once ungated the affinity is dropped again.
        out_spec["affinity"] = spec["affinity"]
    overhead = _extended(spec.get("overhead"))
    if overhead:
        out_spec["overhead"] = overhead
    out_status: Obj = {}
    if status.get("phase"):
        out_status["phase"] = status["phase"]
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    if scheduled:
        out_status["conditions"] = [
            {k: v for k, v in scheduled[0].items() if k in ("type", "status", "reason", "message")}
        ]
    return {
        "metadata": _meta(pod.get("metadata") or {}, annotations=True),
        "spec": out_spec,
        "status": out_status,
    }


def slim_node(node: Obj) -> Obj:
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    out_spec: Obj = {}
    if spec.get("unschedulable"):
        out_spec["unschedulable"] = True
    if spec.get("taints"):
        out_spec["taints"] = spec["taints"]
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": _meta(node.get("metadata") or {}, annotations=False),
        "spec": out_spec,
        "status": {
            "capacity": _extended(status.get("capacity")),
            "allocatable": _extended(status.get("allocatable")),
            "conditions": [
                {k: v for k, v in ready[0].items() if k in ("type", "status", "reason", "message")}
            ]
            if ready
            else [],
        },
    }


def without_managed_fields(obj: Obj) -> Obj:
    """The object without ``metadata.managedFields`` (server-side apply's bookkeeping,
    often larger than the object itself and read by nobody here). A write of the result
    keeps them: an update that carries no managedFields leaves the server's as they are."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def slim_metadata(obj: Obj) -> Obj:
    """Only the metadata (names, labels, ownership): enough for namespaces."""
    return {"metadata": _meta(obj.get("metadata") or {}, annotations=False)}


def clip(value: Any, limit: int) -> Any:
    """``value`` cut to ``limit + 1`` characters when it is a longer string (anything else
    as it is). A cut value is still longer than ``limit``, so it equals no string of at most
    ``limit`` characters and fails every check of "at most ``limit``" as the whole did."""
    return value[: limit + 1] if isinstance(value, str) and len(value) > limit else value


def _picked(meta: Obj, key: str, wanted: tuple[str, ...]) -> Obj:
    found = meta.get(key)
    if not isinstance(found, dict):
        return {}
    return {k: found[k] for k in wanted if k in found}


_TENANT_META = ("name", "namespace", "uid", "resourceVersion", "generation")
_TIMESTAMPS = ("creationTimestamp", "deletionTimestamp")
_OWNER_LIMITS = (
    ("apiVersion", MAX_QUALIFIED),
    ("kind", MAX_LABEL),
    ("name", MAX_SUBDOMAIN),
    ("uid", MAX_LABEL),
)


def _tenant_meta(
    meta: Any, *, labels: tuple[str, ...], annotations: tuple[str, ...], finalizers: tuple[str, ...]
) -> Obj:
    """The metadata of an object a tenant writes: the API server's own fields, the named
    labels, annotations and finalizers, and the controller ownerReference, clipped."""
    if not isinstance(meta, dict):
        return {}
    out: Obj = {k: meta[k] for k in (*_TENANT_META, *_TIMESTAMPS) if k in meta}
    for key, wanted in (("labels", labels), ("annotations", annotations)):
        picked = {
            k: clip(v, references.MAX_ANNOTATION_LENGTH)
            for k, v in _picked(meta, key, wanted).items()
        }
        if picked:
            out[key] = picked
    present = meta.get("finalizers")
    kept = [f for f in finalizers if isinstance(present, list) and f in present]
    if kept:
        out["finalizers"] = kept
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("controller") is True:
            # The API server allows one controller reference: the first is the one.
            ref: Obj = {k: clip(owner[k], limit) for k, limit in _OWNER_LIMITS if k in owner}
            out["ownerReferences"] = [{**ref, "controller": True}]
            break
    return out


def _type(obj: Obj) -> Obj:
    """``apiVersion`` and ``kind``, when the object carries them (the API server sets both)."""
    return {k: obj[k] for k in ("apiVersion", "kind") if k in obj}


_DEVICE_FIELDS = (
    ("name", MAX_LABEL),
    ("deviceName", MAX_QUALIFIED),
    ("claimName", MAX_LABEL),
    ("requestName", MAX_LABEL),
)


#: The fields of a VMI's ``spec.resourceClaims`` entries kept (a pod's claim name is a DNS
#: label, the ResourceClaim's a subdomain).
_RESOURCE_CLAIM_FIELDS: Final = (("name", MAX_LABEL), ("resourceClaimName", MAX_SUBDOMAIN))
#: What the migrations controller reads of a VMI's ``status.migrationState``.
_MIGRATION_STATE_FIELDS: Final = (
    ("migrationUid", MAX_LABEL),
    ("targetNode", MAX_SUBDOMAIN),
    ("sourceNode", MAX_SUBDOMAIN),
    ("completed", 0),
    ("failed", 0),
    ("abortStatus", MAX_LABEL),
)


def _devices(entries: Any) -> list[Obj]:
    if not isinstance(entries, list):
        return []
    return [
        {k: clip(e[k], limit) for k, limit in _DEVICE_FIELDS if k in e}
        for e in entries[:MAX_DEVICE_ENTRIES]
        if isinstance(e, dict)
    ]


def slim_vmi(vmi: Obj) -> Obj:
    """What the operator reads of a VirtualMachineInstance (see the module docstring).

    Metadata: names, uid, resourceVersion, generation, creation and deletion timestamps, the
    claims label and annotation, the ``foregroundDeletion`` finalizer (claim protection), the
    controller ownerReference. Spec: the ``gpus`` and ``hostDevices`` entries (name,
    deviceName, claimName, requestName) and the ``resourceClaims`` entries (name,
    resourceClaimName: the template controller compares them with what the VMI webhook
    writes for a claim of a DRA class) and ``evictionStrategy`` (a drain live-migrates a VM
    whose strategy is ``LiveMigrate``). Status: phase, nodeName and of ``migrationState``
    what the migrations controller reads (``model.migrations.migration_state``)."""
    meta = _tenant_meta(
        vmi.get("metadata"),
        labels=(names.CLAIMS_LABEL,),
        annotations=(names.CLAIMS_ANNOTATION,),
        finalizers=(names.FOREGROUND_DELETION_FINALIZER,),
    )
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, dict) else None
    found = domain.get("devices") if isinstance(domain, dict) else None
    devices: Obj = {}
    for key in ("gpus", "hostDevices"):
        if isinstance(found, dict) and key in found:
            devices[key] = _devices(found[key])
    out_spec: Obj = {"domain": {"devices": devices}} if devices else {}
    claims = spec.get("resourceClaims") if isinstance(spec, dict) else None
    if isinstance(claims, list):
        out_spec["resourceClaims"] = [
            {k: clip(e[k], limit) for k, limit in _RESOURCE_CLAIM_FIELDS if k in e}
            for e in claims[:MAX_DEVICE_ENTRIES]
            if isinstance(e, dict)
        ]
    strategy = spec.get("evictionStrategy") if isinstance(spec, dict) else None
    if isinstance(strategy, str):
        out_spec["evictionStrategy"] = clip(strategy, MAX_LABEL)
    status = vmi.get("status")
    out_status: Obj = {}
    for key, limit in (("phase", MAX_LABEL), ("nodeName", MAX_SUBDOMAIN)):
        if isinstance(status, dict) and key in status:
            out_status[key] = clip(status[key], limit)
    state = status.get("migrationState") if isinstance(status, dict) else None
    if isinstance(state, dict):
        out_status["migrationState"] = {
            k: clip(state[k], limit) if isinstance(state[k], str) else state[k]
            for k, limit in _MIGRATION_STATE_FIELDS
            if k in state and isinstance(state[k], str | bool)
        }
    return {
        **_type(vmi),
        "metadata": meta,
        "spec": out_spec,
        "status": out_status,
    }


def slim_claim(claim: Obj) -> Obj:
    """What the operator reads of a GPUClaim (see the module docstring).

    Metadata: names, uid, resourceVersion, generation, creation and deletion timestamps, the
    template-claim label, the claim-protection finalizer, the controller ownerReference.
    Spec: className and count (the only fields the schema has). Status: whole; only the
    operator writes it (tenants may read it), and the schema bounds every part of it."""
    meta = _tenant_meta(
        claim.get("metadata"),
        labels=(names.TEMPLATE_CLAIM_LABEL,),
        annotations=(),
        finalizers=(names.CLAIM_PROTECTION_FINALIZER,),
    )
    spec = claim.get("spec")
    out_spec: Obj = {}
    if isinstance(spec, dict):
        if "className" in spec:
            out_spec["className"] = clip(spec["className"], MAX_LABEL)
        if "count" in spec and not isinstance(spec["count"], dict | list | str):
            out_spec["count"] = spec["count"]
    out: Obj = {**_type(claim), "metadata": meta, "spec": out_spec}
    if "status" in claim:
        out["status"] = claim["status"]
    return out


#: The most allocation results a ResourceClaim carries (Kubernetes'
#: ``AllocationResultsMaxSize``); more are never kept.
MAX_ALLOCATION_RESULTS: Final = 32
_RESULT_FIELDS = (
    ("request", MAX_QUALIFIED),
    ("driver", MAX_SUBDOMAIN),
    ("pool", MAX_QUALIFIED),
    ("device", MAX_LABEL),
)


def _node_names(selector: Any) -> list[str]:
    """The node names an allocation's node selector names by ``metadata.name`` (the one
    shape an outside allocator writes), at most one per term."""
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, dict) else None
    found: list[str] = []
    for term in (terms if isinstance(terms, list) else [])[:MAX_ALLOCATION_RESULTS]:
        fields = term.get("matchFields") if isinstance(term, dict) else None
        for field in (fields if isinstance(fields, list) else [])[:1]:
            values = field.get("values") if isinstance(field, dict) else None
            if (
                isinstance(field, dict)
                and field.get("key") == "metadata.name"
                and field.get("operator") == "In"
                and isinstance(values, list)
            ):
                found.extend(clip(str(v), MAX_SUBDOMAIN) for v in values[:1])
    return found


def slim_resource_claim(claim: Obj) -> Obj:
    """What the operator reads of a ResourceClaim (``resource.k8s.io/v1``; tenants make
    them, so bounded as :func:`slim_claim` is).

    Metadata: names, uid, resourceVersion, generation, timestamps, the hold label
    (:data:`names.DRA_HOLD_LABEL`), the controller ownerReference. Status: the allocation's
    results (``request``, ``driver``, ``pool``, ``device``; at most
    :data:`MAX_ALLOCATION_RESULTS`), its ``allocationTimestamp`` and the nodes its node
    selector names by ``metadata.name`` (kept in that shape). The spec is not read: what a
    claim holds is its allocation, whoever wrote it."""
    meta = _tenant_meta(
        claim.get("metadata"), labels=(names.DRA_HOLD_LABEL,), annotations=(), finalizers=()
    )
    out: Obj = {**_type(claim), "metadata": meta}
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    if not isinstance(allocation, dict):
        return out
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, dict) else None
    kept: Obj = {
        "devices": {
            "results": [
                {k: clip(r[k], limit) for k, limit in _RESULT_FIELDS if k in r}
                for r in (results if isinstance(results, list) else [])[:MAX_ALLOCATION_RESULTS]
                if isinstance(r, dict)
            ]
        }
    }
    if isinstance(allocation.get("allocationTimestamp"), str):
        kept["allocationTimestamp"] = clip(allocation["allocationTimestamp"], MAX_LABEL)
    nodes = _node_names(allocation.get("nodeSelector"))
    if nodes:
        kept["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                for n in nodes
            ]
        }
    out["status"] = {"allocation": kept}
    return out
