"""The over-allocation check: for every node and GPU resource, the units of bound claims
plus the units of other pods on it never exceed what kubelet counts (allocatable)."""

from __future__ import annotations

from collections import defaultdict

import pykube

from gpuoperator.model import pods as podmodel
from gpuoperator.model import slimming
from gpuoperator.runtime.kinds import GPUClaim, GPUClass


def overallocations(api: pykube.HTTPClient) -> list[str]:
    """Each node/resource whose holds and pods exceed its allocatable, described."""
    classes = {c.name: c.obj for c in GPUClass.objects(api)}
    used: dict[tuple[str, str], int] = defaultdict(int)
    for claim in GPUClaim.objects(api).filter(namespace=pykube.all):
        status = claim.obj.get("status") or {}
        cls = classes.get(claim.obj["spec"]["className"])
        if status.get("phase") == "Bound" and cls is not None:
            resource = cls["spec"]["source"]["devicePlugin"]["resourceName"]
            used[(status["nodeName"], resource)] += int(claim.obj["spec"]["count"])
    for pod in pykube.Pod.objects(api).filter(namespace=pykube.all):
        slim = slimming.slim_pod(pod.obj)
        node = slim["spec"].get("nodeName")
        if node:
            for resource, units in podmodel.pod_usage(slim).items():
                used[(node, resource)] += units
    problems = []
    for node in pykube.Node.objects(api):
        allocatable = (node.obj.get("status") or {}).get("allocatable") or {}
        for (name, resource), units in used.items():
            if name == node.name and units > podmodel.parse_count(allocatable.get(resource, 0)):
                problems.append(
                    f"{name} {resource}: {units} used of {allocatable.get(resource, 0)} allocatable"
                )
    return problems
