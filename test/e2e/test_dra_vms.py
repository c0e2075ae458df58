"""VMs on claims of DRA classes, on the real control plane with the KubeVirt stand-in
(docs/design.md §5 "DRA classes", "VMs"): the VMI webhook writes KubeVirt's DRA shape, the
launcher pod names the claim's hold, placement removes the gate without a pin, and
kube-scheduler places the pod on the allocated node; the hold outlives the VM, and while the
VM is stopped a pod asking for the class's DeviceClass does not get the device.

The oracle is the API server's objects (the VMI, the pods, the ResourceClaims) and
kube-scheduler's own conditions, never the operator's ledger."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator.kinds import GPUClaim, GPUClass, ResourceClaim, VirtualMachineInstance
from harness import dra_driver, objects
from harness.claims import bound_node, create_claim, create_vmi
from harness.dra_driver import DraNodeGroup, GpuGroup
from harness.edit_tenant import tenant_client
from harness.kube import Obj, refused
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator

TAG = uuid.uuid4().hex[:5]
#: Two nodes with one A10 each, each node's device in a DeviceClass and GPUClass of its own:
#: once a claim holds the class's one device, nothing else can have it.
NODE, NODE_B = f"dravm-{TAG}-a", f"dravm-{TAG}-b"
PROFILE = [DraNodeGroup(name=n, gpus=[GpuGroup(model="A10", count=1)]) for n in (NODE, NODE_B)]
DEVICE_CLASS, DEVICE_CLASS_B = f"a10-vm-{TAG}.example.com", f"a10-vm-{TAG}-b.example.com"
CLASS, CLASS_B = f"dra-vm-{TAG}", f"dra-vm-{TAG}-b"


def selector(node: str) -> str:
    return f'device.attributes["{dra_driver.DRIVER}"].uuid.startsWith("GPU-{node}-")'


TIMEOUT = 60.0


@pytest.fixture(scope="module")
def dra_class(api: pykube.HTTPClient, hooks: WebhookOperator) -> Iterator[str]:
    device_classes = [
        dra_driver.device_class(DEVICE_CLASS, selector(NODE)),
        dra_driver.device_class(DEVICE_CLASS_B, selector(NODE_B)),
    ]
    with dra_driver.installed(api, f"dravm-{TAG}", PROFILE, device_classes):
        classes = [
            GPUClass(
                api,
                objects.gpuclass(
                    name, source={"dra": {"deviceClassName": dc}}, vendor="nvidia", model="A10"
                ),
            )
            for name, dc in ((CLASS, DEVICE_CLASS), (CLASS_B, DEVICE_CLASS_B))
        ]
        for cls in classes:
            cls.create()
        try:
            yield CLASS
        finally:
            for cls in classes:
                cls.delete()


def pods(api: pykube.HTTPClient, ns: str) -> list[Obj]:
    return [p.obj for p in pykube.Pod.objects(api, namespace=ns)]


def allocation(api: pykube.HTTPClient, ns: str, name: str) -> Obj | None:
    found = ResourceClaim.objects(api, namespace=ns).get_or_none(name=name)
    return (found.obj.get("status") or {}).get("allocation") if found is not None else None


def launcher_pod(api: pykube.HTTPClient, ns: str) -> Obj:
    """The VM's launcher pod once kube-scheduler has placed it."""
    found: list[Obj] = wait_for(
        "the launcher pod placed by kube-scheduler",
        lambda: [p for p in pods(api, ns) if p["metadata"]["name"].startswith("virt-launcher-")],
        until=lambda found: len(found) == 1 and bool(found[0]["spec"].get("nodeName")),
        timeout=TIMEOUT,
    )
    return found[0]


def test_a_tenant_naming_a_hold_raw_from_her_own_pod_or_vmi_is_refused(
    api: pykube.HTTPClient, dra_class: str, tenant: str, kubeconfig: Path
) -> None:
    """The tenant (only ``edit``, and KubeVirt's VMI rights) names her claim's hold in her
    own pod's and her own VMI's ``spec.resourceClaims``: both are refused, naming the field,
    the ResourceClaim and what is allowed; a pod naming a ResourceClaim that is no hold is
    hers."""
    client = tenant_client(api, kubeconfig, tenant)
    create_claim(client, tenant, "raw", dra_class, 1)
    bound_node(client, tenant, "raw", timeout=TIMEOUT)
    wait_for(
        "the claim's hold (the webhooks' caches have it)",
        lambda: allocation(api, tenant, "raw"),
        until=lambda found: found is not None,
        timeout=TIMEOUT,
    )

    def pod(name: str, resource_claim: str) -> pykube.Pod:
        return pykube.Pod(
            client,
            {
                "metadata": {"name": name, "namespace": tenant},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": resource_claim}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        )

    with refused(403) as pod_refusal:
        pod("sneaky", "raw").create()
    message = pod_refusal[0].message
    assert "spec.resourceClaims[0].resourceClaimName" in message
    assert "ResourceClaim raw is the hold of GPUClaim raw" in message
    assert "only the launcher pod KubeVirt creates for the VM that claim serves" in message

    vmi = VirtualMachineInstance(
        client,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "sneaky-vm", "namespace": tenant},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "raw"}],
                "domain": {
                    "devices": {"gpus": [{"name": "gpu", "claimName": "gpu", "requestName": "gpu"}]}
                },
            },
        },
    )
    with refused(403) as vmi_refusal:
        vmi.create()
    message = vmi_refusal[0].message
    assert "spec.resourceClaims[0].resourceClaimName" in message
    assert (
        "ResourceClaim raw is the hold of GPUClaim raw, which this VMI does not request" in message
    )
    assert "reference the claim in annotation gpu.cozystack.io/claims" in message

    plain = pod("plain", "not-a-hold")
    plain.create()  # admitted (it waits for its ResourceClaim)
    plain.delete()

    # The class's one device is free again for the tests after this one.
    GPUClaim.objects(api, namespace=tenant).get(name="raw").delete()
    wait_for(
        "the claim and its hold gone",
        lambda: (
            GPUClaim.objects(api, namespace=tenant).get_or_none(name="raw"),
            ResourceClaim.objects(api, namespace=tenant).get_or_none(name="raw"),
        ),
        until=lambda both: both == (None, None),
        timeout=TIMEOUT,
    )


def test_a_vm_on_a_dra_claim_starts_on_the_allocated_node_and_the_hold_outlives_it(
    api: pykube.HTTPClient, dra_class: str, tenant: str, hoster_namespace: str
) -> None:
    create_claim(api, tenant, "hold", dra_class, 1)
    assert bound_node(api, tenant, "hold", timeout=TIMEOUT) == NODE
    held = allocation(api, tenant, "hold")
    assert held is not None

    v = create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    assert v.obj["spec"]["resourceClaims"] == [{"name": "gpuop-0", "resourceClaimName": "hold"}]
    assert v.obj["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "gpuop-0", "claimName": "gpuop-0", "requestName": "gpu"}
    ]
    launcher = launcher_pod(api, tenant)
    spec = launcher["spec"]
    assert spec["nodeName"] == NODE
    assert spec["resourceClaims"] == [{"name": "gpuop-0", "resourceClaimName": "hold"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "gpuop-0"}]
    assert not spec.get("schedulingGates")
    assert "nodeAffinity" not in (spec.get("affinity") or {})  # no pin: the allocation placed it
    reasons = wait_for(
        "an Ungated event on the launcher pod",
        lambda: {
            e.obj.get("reason")
            for e in pykube.Event.objects(api, namespace=tenant).filter(
                field_selector={"involvedObject.name": launcher["metadata"]["name"]}
            )
        },
        until=lambda found: "Ungated" in found,
        timeout=TIMEOUT,
    )
    assert "Pinned" not in reasons

    # Stopping the VM leaves the hold allocated as it was.
    VirtualMachineInstance.objects(api, namespace=tenant).get(name="vm-1").delete()
    wait_for(
        "the VM and its launcher pod gone",
        lambda: (
            VirtualMachineInstance.objects(api, namespace=tenant).get_or_none(name="vm-1"),
            [p for p in pods(api, tenant) if p["metadata"]["name"].startswith("virt-launcher-")],
        ),
        until=lambda both: both == (None, []),
        timeout=TIMEOUT,
    )
    assert allocation(api, tenant, "hold") == held

    # Meanwhile a pod asking for the DeviceClass does not get the held device. Only an exempt
    # namespace may ask for it at all (config/policy/dra-claims.yaml): the hoster's.
    ResourceClaim(
        api,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "mine", "namespace": hoster_namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]
                }
            },
        },
    ).create()
    pod = pykube.Pod(
        api,
        {
            "metadata": {"name": "wants-the-gpu", "namespace": hoster_namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    pod.create()
    conditions = wait_for(
        "kube-scheduler to judge the pod",
        lambda: (pod.reload(), pod.obj.get("status", {}).get("conditions") or [])[1],
        until=lambda found: any(c.get("type") == "PodScheduled" for c in found),
        timeout=TIMEOUT,
    )
    [scheduled] = [c for c in conditions if c.get("type") == "PodScheduled"]
    assert (scheduled["status"], scheduled.get("reason")) == ("False", "Unschedulable")
    assert not pod.obj["spec"].get("nodeName")
    assert allocation(api, hoster_namespace, "mine") is None
    assert allocation(api, tenant, "hold") == held


def test_a_vm_with_a_dra_claim_template_starts_where_its_claims_hold_is(
    api: pykube.HTTPClient, dra_class: str, tenant: str
) -> None:
    v = create_vmi(api, tenant, "vm-t", [{"claimTemplate": {"className": CLASS_B, "count": 1}}])
    # The template claim is named after the VMI and its hold after the claim, before both exist.
    assert v.obj["spec"]["resourceClaims"] == [
        {"name": "gpuop-0", "resourceClaimName": "vm-t-gpu-0"}
    ]
    assert bound_node(api, tenant, "vm-t-gpu-0", timeout=TIMEOUT) == NODE_B
    launcher = launcher_pod(api, tenant)
    assert launcher["spec"]["nodeName"] == NODE_B
    assert launcher["spec"]["resourceClaims"] == v.obj["spec"]["resourceClaims"]
    assert allocation(api, tenant, "vm-t-gpu-0") is not None
