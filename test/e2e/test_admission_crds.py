"""What every CRD promises as a whole, and the GPUNode and Workload schemas."""

from __future__ import annotations

import uuid
from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUNode, Workload
from harness.kube import load_yaml, refused, replace
from localcluster.cluster import REPO, kubectl

CRD_FILES = sorted((REPO / "config" / "crd").glob("cozystack.io_*.yaml"))


def test_every_crd_is_established_with_the_keep_annotation(api: pykube.HTTPClient) -> None:
    assert len(CRD_FILES) == 4
    for path in CRD_FILES:
        (doc,) = load_yaml(path)
        live = pykube.objects.CustomResourceDefinition.objects(api).get(
            name=doc["metadata"]["name"]
        )
        assert live.annotations.get("helm.sh/resource-policy") == "keep", path.name
        conds = {c["type"]: c["status"] for c in live.obj["status"]["conditions"]}
        assert conds.get("Established") == "True", (path.name, live.obj["status"]["conditions"])
        assert doc["spec"]["group"] == names.GROUP


def test_the_samples_are_valid(api: pykube.HTTPClient, kubeconfig: Path, namespace: str) -> None:
    samples = REPO / "config" / "samples"
    out = kubectl(kubeconfig, "apply", "--dry-run=server", "-k", str(samples))
    assert "gpuclass.cozystack.io/a10" in out and "gpuclass.cozystack.io/l40s-24q" in out
    kubectl(
        kubeconfig,
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        str(samples / "gpuclaim.yaml"),
    )


def gpunode(name: str) -> dict[str, object]:
    return {"apiVersion": names.API_VERSION, "kind": names.GPU_NODE, "metadata": {"name": name}}


@pytest.fixture
def node(api: pykube.HTTPClient, request: pytest.FixtureRequest) -> GPUNode:
    n = GPUNode(api, gpunode(f"gn-{uuid.uuid4().hex[:8]}"))
    n.create()
    request.addfinalizer(n.delete)
    return n


def test_gpunode_status_holds_devices_classes_and_conditions(node: GPUNode) -> None:
    node.obj["status"] = {
        "devices": [
            {
                "resourceName": "nvidia.com/GA102GL_A10",
                "capacity": 8,
                "allocatable": 8,
                "allocated": 3,
                "free": 5,
            }
        ],
        "classes": [{"name": "a10", "free": 5}],
        "draDevices": [
            {
                "name": "dra-a10",
                "deviceClassName": "a10.example.com",
                "count": 4,
                "allocated": 2,
                "tainted": 1,
                "free": 1,
            }
        ],
        "conditions": [
            {
                "type": "Schedulable",
                "status": "True",
                "reason": "Ready",
                "message": "node is Ready and not cordoned",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "observedGeneration": 1,
    }
    replace(node, subresource="status")
    node.reload()
    assert node.obj["status"]["devices"][0]["free"] == 5
    assert node.obj["status"]["draDevices"][0]["tainted"] == 1


MAX_CLASSES = 10000


def test_gpunode_status_lists_every_class_of_a_large_catalog(node: GPUNode) -> None:
    """A node eligible for many classes must never fail its status writes: the bound is far
    beyond any catalog and the whole status fits one request."""
    node.obj["status"] = {
        "classes": [{"name": f"class-{i:05d}", "free": 8} for i in range(MAX_CLASSES)]
    }
    replace(node, subresource="status")
    node.reload()
    assert len(node.obj["status"]["classes"]) == MAX_CLASSES


def test_gpunode_status_refuses_more_classes_than_the_bound(node: GPUNode) -> None:
    node.obj["status"] = {
        "classes": [{"name": f"class-{i:05d}", "free": 8} for i in range(MAX_CLASSES + 1)]
    }
    with refused() as r:
        replace(node, subresource="status")
    assert "status.classes" in r[0].message and str(MAX_CLASSES) in r[0].message, r[0].message


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        (
            {
                "devices": [
                    {
                        "resourceName": "r/x",
                        "capacity": 1,
                        "allocatable": 1,
                        "allocated": 0,
                        "free": -1,
                    }
                ]
            },
            "status.devices[0].free",
        ),
        ({"devices": [{"resourceName": "r/x", "capacity": 1}]}, "status.devices[0].allocatable"),
        (
            {"classes": [{"name": "a10", "free": 1}, {"name": "a10", "free": 2}]},
            "status.classes[1]",
        ),
        (
            {"draDevices": [{"name": "dra-a10", "deviceClassName": "x", "count": 1}]},
            "status.draDevices[0].tainted",
        ),
    ],
    ids=["negative-free", "missing-fields", "duplicate-class", "dra-missing-fields"],
)
def test_gpunode_refuses_malformed_status(
    node: GPUNode, status: dict[str, object], fragment: str
) -> None:
    node.obj["status"] = status
    with refused() as r:
        replace(node, subresource="status")
    assert fragment in r[0].message, r[0].message


def test_workload_carries_the_usage_record_shape(api: pykube.HTTPClient, namespace: str) -> None:
    key = names.quota_key("a10")
    w = Workload(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.WORKLOAD,
            "metadata": {"name": names.workload_name("hold"), "namespace": namespace},
            "status": {
                "kind": "GPUClaim",
                "type": "gpu",
                "resources": {key: 2},
                "operational": True,
            },
        },
    )
    w.create()
    w.reload()
    assert w.obj["status"] == {
        "kind": "GPUClaim",
        "type": "gpu",
        "resources": {key: 2},
        "operational": True,
    }


def test_workload_refuses_a_resource_that_is_not_a_quantity(
    api: pykube.HTTPClient, namespace: str
) -> None:
    w = Workload(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.WORKLOAD,
            "metadata": {"name": "bad", "namespace": namespace},
            "status": {"resources": {names.quota_key("a10"): "two"}},
        },
    )
    with refused() as r:
        w.create()
    assert f"status.resources.{names.quota_key('a10')}" in r[0].message, r[0].message
