"""The KubeVirt stand-in's pure decisions: the launcher pod it renders, the permitted-devices
table it honours, the pod it recognises, and the VMI status it mirrors from the pod."""

from __future__ import annotations

from typing import Any

import pytest

from harness import kubevirt as kv
from harness import objects

A10 = "nvidia.com/GA102GL_A10"
L40S = "nvidia.com/L40S-24Q"
UID = "0f5c1e2a-1111-2222-3333-444455556666"

Obj = dict[str, Any]


def vmi(**spec: Any) -> Obj:
    base = objects.vmi(
        "vm-a",
        namespace="tenant",
        uid=UID,
        rv=None,
        refs='[{"claim":"hold-a"}]',
        labels={"app": "web"},
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "kubectl.kubernetes.io/restartedAt": "now",
            "note": "kept",
        },
        devices={
            "gpus": [
                {"name": "gpu0", "deviceName": A10},
                {"name": "gpu1", "deviceName": A10},
                {"name": "gpu2", "deviceName": L40S},
            ]
        },
    )
    base["spec"].update(spec)
    return base


def render(obj: Obj, permitted: frozenset[str] | None = None) -> Obj:
    pod = kv.render_launcher_pod(obj, permitted)
    assert isinstance(pod, dict), pod
    return pod


def kubevirt_cr(table: Obj | None, created: str = "2026-01-01T00:00:00Z", **meta: Any) -> Obj:
    spec: Obj = {"configuration": {}}
    if table is not None:
        spec["configuration"]["permittedHostDevices"] = table
    return {
        "metadata": {"name": "kubevirt", "namespace": "kubevirt", "creationTimestamp": created}
        | meta,
        "spec": spec,
    }


def pod_for(obj: Obj, phase: str = "Pending", node: str = "", **meta: Any) -> Obj:
    pod = render(obj)
    pod["metadata"].update({"name": "virt-launcher-vm-a-abcde", "uid": "pod-uid"} | meta)
    if node:
        pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


# ---- rendering -------------------------------------------------------------------------


def test_pod_is_named_after_the_vmi_and_lives_in_its_namespace() -> None:
    meta = render(vmi())["metadata"]
    assert meta["generateName"] == "virt-launcher-vm-a-"
    assert "name" not in meta
    assert meta["namespace"] == "tenant"


def test_pod_carries_every_vmi_label_plus_kubevirts_own() -> None:
    assert render(vmi())["metadata"]["labels"] == {
        "app": "web",
        "gpu.cozystack.io/claims": "true",
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": UID,
        "vm.kubevirt.io/name": "vm-a",
    }


def test_pod_annotations_drop_kubectls_and_add_the_domain() -> None:
    assert render(vmi())["metadata"]["annotations"] == {
        "gpu.cozystack.io/claims": '[{"claim":"hold-a"}]',
        "note": "kept",
        "kubevirt.io/domain": "vm-a",
    }


def test_pod_is_controlled_by_the_vmi() -> None:
    assert render(vmi())["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "name": "vm-a",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_compute_is_the_first_container_and_counts_one_unit_per_gpu_entry() -> None:
    compute = render(vmi())["spec"]["containers"][0]
    assert compute["name"] == "compute"
    assert compute["image"]
    expected = {A10: "2", L40S: "1"}
    assert compute["resources"] == {"requests": expected, "limits": expected}


def test_cpu_and_memory_go_where_the_vmi_puts_them() -> None:
    resources = {
        "requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "1Gi"},
        "limits": {"memory": "8Gi"},
    }
    obj = vmi()
    obj["spec"]["domain"]["resources"] = resources
    got = render(obj)["spec"]["containers"][0]["resources"]
    assert got["requests"] == {"cpu": "2", "memory": "4Gi", A10: "2", L40S: "1"}
    assert got["limits"] == {"memory": "8Gi", A10: "2", L40S: "1"}


def test_a_vmi_without_gpus_gets_a_pod_without_device_units() -> None:
    obj = vmi()
    del obj["spec"]["domain"]["devices"]["gpus"]
    compute = render(obj)["spec"]["containers"][0]
    assert compute["resources"] == {"requests": {}, "limits": {}}


def test_dra_gpus_render_the_vmis_resource_claims_on_the_pod_and_compute() -> None:
    obj = vmi(
        resourceClaims=[
            {"name": "gpuop-0", "resourceClaimName": "hold-a"},
            {"name": "gpuop-1", "resourceClaimName": "hold-b"},
        ]
    )
    obj["spec"]["domain"]["devices"]["gpus"] = [
        {"name": "gpuop-0", "claimName": "gpuop-0", "requestName": "gpu"},
        {"name": "gpuop-1", "claimName": "gpuop-1", "requestName": "gpu"},
        {"name": "gpuop-2", "claimName": "gpuop-1", "requestName": "gpu"},
    ]
    pod = render(obj)
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpuop-0", "resourceClaimName": "hold-a"},
        {"name": "gpuop-1", "resourceClaimName": "hold-b"},
    ]
    compute = pod["spec"]["containers"][0]
    # No extended resource for a DRA entry: the device comes through the claim.
    assert compute["resources"] == {
        "requests": {},
        "limits": {},
        "claims": [{"name": "gpuop-0"}, {"name": "gpuop-1"}],
    }


def test_a_dra_gpu_is_not_judged_against_the_permitted_devices() -> None:
    obj = vmi(resourceClaims=[{"name": "gpuop-0", "resourceClaimName": "hold-a"}])
    obj["spec"]["domain"]["devices"]["gpus"] = [
        {"name": "gpuop-0", "claimName": "gpuop-0", "requestName": "gpu"}
    ]
    assert render(obj, frozenset())["spec"]["resourceClaims"]


def test_scheduling_constraints_are_copied_from_the_vmi() -> None:
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    obj = vmi(tolerations=tolerations, affinity=affinity, nodeSelector={"disk": "ssd"})
    spec = render(obj)["spec"]
    assert spec["tolerations"] == tolerations
    assert spec["affinity"] == affinity
    assert spec["nodeSelector"] == {"disk": "ssd"}
    spec["tolerations"].append({"key": "changed"})
    assert len(obj["spec"]["tolerations"]) == 1, "the rendered pod must not alias the VMI"


def test_no_scheduling_constraints_means_none_on_the_pod() -> None:
    spec = render(vmi())["spec"]
    assert (
        not {"tolerations", "affinity", "nodeSelector", "schedulingGates", "resourceClaims"}
        & spec.keys()
    )


def test_rendering_does_not_change_the_vmi() -> None:
    obj = vmi()
    before = repr(obj)
    render(obj)
    assert repr(obj) == before


# ---- permittedHostDevices --------------------------------------------------------------


def test_no_kubevirt_cr_or_no_table_permits_everything() -> None:
    assert kv.permitted_devices([]) is None
    assert kv.permitted_devices([kubevirt_cr(None)]) is None


def test_an_empty_table_permits_nothing() -> None:
    assert kv.permitted_devices([kubevirt_cr({})]) == frozenset()
    assert kv.permitted_devices([kubevirt_cr({"pciHostDevices": []})]) == frozenset()
    refusal = kv.render_launcher_pod(vmi(), frozenset())
    assert isinstance(refusal, kv.SyncError)


def test_pci_and_mediated_devices_both_permit() -> None:
    table = {
        "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": A10}],
        "mediatedDevices": [{"mdevNameSelector": "NVIDIA L40S-24Q", "resourceName": L40S}],
    }
    permitted = kv.permitted_devices([kubevirt_cr(table)])
    assert permitted == frozenset({A10, L40S})
    assert isinstance(kv.render_launcher_pod(vmi(), permitted), dict)


def test_a_gpu_missing_from_a_set_table_gets_no_pod_and_says_why() -> None:
    table = {"pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": A10}]}
    refusal = kv.render_launcher_pod(vmi(), kv.permitted_devices([kubevirt_cr(table)]))
    assert refusal == kv.SyncError(
        "FailedCreate", f"GPU {L40S} is not permitted in permittedHostDevices configuration"
    )


def test_the_oldest_live_kubevirt_cr_decides() -> None:
    older = kubevirt_cr({}, created="2026-01-01T00:00:00Z")
    newer = kubevirt_cr(None, created="2026-02-01T00:00:00Z", name="second")
    assert kv.permitted_devices([newer, older]) == frozenset()
    deleting = kubevirt_cr({}, deletionTimestamp="2026-03-01T00:00:00Z")
    assert kv.permitted_devices([deleting, newer]) is None


# ---- finding the pod -------------------------------------------------------------------


def test_the_pod_is_found_by_label_and_controller_reference() -> None:
    obj = vmi()
    mine = pod_for(obj)
    unlabelled = pod_for(obj, labels={"app": "web"})
    not_controller = pod_for(obj)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    other_uid = pod_for(obj)
    other_uid["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    others = [unlabelled, not_controller, other_uid]
    assert kv.find_launcher_pod(obj, [*others, mine]) is mine
    assert kv.find_launcher_pod(obj, others) is None


def test_a_live_pod_is_preferred_over_a_deleted_one() -> None:
    obj = vmi()
    deleting = pod_for(obj, deletionTimestamp="2026-01-01T00:00:01Z")
    live = pod_for(obj, creationTimestamp="2026-01-01T00:00:00Z")
    assert kv.find_launcher_pod(obj, [live, deleting]) is live


# ---- status ----------------------------------------------------------------------------


def with_status(obj: Obj, **status: Any) -> Obj:
    obj["status"] = status
    return obj


def test_no_pod_yet_is_pending() -> None:
    assert kv.vmi_status(vmi(), None) == {"phase": "Pending"}


def test_a_pod_that_exists_is_scheduling() -> None:
    obj = vmi()
    assert kv.vmi_status(obj, pod_for(obj)) == {"phase": "Scheduling"}
    assert kv.vmi_status(obj, pod_for(obj, node="a10-0")) == {"phase": "Scheduling"}


def test_a_running_pod_is_scheduled_on_its_node() -> None:
    obj = with_status(vmi(), phase="Scheduling")
    status = kv.vmi_status(obj, pod_for(obj, phase="Running", node="a10-1"))
    assert status == {"phase": "Scheduled", "nodeName": "a10-1"}


@pytest.mark.parametrize("phase", ["Scheduling", "Scheduled"])
def test_a_pod_gone_after_launch_fails_the_vmi(phase: str) -> None:
    obj = with_status(vmi(), phase=phase, nodeName="a10-1")
    assert kv.vmi_status(obj, None) == {"phase": "Failed", "nodeName": "a10-1"}


def test_a_pod_gone_before_the_status_said_so_fails_a_launched_vmi() -> None:
    assert kv.vmi_status(vmi(), None, launched=True) == {"phase": "Failed"}


@pytest.mark.parametrize(
    ("phase", "meta"),
    [
        ("Pending", {"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        ("Running", {"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        ("Failed", {}),
        ("Succeeded", {}),
    ],
)
def test_a_pod_being_deleted_or_terminated_fails_the_vmi(phase: str, meta: Obj) -> None:
    obj = with_status(vmi(), phase="Scheduling")
    pod = pod_for(obj, phase=phase, node="a10-0", **meta)
    assert kv.vmi_status(obj, pod)["phase"] == "Failed"


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_final_vmi_stays_as_it_is(phase: str) -> None:
    obj = with_status(vmi(), phase=phase, nodeName="a10-0")
    assert kv.vmi_status(obj, pod_for(obj, phase="Running", node="a10-1")) == obj["status"]
    assert kv.vmi_status(obj, None) == obj["status"]


def test_a_refusal_is_a_synchronized_false_condition_and_goes_away_with_it() -> None:
    error = kv.SyncError("FailedCreate", "GPU x is not permitted")
    refused = kv.vmi_status(vmi(), None, error=error, now="2026-01-01T00:00:00Z")
    assert refused == {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Synchronized",
                "status": "False",
                "reason": "FailedCreate",
                "message": "GPU x is not permitted",
                "lastProbeTime": None,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    again = kv.vmi_status(with_status(vmi(), **refused), None, error=error, now="later")
    assert again == refused, "an unchanged refusal keeps its transition time"
    obj = with_status(vmi(), **refused)
    assert kv.vmi_status(obj, pod_for(obj)) == {"phase": "Scheduling", "conditions": []}


def test_status_fields_the_simulator_does_not_own_are_kept() -> None:
    ready = {"type": "Ready", "status": "False"}
    obj = with_status(vmi(), phase="Scheduling", conditions=[ready], guestOSInfo={"id": "x"})
    status = kv.vmi_status(obj, pod_for(obj, phase="Running", node="a10-0"))
    assert status == {
        "phase": "Scheduled",
        "nodeName": "a10-0",
        "conditions": [ready],
        "guestOSInfo": {"id": "x"},
    }


def test_status_is_idempotent() -> None:
    obj = vmi()
    pod = pod_for(obj, phase="Running", node="a10-0")
    first = kv.vmi_status(obj, pod)
    assert kv.vmi_status(with_status(obj, **first), pod) == first
