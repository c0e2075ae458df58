"""Simulated node profiles: which nodes the local cluster has and what GPUs they carry.

A profile is a YAML file::

    nodes:
      - name: a10-{i}            # {i} becomes 0..count-1
        count: 2
        resources: {nvidia.com/GA102GL_A10: 8}
        labels: {nvidia.com/gpu.product: A10}
        taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
      - name: dra-a10-{i}        # GPUs served by DRA: the driver stand-in publishes them
        dra: [{model: A10, count: 4, pcieRoots: 2}]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: kwok manages exactly the nodes that carry this annotation.
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
#: Every simulated node carries this label, so tests can list them.
SIMULATED_LABEL = "gpuoperator.local/simulated"


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class GpuGroup(BaseModel):
    """``count`` GPUs of one model on a node, published by a DRA driver (the stand-in,
    ``test/harness/dra_driver.py``), spread round-robin over ``pcieRoots`` PCIe root
    complexes and ``numaNodes`` NUMA nodes."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: str
    memory: str = "24Gi"
    count: int = Field(default=1, ge=1, le=128)
    pcie_roots: int = Field(default=1, ge=1, alias="pcieRoots")
    numa_nodes: int = Field(default=1, ge=1, alias="numaNodes")


class NodeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="node name; '{i}' is replaced by the index within the group")
    count: int = Field(default=1, ge=1, le=10000)
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    resources: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    #: GPUs a DRA driver publishes in a ResourceSlice for each node of the group
    dra: list[GpuGroup] = Field(default_factory=list)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeGroup]


def load(path: Path) -> Profile:
    try:
        data = yaml.safe_load(path.read_text())
        return Profile.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"node profile {path}: {exc}") from exc


def node_manifest(name: str, group: NodeGroup) -> dict[str, Any]:
    """A Node object with its capacity in status (the API server accepts status on create)."""
    capacity = {"cpu": group.cpu, "memory": group.memory, "pods": str(group.pods)}
    capacity.update({res: str(n) for res, n in group.resources.items()})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                SIMULATED_LABEL: "true",
                **group.labels,
            },
        },
        "spec": {"taints": [t.model_dump() for t in group.taints]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def dra_nodes(profile: Profile) -> dict[str, list[GpuGroup]]:
    """Node name → the DRA GPUs the driver stand-in publishes for it (nodes with none are
    left out)."""
    return {
        group.name.replace("{i}", str(i)): group.dra
        for group in profile.nodes
        if group.dra
        for i in range(group.count)
    }


def manifests(profile: Profile) -> list[dict[str, Any]]:
    out = []
    for group in profile.nodes:
        for i in range(group.count):
            out.append(node_manifest(group.name.replace("{i}", str(i)), group))
    return out
