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
"""

from __future__ import annotations

from typing import Any

from gpuoperator import names
from gpuoperator.model import quantities

Obj = dict[str, Any]

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
