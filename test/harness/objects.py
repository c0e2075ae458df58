"""Builders of the objects unit tests feed the operator: GPUClasses, GPUClaims, Nodes, pods,
VMIs, namespaces, ResourceQuotas, Secrets and admission requests.

Each builder makes the smallest object the operator reads, with keyword arguments for the
variations tests need; an argument left out leaves its field out (``rv=None``: no
resourceVersion), so a test's object holds only what the test says.
"""

from __future__ import annotations

import json
from typing import Any

from gpuoperator import names
from gpuoperator.runtime import admitting

Obj = dict[str, Any]

NS = "tenant-a"
A10 = "nvidia.com/GA102GL_A10"
VMI_API_VERSION = "kubevirt.io/v1"
T0 = "2026-01-01T00:00:00Z"
#: The claim template a VMI built by :func:`vmi` carries by default.
TEMPLATE: Obj = {"className": "a10", "count": 2}


def _meta(
    name: str,
    namespace: str | None = None,
    *,
    uid: str | None = None,
    rv: str | int | None = None,
    generation: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    owners: list[Obj] | None = None,
    created: str | None = None,
    deleting: bool = False,
) -> Obj:
    meta: Obj = {"name": name}
    optional: dict[str, Any] = {
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": None if rv is None else str(rv),
        "generation": generation,
        "labels": None if labels is None else dict(labels),
        "annotations": None if annotations is None else dict(annotations),
        "finalizers": None if finalizers is None else list(finalizers),
        "ownerReferences": None if owners is None else [dict(o) for o in owners],
        "creationTimestamp": created,
        "deletionTimestamp": T0 if deleting else None,
    }
    meta.update({k: v for k, v in optional.items() if v is not None})
    return meta


def owner(name: str = "vm1", uid: str = "uid-vm1", *, kind: str = "VirtualMachineInstance") -> Obj:
    """A controller ownerReference (by default to a VMI)."""
    api_version = VMI_API_VERSION if kind == "VirtualMachineInstance" else names.API_VERSION
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def gpuclass(
    name: str = "a10",
    *,
    mode: str = "passthrough",
    resource: str = A10,
    tolerations: list[Obj] | None = None,
    status: Obj | None = None,
    deleting: bool = False,
    finalizers: list[str] | None = None,
    generation: int | None = None,
    rv: str | int | None = None,
    **spec: Any,
) -> Obj:
    """A GPUClass on a device-plugin resource; ``spec`` adds fields (``maxCount``,
    ``profile``, ``license``, ``vendor`` …)."""
    body: Obj = {"mode": mode, "source": {"devicePlugin": {"resourceName": resource}}}
    if tolerations is not None:
        body["tolerations"] = tolerations
    body.update(spec)
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLASS,
        "metadata": _meta(
            name, finalizers=finalizers, deleting=deleting, generation=generation, rv=rv
        ),
        "spec": body,
    }
    if status is not None:
        obj["status"] = status
    return obj


def claim(
    name: str = "hold",
    *,
    namespace: str = NS,
    class_name: str = "a10",
    count: int = 1,
    phase: str | None = None,
    node: str | None = None,
    attached: Obj | None = None,
    owner_uid: str | None = None,
    owners: list[Obj] | None = None,
    rv: str | int | None = None,
    uid: str | None = None,
    generation: int | None = None,
    created: str | None = None,
    finalizers: list[str] | None = None,
    labels: dict[str, str] | None = None,
    deleting: bool = False,
    status: Obj | None = None,
) -> Obj:
    """A GPUClaim; ``owner_uid`` makes it a template claim owned by VMI ``vm1`` (``owners``
    sets the ownerReferences as they are); ``phase``,
    ``node`` and ``attached`` (``{"vmi": …, "uid": …}``) fill its status, ``status`` adds
    to it (no status at all when none of them is given, an empty one with ``status={}``)."""
    if owner_uid is not None:
        labels = {**(labels or {}), names.TEMPLATE_CLAIM_LABEL: names.TRUE}
        owners = [owner("vm1", owner_uid)]
    body: Obj = dict(status or {})
    if phase:
        body["phase"] = phase
    if node:
        body["nodeName"] = node
    if attached is not None:
        body["attachment"] = attached
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": _meta(
            name,
            namespace,
            uid=uid,
            rv=rv,
            generation=generation,
            labels=labels,
            finalizers=finalizers,
            owners=owners,
            created=created,
            deleting=deleting,
        ),
        "spec": {"className": class_name, "count": count},
    }
    if body or status is not None:
        obj["status"] = body
    return obj


def node(
    name: str = "n1",
    units: int | dict[str, int] = 4,
    *,
    ready: bool | str | None = True,
    cordoned: bool = False,
    taints: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    uid: str | None = None,
    capacity: dict[str, int] | None = None,
) -> Obj:
    """A Node whose kubelet reports ``units`` of A10 (or ``{resource: units}``) allocatable,
    and as capacity unless ``capacity`` says otherwise; its Ready condition is ``ready``
    (a status string as written, None: no Ready condition)."""
    counts = units if isinstance(units, dict) else {A10: units}
    total = counts if capacity is None else capacity
    status = ready if isinstance(ready, str) else ("True" if ready else "False")
    spec: Obj = {}
    if cordoned:
        spec["unschedulable"] = True
    if taints is not None:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _meta(name, labels=labels, uid=uid),
        "spec": spec,
        "status": {
            "capacity": {r: str(n) for r, n in total.items()},
            "allocatable": {r: str(n) for r, n in counts.items()},
            "conditions": [] if ready is None else [{"type": "Ready", "status": status}],
        },
    }


def vmi(
    name: str = "vm1",
    *,
    namespace: str = NS,
    uid: str | None = "uid-vm1",
    refs: list[Obj] | str | None = None,
    deleting: bool = False,
    phase: str | None = None,
    rv: str | int | None = "7",
    devices: Obj | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A VMI with the claim references ``refs`` (annotation and label; none: no GPU; a
    string is the annotation as written), ``spec.domain.devices`` when ``devices``, and
    other ``labels`` and ``annotations``."""
    if refs is not None:
        labels = {**(labels or {}), names.CLAIMS_LABEL: names.TRUE}
        text = refs if isinstance(refs, str) else json.dumps(refs)
        annotations = {**(annotations or {}), names.CLAIMS_ANNOTATION: text}
    obj: Obj = {
        "apiVersion": VMI_API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": _meta(
            name,
            namespace,
            uid=uid,
            rv=rv,
            labels=labels,
            annotations=annotations,
            deleting=deleting,
        ),
        "spec": {} if devices is None else {"domain": {"devices": devices}},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def pod(
    name: str = "p",
    *,
    namespace: str = NS,
    node_name: str | None = None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[Obj] | None = None,
    uid: str | None = None,
    rv: str | int | None = None,
    containers: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    """A pod with one container ``compute`` asking ``requests`` / ``limits`` (or the
    ``containers`` given)."""
    resources: Obj = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    container: Obj = {"name": "compute"}
    if resources:
        container["resources"] = resources
    body: Obj = {"containers": [container] if containers is None else containers, **spec}
    if node_name is not None:
        body["nodeName"] = node_name
    obj: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(
            name,
            namespace,
            uid=uid,
            rv=rv,
            labels=labels,
            annotations=annotations,
            owners=owners,
        ),
        "spec": body,
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def launcher_pod(
    name: str = "virt-launcher-vm1-abcde",
    *,
    namespace: str = NS,
    vmi_name: str = "vm1",
    vmi_uid: str = "uid-vm1",
    refs: list[Obj] | None = None,
    units: int = 3,
    resource: str = A10,
    gated: bool = True,
    pinned_to: str | None = None,
    unschedulable: bool = False,
    migration: bool = False,
) -> Obj:
    """A VMI's virt-launcher pod as KubeVirt makes it, Pending: owned by the VMI, carrying
    its claim references, asking ``units`` of ``resource``; ``gated`` behind the placement
    gate (and another), ``pinned_to`` a node by required affinity, ``unschedulable`` as the
    scheduler reports it, ``migration`` a migration target."""
    refs = refs if refs is not None else [{"claim": "hold-a"}, {"claimTemplate": TEMPLATE}]
    labels = {
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": vmi_uid,
        "vm.kubevirt.io/name": vmi_name,
        names.CLAIMS_LABEL: names.TRUE,
    }
    if migration:
        labels["kubevirt.io/migrationJobUID"] = "mig-1"
    spec: Obj = {
        "containers": [
            {
                "name": "compute",
                "resources": {
                    "requests": {resource: str(units), "cpu": "1"},
                    "limits": {resource: str(units)},
                },
            }
        ],
        "affinity": {
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        },
    }
    if gated:
        spec["schedulingGates"] = [
            {"name": "other.example.com/gate"},
            {"name": names.PLACEMENT_GATE},
        ]
    if pinned_to:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [pinned_to]}
        spec["affinity"]["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
        }
    reason = "Unschedulable" if unschedulable else "SchedulingGated"
    message = f"0/2 nodes are available: 1 Insufficient {resource}" if unschedulable else ""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(
            name,
            namespace,
            uid=f"uid-{name}",
            labels=labels,
            annotations={names.CLAIMS_ANNOTATION: json.dumps(refs)},
            owners=[owner(vmi_name, vmi_uid)],
        ),
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": T0,
                }
            ],
        },
    }


def namespace(
    name: str = NS, *, labels: dict[str, str] | None = None, entitled: bool = False
) -> Obj:
    """A Namespace; ``entitled`` labels it for vGPU classes."""
    if entitled:
        labels = {**(labels or {}), names.VGPU_ENTITLED_LABEL: names.TRUE}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, labels=labels)}


def quota(hard: dict[str, str], *, name: str = "gpus", namespace: str = NS) -> Obj:
    """A ResourceQuota with ``spec.hard``."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(name, namespace),
        "spec": {"hard": hard},
    }


def secret(
    name: str,
    namespace: str,
    *,
    data: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    uid: str | None = None,
    rv: str | int | None = None,
    type_: str = "Opaque",
) -> Obj:
    """A Secret (``data`` already base64)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, namespace, uid=uid, rv=rv, labels=labels, annotations=annotations),
        "type": type_,
        "data": dict(data or {}),
    }


def admission_request(
    obj: Obj,
    *,
    kind: str,
    group: str = "",
    version: str = "v1",
    operation: str = "CREATE",
    namespace: str = NS,
    dry_run: bool = False,
    old: Obj | None = None,
    user: str = "tenant",
) -> admitting.AdmissionRequest:
    """The request an AdmissionReview v1 carrying ``obj`` parses into."""
    request: Obj = {
        "uid": "7f0c9a52-3c1e-4d7e-9d6b-1f2e3d4c5b6a",
        "kind": {"group": group, "version": version, "kind": kind},
        "operation": operation,
        "namespace": namespace,
        "name": (obj.get("metadata") or {}).get("name", ""),
        "object": obj,
        "oldObject": old,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "dryRun": dry_run,
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return admitting.parse(json.dumps(review).encode())


#: The DRA driver of the unit tests' ResourceSlices (the e2e driver stand-in's domain).
DRA_DRIVER = "gpu.example.com"


def resource_slice(node: str, devices: dict[str, Obj]) -> Obj:
    """A node-local ResourceSlice of :data:`DRA_DRIVER`, pool named after the node at
    generation 1, complete in one slice; ``devices`` maps a device name to its attributes
    (as DRA writes them: ``{"pcieRoot": {"string": "r0"}}``)."""
    return {
        "metadata": {"name": f"{node}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": name, "attributes": attrs} for name, attrs in devices.items()],
        },
    }


def vmim(
    name: str = "mig1",
    *,
    namespace: str = NS,
    vmi_name: str = "vm1",
    uid: str = "uid-mig1",
    phase: str | None = None,
    rv: str | int | None = "3",
    deleting: bool = False,
) -> Obj:
    """A VirtualMachineInstanceMigration of VMI ``vmi_name`` in ``phase``."""
    obj: Obj = {
        "apiVersion": VMI_API_VERSION,
        "kind": names.VMIM_KIND,
        "metadata": _meta(name, namespace, uid=uid, rv=rv, deleting=deleting),
        "spec": {"vmiName": vmi_name},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def migration_state(
    uid: str = "uid-mig1",
    target: str = "n2",
    *,
    source: str = "n1",
    completed: bool = False,
    failed: bool = False,
    aborted: bool = False,
) -> Obj:
    """A VMI's ``status.migrationState`` as virt-controller writes it."""
    state: Obj = {"migrationUid": uid, "targetNode": target, "sourceNode": source}
    if completed:
        state["completed"] = True
    if failed:
        state["failed"] = True
    if aborted:
        state["abortStatus"] = "Succeeded"
    return state
