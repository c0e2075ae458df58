"""The binder on a DRA class, on the real control plane (docs/design.md §5 "DRA classes",
"Binding"): an order binds to named devices through a ResourceClaim the claim controls,
allocated as an outside allocator allocates; kube-scheduler places a pod that uses that
ResourceClaim on the claim's node; deleting the claim frees its devices; a two-device claim
takes devices of one PCIe root; the tenant can neither delete the hold nor edit it
(``config/policy/dra-holds.yaml``).

The oracle is the driver's published devices and the ResourceClaims the API server holds,
never the operator's ledger."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator.kinds import GPUClaim, GPUClass, ResourceClaim
from gpuoperator.model import dra_holds
from harness import dra_driver, objects
from harness.claims import create_claim
from harness.dra_claims import DraClaims
from harness.dra_driver import DRIVER, DraNodeGroup, GpuGroup
from harness.kube import refused
from harness.operator import Start
from harness.tenancy import as_tenant
from harness.waiting import wait_for

pytestmark = pytest.mark.operator_process  # it starts its own replicas

TAG = uuid.uuid4().hex[:5]
#: Node A: four A10s over two PCIe roots (gpu-0, gpu-2 on pci0; gpu-1, gpu-3 on pci1);
#: node B: two A10s on one root.
NODE_A, NODE_B = f"drabind-{TAG}-a", f"drabind-{TAG}-b"
PROFILE = [
    DraNodeGroup(name=NODE_A, gpus=[GpuGroup(model="A10", count=4, pcieRoots=2)]),
    DraNodeGroup(name=NODE_B, gpus=[GpuGroup(model="A10", count=2)]),
]
DEVICE_CLASS = f"a10-bind-{TAG}.example.com"
#: Only this module's nodes' devices (the driver stand-in names each ``GPU-<node>-<i>``).
SELECTOR = f'device.attributes["{DRIVER}"].uuid.startsWith("GPU-drabind-{TAG}-")'
CLASS = f"dra-bind-{TAG}"
TIMEOUT = 60.0


class World(DraClaims):
    def __init__(self, api: pykube.HTTPClient, namespace: str) -> None:
        super().__init__(api, namespace, TIMEOUT)

    def allocations(self) -> list[tuple[str, str, str]]:
        """Every device the ResourceClaims of the namespace hold, once per holder."""
        return [
            (r.driver, r.pool, r.device)
            for c in ResourceClaim.objects(self.api, namespace=self.namespace)
            for r in dra_holds.allocated(c.obj)
        ]


def published_roots(node: str) -> dict[str, str]:
    """Device name → its PCIe root, as the driver stand-in publishes it."""
    return {g.name: g.pcie_root for g in dra_driver.expand(PROFILE)[node]}


@pytest.fixture(scope="module")
def world(api: pykube.HTTPClient) -> Iterator[World]:
    ns = f"drabind-{TAG}"
    with dra_driver.installed(api, ns, PROFILE, [dra_driver.device_class(DEVICE_CLASS, SELECTOR)]):
        source = {"dra": {"deviceClassName": DEVICE_CLASS, "topologyAttribute": "pcieRoot"}}
        cls = GPUClass(api, objects.gpuclass(CLASS, source=source, vendor="nvidia", model="A10"))
        cls.create()
        try:
            yield World(api, ns)
        finally:
            for claim in GPUClaim.objects(api, namespace=ns):
                claim.delete()
            cls.delete()


def delete_claim(world: World, name: str) -> None:
    found = GPUClaim.objects(world.api, namespace=world.namespace).get(name=name)
    found.delete()
    wait_for(
        f"claim {name} and its ResourceClaim to be gone",
        lambda: (world.claim(name), world.hold(name)),
        lambda both: both == (None, None),
        timeout=TIMEOUT,
    )


def test_an_order_binds_to_named_devices_and_kube_scheduler_places_a_pod_using_them(
    world: World, start_operator: Start
) -> None:
    start_operator()  # binpack: the one device goes to node B, the node with less free
    create_claim(world.api, world.namespace, "one", CLASS, 1)
    claim = world.bound("one")

    status = claim["status"]
    assert status["nodeName"] == NODE_B
    assert status["resourceClaimName"] == "one"
    [device] = status["devices"]
    assert device["driver"] == DRIVER and device["pool"] == NODE_B
    assert device["device"] in published_roots(NODE_B)
    hold = world.hold("one")
    assert hold is not None and dra_holds.is_hold_of(hold, claim)
    assert world.allocations() == [(DRIVER, NODE_B, device["device"])]
    assert hold["status"]["allocation"]["nodeSelector"] == dra_holds.node_selector(NODE_B)

    # kube-scheduler honours the allocation: a pod that uses the ResourceClaim runs there.
    pod = pykube.Pod(
        world.api,
        {
            "metadata": {"name": "uses-one", "namespace": world.namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "one"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    pod.create()
    wait_for(
        "the pod using the hold to run on the claim's node",
        lambda: (pod.reload(), pod.obj)[1],
        lambda p: p["spec"].get("nodeName") == NODE_B and p["status"].get("phase") == "Running",
        timeout=TIMEOUT,
    )
    pod.delete()
    wait_for(
        "the pod to be gone",
        lambda: pykube.Pod.objects(world.api, namespace=world.namespace).get_or_none(
            name="uses-one"
        ),
        lambda p: p is None,
        timeout=TIMEOUT,
    )

    # Deleting the claim frees the device: its ResourceClaim is collected with it.
    delete_claim(world, "one")
    assert world.allocations() == []


def test_a_two_device_claim_takes_one_pcie_root_and_a_second_the_other(
    world: World, start_operator: Start
) -> None:
    start_operator("--placement-policy=spread")  # the node with the most free: node A
    create_claim(world.api, world.namespace, "pair", CLASS, 2)
    first = world.bound("pair")["status"]
    create_claim(world.api, world.namespace, "pair-2", CLASS, 2)
    second = world.bound("pair-2")["status"]

    roots = published_roots(NODE_A)
    assert first["nodeName"] == NODE_A
    assert len({roots[d["device"]] for d in first["devices"]}) == 1
    # Spread again: A has 2 free, B 2; ties go to the smaller name, node A's other root.
    assert second["nodeName"] == NODE_A
    assert len({roots[d["device"]] for d in second["devices"]}) == 1
    held = world.allocations()
    assert len(held) == len(set(held)) == 4  # never a device twice
    assert {d for _, _, d in held} == set(roots)
    for name, status in (("pair", first), ("pair-2", second)):
        hold = world.hold(name)
        assert hold is not None
        assert [(r.driver, r.pool, r.device) for r in dra_holds.allocated(hold)] == [
            (d["driver"], d["pool"], d["device"]) for d in status["devices"]
        ]
    delete_claim(world, "pair")
    delete_claim(world, "pair-2")


def test_the_tenant_can_neither_delete_nor_edit_the_hold_but_her_own_claims_are_hers(
    world: World, start_operator: Start, kubeconfig: Path
) -> None:
    start_operator()
    create_claim(world.api, world.namespace, "guarded", CLASS, 1)
    claim = world.bound("guarded")
    tenant = as_tenant(kubeconfig, world.api, world.namespace)
    hold = ResourceClaim.objects(tenant, namespace=world.namespace).get(name="guarded")

    with refused(403) as deleted:
        hold.delete()
    assert f"holds the devices of GPUClaim {world.namespace}/guarded" in deleted[0].message
    assert "may not" in deleted[0].message and "delete" in deleted[0].message
    unowned = copy.deepcopy(hold.obj)
    unowned["metadata"]["ownerReferences"] = []
    unowned["metadata"]["labels"] = {}
    with refused(403) as edited:
        ResourceClaim(tenant, unowned).update()
    assert "change" in edited[0].message

    kept = world.hold("guarded")
    assert kept is not None and dra_holds.is_hold_of(kept, claim)
    assert [r.device for r in dra_holds.allocated(kept)] == [
        d["device"] for d in claim["status"]["devices"]
    ]

    # The edit role may delete ResourceClaims: a claim of her own that holds nothing for a
    # GPUClaim (even one that carries the hold label) is hers to delete. It names a
    # DeviceClass no GPU class serves: one that does is refused her (test_dra_tenants.py).
    own = ResourceClaim(
        tenant,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "her-own",
                "namespace": world.namespace,
                "labels": {"gpu.cozystack.io/hold": "true"},
            },
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": f"other-{TAG}.example.com"}}
                    ]
                }
            },
        },
    )
    own.create()
    own.delete()

    # Garbage collection is the control plane: the hold still goes with its GPUClaim.
    delete_claim(world, "guarded")
    assert world.allocations() == []
