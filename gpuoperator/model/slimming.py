"""Cache transforms: keep only the fields the operator reads.

The operator watches every pod and node of the cluster (GPU use is counted on all of them),
so the caches store these slim copies: at 40,000 pods, full objects would not fit the
operator's memory goal. Extended resources (``domain/name``) are the only quantities kept:
GPU accounting needs nothing else. Pure functions of plain data.
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


def slim_pod(pod: Obj) -> Obj:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    out_spec: Obj = {"containers": [_container(c) for c in spec.get("containers") or []]}
    if spec.get("initContainers"):
        out_spec["initContainers"] = [_container(c) for c in spec["initContainers"]]
    for k in ("nodeName", "schedulingGates", "tolerations"):
        if spec.get(k):
            out_spec[k] = spec[k]
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


def slim_metadata(obj: Obj) -> Obj:
    """Only the metadata (names, labels, ownership): enough for namespaces."""
    return {"metadata": _meta(obj.get("metadata") or {}, annotations=False)}
