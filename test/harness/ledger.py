"""The over-allocation check, run after every e2e test: for every node and GPU resource, the
units of bound claims plus the units of the pods no claim accounts for never exceed what
kubelet counts (allocatable). docs/design.md §5 "Capacity" is its only source.

It is an oracle, so it shares no code with the product's pod and capacity model: it reads
the API server's objects and does its own plain arithmetic.

* A pod's units of a resource follow kube-scheduler: the larger of (the regular containers
  plus the restartable init containers, the sidecars) and the peak of each regular init
  container (its own request plus the sidecars started before it), plus the pod overhead. A
  limit stands in for a missing request. Pods in phase Succeeded or Failed use nothing.
* The launcher pods a VMI controls on a node (label ``kubevirt.io=virt-launcher``, no
  migration label, controller ownerReference to a ``kubevirt.io`` VirtualMachineInstance)
  are accounted by that VMI's Bound claims on that node — held claims through
  ``status.attachment.uid``, template claims through their ownerReference — up to the units
  those claims hold; what they use beyond that counts. Every other pod counts in full.
* Budgets: the Bound claims a ResourceQuota's GPU key charges stay within its hard limit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pykube

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass

Obj = dict[str, Any]

_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIXES.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60})


def units(quantity: Any) -> int:
    """A whole-number extended-resource quantity (``"2"``, ``4``, ``"1k"``)."""
    text = str(quantity).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * _SUFFIXES[suffix]
    return int(text)


def container_units(container: Obj, resource: str) -> int:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if resource in requests:
        return units(requests[resource])
    if resource in limits:
        return units(limits[resource])
    return 0


def pod_units(pod: Obj, resource: str) -> int:
    """The units of ``resource`` kube-scheduler counts for the pod."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    spec = pod.get("spec") or {}
    steady = sum(container_units(c, resource) for c in spec.get("containers") or [])
    sidecars = 0
    init_peak = 0
    for init in spec.get("initContainers") or []:
        own = container_units(init, resource)
        if init.get("restartPolicy") == "Always":
            sidecars += own
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + own)
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(steady + sidecars, init_peak) + (units(overhead) if overhead else 0)


def controlling_vmi_uid(obj: Obj) -> str:
    """The UID of the VMI named by the object's controller ownerReference ("" if none)."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if (
            owner.get("controller") is True
            and owner.get("kind") == "VirtualMachineInstance"
            and str(owner.get("apiVersion") or "").startswith("kubevirt.io/")
        ):
            return str(owner.get("uid") or "")
    return ""


def launcher_vmi_uid(pod: Obj) -> str:
    """The VMI UID a launcher pod's units may be accounted to ("" for any other pod); a
    migration target pod is its VMI's pod too."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get("kubevirt.io") != "virt-launcher":
        return ""
    return controlling_vmi_uid(pod)


def migration_job_uid(pod: Obj) -> str:
    """The migration a pod is the target pod of ("" for any other pod)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get("kubevirt.io/migrationJobUID") or "")


def claim_vmi_uid(claim: Obj) -> str:
    """The VMI UID a claim's units account for: its owner's, else its attachment's."""
    owner = controlling_vmi_uid(claim)
    if owner:
        return owner
    return str(((claim.get("status") or {}).get("attachment") or {}).get("uid") or "")


def _plugin_resource(cls: Obj) -> str | None:
    """A device-plugin class's resource; ``None`` for a DRA class, whose holds are
    ResourceClaim allocations that kube-scheduler itself enforces (no units to count)."""
    plugin = cls["spec"]["source"].get("devicePlugin")
    return str(plugin["resourceName"]) if plugin else None


def used_units(
    claims: list[Obj], classes: dict[str, Obj], pods: list[Obj]
) -> dict[tuple[str, str], int]:
    """(node, resource) → units held by Bound claims (on their node, and on the target node
    of a transient hold, ``status.migration``) plus units of pods no hold accounts for: a
    claim's hold covers its VMI's pods on its node, a transient hold only the target pods of
    its migration (``kubevirt.io/migrationJobUID``) on its target node."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    #: (node, resource, namespace, VMI uid, migration uid or "" for any pod) → units covered
    cover: dict[tuple[str, str, str, str, str], int] = defaultdict(int)
    for claim in claims:
        status = claim.get("status") or {}
        cls = classes.get(claim["spec"]["className"])
        if status.get("phase") != "Bound" or not status.get("nodeName") or cls is None:
            continue
        resource = _plugin_resource(cls)
        if resource is None:
            continue
        count = int(claim["spec"]["count"])
        uid = claim_vmi_uid(claim)
        ns = claim["metadata"]["namespace"]
        places = [(status["nodeName"], "")]
        migration = status.get("migration") or {}
        if migration.get("uid") and migration.get("targetNode"):
            places.append((migration["targetNode"], migration["uid"]))
        for node, job in places:
            used[(node, resource)] += count
            if uid:
                cover[(node, resource, ns, uid, job)] += count
    resources = {r for r in map(_plugin_resource, classes.values()) if r is not None}
    #: (node, resource, namespace, VMI uid) → migration uid ("" none) → units its pods use
    launched: dict[tuple[str, str, str, str], dict[str, int]] = defaultdict(
        lambda: defaultdict(int)
    )
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        uid = launcher_vmi_uid(pod)
        for resource in resources:
            n = pod_units(pod, resource)
            if not n:
                continue
            if uid:
                launched[(node, resource, pod["metadata"]["namespace"], uid)][
                    migration_job_uid(pod)
                ] += n
            else:
                used[(node, resource)] += n
    for (node, resource, namespace, uid), by_job in launched.items():
        total = sum(by_job.values())
        by_transient = sum(
            min(n, cover[(node, resource, namespace, uid, job)]) for job, n in by_job.items() if job
        )
        covered = min(total, cover[(node, resource, namespace, uid, "")] + by_transient)
        used[(node, resource)] += total - covered
    return used


def overbudgets(claims: list[Obj], quotas: list[Obj]) -> list[str]:
    """Every budget the Bound claims overrun, described: for each ResourceQuota and each of
    its GPU keys (``gpuclass.cozystack.io/devices`` for all classes,
    ``<class>.gpuclass.cozystack.io/devices`` for one), the units of the namespace's Bound
    claims it charges (a claim being deleted included, until it is gone) are at most its hard
    limit (docs/design.md §3)."""
    out = []
    for quota in quotas:
        meta = quota.get("metadata") or {}
        ns = meta.get("namespace")
        bound = [
            c
            for c in claims
            if (c.get("metadata") or {}).get("namespace") == ns
            and (c.get("status") or {}).get("phase") == "Bound"
        ]
        for key, hard in sorted(((quota.get("spec") or {}).get("hard") or {}).items()):
            if key == names.QUOTA_TOTAL_KEY:
                charged = bound
            elif key.endswith("." + names.QUOTA_TOTAL_KEY):
                class_name = key.removesuffix("." + names.QUOTA_TOTAL_KEY)
                charged = [c for c in bound if c["spec"].get("className") == class_name]
            else:
                continue
            held = sum(int(c["spec"].get("count") or 0) for c in charged)
            if held > units(hard):
                out.append(f"{ns}/{meta.get('name')} {key}: {held} bound of {hard}")
    return out


def overallocations(api: pykube.HTTPClient) -> list[str]:
    """Each node/resource whose holds and pods exceed its allocatable, and each budget its
    Bound claims exceed, described."""
    classes = {c.name: c.obj for c in GPUClass.objects(api)}
    claims = [c.obj for c in GPUClaim.objects(api).filter(namespace=pykube.all)]
    pods = [p.obj for p in pykube.Pod.objects(api).filter(namespace=pykube.all)]
    quotas = [q.obj for q in pykube.ResourceQuota.objects(api).filter(namespace=pykube.all)]
    used = used_units(claims, classes, pods)
    problems = overbudgets(claims, quotas)
    for node in pykube.Node.objects(api):
        allocatable = (node.obj.get("status") or {}).get("allocatable") or {}
        for (name, resource), n in sorted(used.items()):
            if name == node.name and n > units(allocatable.get(resource, 0)):
                problems.append(
                    f"{name} {resource}: {n} used of {allocatable.get(resource, 0)} allocatable"
                )
    return problems
