"""A DRA driver stand-in: publishes ResourceSlices for simulated nodes as a real driver's
kubelet plugin would, so DRA classes can be tested on a real API server and kube-scheduler
without GPUs (docs/design.md §5 "DRA classes").

As a real driver does, it keeps one pool per node, named after the node, in one
ResourceSlice (``resourceSliceCount: 1``) with ``spec.nodeName`` set, and bumps the pool's
``generation`` each time the node's devices change (a taint set or lifted included). Every
device carries the attributes a GPU driver publishes: ``model``, ``uuid``, ``pcieRoot`` and
``numaNode`` (the driver's domain, unqualified) and ``memory`` capacity.

It acts as its own ServiceAccount (:func:`driver_client`), allowed by RBAC to manage
ResourceSlices and nothing else, as a driver's DaemonSet is.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pykube
from pydantic import BaseModel, ConfigDict, Field

from gpuoperator import names
from gpuoperator.kinds import DeviceClass, ResourceSlice
from harness import accounts, kube
from harness.waiting import wait_for
from localcluster import profile

Obj = dict[str, Any]

DRIVER = "gpu.example.com"
ACCOUNT = "dra-driver"


#: ``count`` GPUs of one model on a node (the local cluster's profiles name them too).
GpuGroup = profile.GpuGroup


class DraNodeGroup(BaseModel):
    """Nodes named ``name`` (``{i}`` is the index) each with the same GPUs."""

    model_config = ConfigDict(extra="forbid")
    name: str
    count: int = Field(default=1, ge=1, le=1000)
    gpus: list[GpuGroup]


@dataclasses.dataclass
class Gpu:
    """One published device; ``taints`` are DRA device taints (``{key, value?, effect}``)."""

    name: str
    model: str
    memory: str
    uuid: str
    pcie_root: str
    numa_node: int
    taints: list[Obj] = dataclasses.field(default_factory=list)

    def device(self) -> Obj:
        obj: Obj = {
            "name": self.name,
            "attributes": {
                "model": {"string": self.model},
                "uuid": {"string": self.uuid},
                "pcieRoot": {"string": self.pcie_root},
                "numaNode": {"int": self.numa_node},
            },
            "capacity": {"memory": {"value": self.memory}},
        }
        if self.taints:
            obj["taints"] = [dict(t) for t in self.taints]
        return obj


def gpus_of(node: str, groups: list[GpuGroup]) -> list[Gpu]:
    """The devices a node of ``groups`` has, named ``gpu-<n>`` in order."""
    out: list[Gpu] = []
    for group in groups:
        for i in range(group.count):
            n = len(out)
            out.append(
                Gpu(
                    name=f"gpu-{n}",
                    model=group.model,
                    memory=group.memory,
                    uuid=f"GPU-{node}-{n}",
                    pcie_root=f"pci{i % group.pcie_roots}",
                    numa_node=i % group.numa_nodes,
                )
            )
    return out


def expand(groups: list[DraNodeGroup]) -> dict[str, list[Gpu]]:
    """Node name → its devices, for a profile."""
    return {
        g.name.replace("{i}", str(i)): gpus_of(g.name.replace("{i}", str(i)), g.gpus)
        for g in groups
        for i in range(g.count)
    }


def install_account(admin: pykube.HTTPClient, namespace: str) -> None:
    """The driver's ServiceAccount in ``namespace`` and a ClusterRole to manage
    ResourceSlices, bound to it (cluster-scoped objects named after the namespace)."""
    rbac = "rbac.authorization.k8s.io/v1"
    pykube.ServiceAccount(admin, {"metadata": {"name": ACCOUNT, "namespace": namespace}}).create()
    pykube.ClusterRole(
        admin,
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": f"{namespace}-{ACCOUNT}"},
            "rules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": [names.RESOURCE_SLICES],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
    ).create()
    pykube.ClusterRoleBinding(
        admin,
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-{ACCOUNT}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{namespace}-{ACCOUNT}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    ).create()


def uninstall_account(admin: pykube.HTTPClient, namespace: str) -> None:
    for kind in (pykube.ClusterRoleBinding, pykube.ClusterRole):
        obj = kind.objects(admin).get_or_none(name=f"{namespace}-{ACCOUNT}")
        if obj is not None:
            obj.delete()


def driver_client(admin: pykube.HTTPClient, namespace: str) -> pykube.HTTPClient:
    """A client acting as the driver's ServiceAccount, once RBAC lets it list slices."""
    client = accounts.client(admin, namespace, ACCOUNT)

    def may_list() -> bool:
        response = client.get(url="resourceslices?limit=1", version=names.DRA_API_VERSION)
        return bool(response.ok)

    wait_for(f"{ACCOUNT} to manage ResourceSlices", may_list, timeout=30)
    return client


class DraDriver:
    """Publishes one ResourceSlice per node and keeps it current."""

    def __init__(self, client: pykube.HTTPClient, driver: str = DRIVER) -> None:
        self.client = client
        self.driver = driver
        self.gpus: dict[str, list[Gpu]] = {}
        self.generation: dict[str, int] = {}

    def slice_name(self, node: str) -> str:
        return f"{node}-{self.driver.replace('.', '-')}"

    def _manifest(self, node: str) -> Obj:
        return {
            "apiVersion": names.DRA_API_VERSION,
            "kind": names.RESOURCE_SLICE_KIND,
            "metadata": {"name": self.slice_name(node)},
            "spec": {
                "driver": self.driver,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": self.generation[node],
                    "resourceSliceCount": 1,
                },
                "devices": [g.device() for g in self.gpus[node]],
            },
        }

    def publish(self, node: str, gpus: list[Gpu]) -> Obj:
        """Publish ``gpus`` as ``node``'s pool: create its slice, or replace it with the
        generation bumped. Returns the slice as the API server stored it."""
        first = node not in self.gpus
        self.gpus[node] = gpus
        self.generation[node] = self.generation.get(node, 0) + 1
        obj = ResourceSlice(self.client, self._manifest(node))
        if first:
            obj.create()
        else:
            current = ResourceSlice.objects(self.client).get(name=self.slice_name(node))
            obj.obj["metadata"]["resourceVersion"] = current.obj["metadata"]["resourceVersion"]
            kube.replace(obj)
        stored: Obj = obj.obj
        return stored

    def publish_all(self, nodes: dict[str, list[Gpu]]) -> None:
        for node, gpus in nodes.items():
            self.publish(node, gpus)

    def taint(self, node: str, device: str, effect: str = "NoSchedule") -> Obj:
        """Taint one device (as a driver does when a GPU turns unhealthy) and republish."""
        gpus = [dataclasses.replace(g, taints=list(g.taints)) for g in self.gpus[node]]
        for g in gpus:
            if g.name == device:
                g.taints.append({"key": f"{self.driver}/unhealthy", "effect": effect})
        return self.publish(node, gpus)

    def withdraw(self) -> None:
        """Delete every slice this driver published."""
        for node in list(self.gpus):
            obj = ResourceSlice.objects(self.client).get_or_none(name=self.slice_name(node))
            if obj is not None:
                obj.delete()
            del self.gpus[node]


def device_class(name: str, *expressions: str) -> Obj:
    """A DeviceClass selecting the devices every CEL expression accepts."""
    return {
        "apiVersion": names.DRA_API_VERSION,
        "kind": names.DEVICE_CLASS_KIND,
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


@contextlib.contextmanager
def installed(
    admin: pykube.HTTPClient,
    namespace: str,
    groups: list[DraNodeGroup],
    device_classes: list[Obj],
) -> Iterator[DraDriver]:
    """A DRA world for a test module: ``namespace`` with the driver's account, a simulated
    node per group entry, the DeviceClasses, and the driver publishing the groups' devices;
    all of it removed afterwards (the driver's slices first)."""
    pykube.Namespace(admin, {"metadata": {"name": namespace}}).create()
    install_account(admin, namespace)
    made: list[pykube.objects.APIObject] = []
    driver = DraDriver(driver_client(admin, namespace))
    try:
        for node_name in expand(groups):
            node = pykube.Node(
                admin, profile.node_manifest(node_name, profile.NodeGroup(name=node_name))
            )
            node.create()
            made.append(node)
        for obj in device_classes:
            dc = DeviceClass(admin, obj)
            dc.create()
            made.append(dc)
        driver.publish_all(expand(groups))
        yield driver
    finally:
        driver.withdraw()
        for obj in made:
            obj.delete()
        uninstall_account(admin, namespace)
        pykube.Namespace(admin, {"metadata": {"name": namespace}}).delete()
