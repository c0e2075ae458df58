"""Cache transforms keep what the operator reads and drop the rest."""

from __future__ import annotations

from typing import Any, cast

from gpuoperator import names
from gpuoperator.model import slimming


def full_pod() -> dict[str, object]:
    return {
        "metadata": {
            "name": "virt-launcher-vm-abcde",
            "namespace": "t",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"kubevirt.io": "virt-launcher", names.CLAIMS_LABEL: "true"},
            "annotations": {
                names.CLAIMS_ANNOTATION: "[]",
                "kubevirt.io/domain": "vm",
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 5000,
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm",
                    "uid": "v1",
                    "controller": True,
                },
                {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "o1"},
            ],
            "managedFields": [{"manager": "x"}],
        },
        "spec": {
            "nodeName": "a10-0",
            "schedulingGates": [{"name": names.PLACEMENT_GATE}],
            "containers": [
                {
                    "name": "compute",
                    "image": "i",
                    "env": [{"name": "A"}],
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/GA102GL_A10": "2"},
                        "limits": {"nvidia.com/GA102GL_A10": "2"},
                    },
                }
            ],
            "initContainers": [
                {
                    "name": "init",
                    "restartPolicy": "Always",
                    "resources": {"limits": {"example.com/x": "1"}},
                }
            ],
            "overhead": {"cpu": "100m", "example.com/y": "1"},
            "volumes": [{"name": "v"}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "m",
                    "lastTransitionTime": "t",
                },
                {"type": "Ready", "status": "False"},
            ],
        },
    }


def test_a_slim_pod_keeps_what_gpu_accounting_and_placement_read() -> None:
    slim = slimming.slim_pod(full_pod())
    meta = slim["metadata"]
    assert meta["labels"][names.CLAIMS_LABEL] == "true"
    assert set(meta["annotations"]) == {names.CLAIMS_ANNOTATION, "kubevirt.io/domain"}
    assert [o["uid"] for o in meta["ownerReferences"]] == ["v1"]
    assert "managedFields" not in meta
    spec = slim["spec"]
    assert spec["nodeName"] == "a10-0"
    assert spec["schedulingGates"] == [{"name": names.PLACEMENT_GATE}]
    assert spec["containers"] == [
        {"name": "compute", "resources": {"requests": {"nvidia.com/GA102GL_A10": "2"}}}
    ]
    assert spec["initContainers"] == [
        {
            "name": "init",
            "restartPolicy": "Always",
            "resources": {"requests": {"example.com/x": "1"}},
        }
    ]
    assert spec["overhead"] == {"example.com/y": "1"}
    assert "volumes" not in spec
    assert slim["status"] == {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
        ],
    }


def test_a_gated_pod_keeps_its_affinity_and_an_ungated_one_drops_it() -> None:
    pod = full_pod()
    spec = cast("dict[str, Any]", pod["spec"])
    affinity: dict[str, Any] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }
    spec["affinity"] = affinity
    assert slimming.slim_pod(pod)["spec"]["affinity"] == affinity
    del spec["schedulingGates"]
    assert "affinity" not in slimming.slim_pod(pod)["spec"]


def test_a_slim_node_keeps_gpu_resources_taints_cordon_and_readiness() -> None:
    node = {
        "metadata": {
            "name": "a10-0",
            "uid": "n",
            "labels": {"a": "b"},
            "annotations": {"big": "x" * 1000},
        },
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "k", "effect": "NoSchedule"}],
            "podCIDR": "10.0.0.0/24",
        },
        "status": {
            "capacity": {"cpu": "32", "nvidia.com/GA102GL_A10": "8"},
            "allocatable": {"cpu": "31", "nvidia.com/GA102GL_A10": "8"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "t",
                },
            ],
            "images": [{"names": ["x"] * 50}],
        },
    }
    slim = slimming.slim_node(node)
    assert "annotations" not in slim["metadata"]
    assert slim["spec"] == {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert slim["status"] == {
        "capacity": {"nvidia.com/GA102GL_A10": "8"},
        "allocatable": {"nvidia.com/GA102GL_A10": "8"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }


def plain_pod(resources: dict[str, object] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-1",
            "namespace": "t",
            "uid": "u2",
            "resourceVersion": "9",
            "labels": {"app": "web"},
            "annotations": {"note": "x" * 100},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "controller": True}],
        },
        "spec": {
            "nodeName": "cpu-0",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "resources": resources or {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready"}]},
    }


def test_a_pod_without_gpus_or_kubevirt_labels_is_kept_as_a_stub() -> None:
    assert slimming.slim_pod(plain_pod()) == {
        "metadata": {"name": "web-1", "namespace": "t", "uid": "u2", "resourceVersion": "9"},
        "spec": {"nodeName": "cpu-0"},
        "status": {"phase": "Running"},
    }


def test_a_pod_with_an_extended_resource_even_as_a_limit_is_kept_in_full() -> None:
    slim = slimming.slim_pod(plain_pod({"limits": {"nvidia.com/GA102GL_A10": "1"}}))
    assert slim["spec"]["containers"] == [
        {"name": "c", "resources": {"requests": {"nvidia.com/GA102GL_A10": "1"}}}
    ]
    assert slim["metadata"]["labels"] == {"app": "web"}


def test_a_kubevirt_pod_without_gpus_is_kept_in_full() -> None:
    pod = plain_pod()
    pod["metadata"]["labels"] = {"kubevirt.io": "virt-launcher"}
    assert "containers" in slimming.slim_pod(pod)["spec"]


def test_managed_fields_are_dropped_and_nothing_else() -> None:
    claim: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": "t", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound"},
    }
    assert slimming.without_managed_fields(claim) == {
        "metadata": {"name": "c", "namespace": "t"},
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound"},
    }
    assert claim["metadata"]["managedFields"]  # the original is left alone
    lean = {"metadata": {"name": "c"}}
    assert slimming.without_managed_fields(lean) is lean
