"""Simulated GPU nodes and GPU classes owned by one test, with a resource name of their
own, so a test's figures are exact whatever else runs on the cluster."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import pykube

from gpuoperator import names
from gpuoperator.kinds import GPUClass
from harness.kube import Obj, replace
from harness.waiting import wait_for
from localcluster import profile


class Fleet:
    """Simulated nodes and classes owned by one test, removed afterwards."""

    def __init__(self, api: pykube.HTTPClient) -> None:
        self.api = api
        self.tag = uuid.uuid4().hex[:6]
        self.resource = f"example.com/gpu-{self.tag}"
        self.nodes: list[pykube.Node] = []
        self.classes: list[GPUClass] = []

    def node(
        self,
        units: int,
        *,
        taints: list[Obj] | None = None,
        memory: str = "256Gi",
        ready_within: float = 30.0,
    ) -> str:
        group = profile.NodeGroup(
            name=f"n-{self.tag}-{len(self.nodes)}",
            resources={self.resource: units},
            memory=memory,
        )
        manifest = profile.node_manifest(group.name, group)
        manifest["spec"]["taints"] = taints or []
        node = pykube.Node(self.api, manifest)
        node.create()
        self.nodes.append(node)
        wait_for(
            f"node {group.name} Ready",
            lambda: _ready(self.api, group.name),
            timeout=ready_within,
        )
        return group.name

    def gpu_class(self, suffix: str = "", **spec: Any) -> str:
        name = f"c-{self.tag}{suffix}"
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLASS,
            "metadata": {"name": name},
            "spec": {
                "vendor": "example",
                "model": "G1",
                "mode": "passthrough",
                "source": {"devicePlugin": {"resourceName": self.resource}},
                **spec,
            },
        }
        cls = GPUClass(self.api, body)
        cls.create()
        self.classes.append(cls)
        return name

    def cleanup(self) -> None:
        """Delete the classes (dropping the protection finalizer, since the test's claims
        may outlive it in a terminating namespace) and the nodes."""
        for cls in self.classes:
            cls.delete()
            wait_for(f"class {cls.name} gone", partial(_drop_finalizers, cls))
        for node in self.nodes:
            node.delete()


def _drop_finalizers(cls: GPUClass) -> bool:
    """One attempt; True once the class is gone (a 409 from a concurrent write retries)."""
    try:
        cls.reload()
    except pykube.exceptions.ObjectDoesNotExist:
        return True
    except pykube.exceptions.HTTPError as exc:
        if exc.code == 404:
            return True
        raise
    cls.obj["metadata"]["finalizers"] = []
    replace(cls)
    return False


def _ready(api: pykube.HTTPClient, name: str) -> bool:
    node = pykube.Node.objects(api).get(name=name)
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.obj["status"].get("conditions", [])
    )


def published(api: pykube.HTTPClient, cls: str, max_free: int, timeout: float = 15) -> None:
    """Wait until ``cls`` publishes ``maxFreePerNode == max_free``. The order webhook judges
    an order against the published figure, which the operator writes at most once per
    statusInterval: a test that orders right after adding nodes waits for it first."""
    wait_for(
        f"{cls} to publish maxFreePerNode={max_free}",
        lambda: GPUClass.objects(api).get(name=cls).obj.get("status") or {},
        until=lambda s: s.get("maxFreePerNode") == max_free,
        timeout=timeout,
    )
