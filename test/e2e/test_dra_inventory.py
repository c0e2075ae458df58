"""DRA classes on the real API server and kube-scheduler (docs/design.md §2, §5 "DRA
classes"): a driver stand-in's ResourceSlices are accepted, a GPUClass with ``source.dra``
is accepted and its union and immutability rules refuse what they must, the pure model's
free devices match what the API server holds (before and after an outside allocator's
allocation and a device taint), and kube-scheduler places a pod referencing the allocated
ResourceClaim on the allocated node while a pod asking for the held device stays
unschedulable.

The oracle for the free counts is the profile's arithmetic, not the model."""

from __future__ import annotations

import copy
import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykube
import pytest

from gpuoperator.kinds import DeviceClass, GPUClass, GPUNode, ResourceClaim, ResourceSlice
from gpuoperator.model import dra_devices
from harness import dra_driver, objects
from harness.dra_driver import DRIVER, DraNodeGroup, GpuGroup
from harness.kube import Obj, refused, replace
from harness.operator import Start
from harness.tenancy import as_tenant
from harness.waiting import HopelessWaitError, wait_for
from localcluster.cluster import kubectl

pytestmark = pytest.mark.e2e

TAG = uuid.uuid4().hex[:5]
#: Two nodes: four A10s over two PCIe roots, and two A10s beside two L40Ss.
PROFILE = [
    DraNodeGroup(
        name=f"dra-{TAG}-a", gpus=[GpuGroup(model="A10", count=4, pcieRoots=2, numaNodes=2)]
    ),
    DraNodeGroup(
        name=f"dra-{TAG}-b",
        gpus=[GpuGroup(model="A10", count=2), GpuGroup(model="L40S", memory="48Gi", count=2)],
    ),
]
NODE_A, NODE_B = f"dra-{TAG}-a", f"dra-{TAG}-b"
A10_CLASS = f"a10-{TAG}.example.com"
A10_SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "A10"'


class World:
    def __init__(self, api: pykube.HTTPClient, namespace: str, driver: dra_driver.DraDriver):
        self.api = api
        self.namespace = namespace
        self.driver = driver

    def slices(self) -> list[Obj]:
        """The driver's slices as the API server holds them (read by the admin)."""
        query = ResourceSlice.objects(self.api).filter(field_selector={"spec.driver": DRIVER})
        return [s.obj for s in query if s.obj["spec"].get("nodeName") in (NODE_A, NODE_B)]

    def device_class(self, name: str = A10_CLASS) -> Obj:
        obj: Obj = DeviceClass.objects(self.api).get(name=name).obj
        return obj

    def claims(self) -> list[Obj]:
        return [c.obj for c in ResourceClaim.objects(self.api, namespace=self.namespace)]

    def inventory(self, **kwargs: Any) -> dra_devices.Inventory:
        return dra_devices.inventory(self.slices(), self.device_class(), self.claims(), **kwargs)

    def free(self) -> dict[str, int]:
        return {node: view.free for node, view in self.inventory().nodes.items()}


device_class = dra_driver.device_class


@pytest.fixture(scope="module")
def world(api: pykube.HTTPClient) -> Iterator[World]:
    ns = f"dra-{TAG}"
    with dra_driver.installed(api, ns, PROFILE, [device_class(A10_CLASS, A10_SELECTOR)]) as driver:
        yield World(api, ns, driver)


def allocate(world: World, name: str, node: str, device: str, request: str = "gpu") -> Obj:
    """A ResourceClaim for one device of the A10 class, allocated as an outside allocator
    does: the allocation written through the status subresource."""
    claim = ResourceClaim(
        world.api,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": world.namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": request,
                            "exactly": {
                                "deviceClassName": A10_CLASS,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ]
                }
            },
        },
    )
    claim.create()
    # allocationTimestamp is not optional for an outside allocator: without it kube-scheduler
    # sets it when it reserves the claim for a pod, and the API server refuses that change
    # (status.allocation is immutable), so the pod stays Pending with a SchedulerError.
    claim.obj["status"] = {
        "allocation": {
            "allocationTimestamp": datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "devices": {
                "results": [{"request": request, "driver": DRIVER, "pool": node, "device": device}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    replace(claim, subresource="status")
    claim.reload()
    stored: Obj = claim.obj
    return stored


def pod(world: World, name: str, claim: Obj) -> pykube.Pod:
    obj = pykube.Pod(
        world.api,
        {
            "metadata": {"name": name, "namespace": world.namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", **claim}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    obj.create()
    return obj


# ---------------------------------------------------------------------------------------
# the driver's slices and the model


def test_the_drivers_slices_are_accepted_as_its_own_account(world: World) -> None:
    held = {s["spec"]["nodeName"]: s for s in world.slices()}
    assert set(held) == {NODE_A, NODE_B}
    a = held[NODE_A]["spec"]
    assert a["pool"] == {"name": NODE_A, "generation": 1, "resourceSliceCount": 1}
    assert [d["attributes"]["pcieRoot"]["string"] for d in a["devices"]] == [
        "pci0",
        "pci1",
        "pci0",
        "pci1",
    ]
    assert a["devices"][0]["capacity"]["memory"]["value"] == "24Gi"
    # The account manages slices and nothing else.
    with refused(403):
        pykube.Node.objects(world.driver.client).get(name=NODE_A)


def test_the_model_counts_the_free_devices_the_api_server_holds(world: World) -> None:
    assert world.free() == {NODE_A: 4, NODE_B: 2}
    inv = world.inventory(topology_attribute=f"{DRIVER}/pcieRoot")
    assert inv.reasons == ()
    assert inv.nodes[NODE_A].free_by_topology() == {"pci0": 2, "pci1": 2}


def test_an_outside_allocation_takes_a_device_and_kube_scheduler_honours_it(
    world: World,
) -> None:
    claim = allocate(world, "held", NODE_B, "gpu-1")
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    assert world.free() == {NODE_A: 4, NODE_B: 1}
    held = [d for d in world.inventory().nodes[NODE_B].devices if d.held]
    assert [d.ref for d in held] == [dra_devices.DeviceRef(DRIVER, NODE_B, "gpu-1")]

    placed = pod(world, "uses-held", {"resourceClaimName": "held"})
    wait_for(
        "the pod of the allocated claim to run on its node",
        lambda: (placed.reload(), placed.obj)[1],
        lambda p: p["spec"].get("nodeName") == NODE_B and p["status"].get("phase") == "Running",
        timeout=60,
    )
    reserved = ResourceClaim.objects(world.api, namespace=world.namespace).get(name="held")
    assert [r["name"] for r in reserved.obj["status"]["reservedFor"]] == ["uses-held"]

    # A pod asking, through a template, for exactly the held device cannot be scheduled.
    only = f"held-uuid-{TAG}.example.com"
    dc = DeviceClass(
        world.api,
        device_class(only, f'device.attributes["{DRIVER}"].uuid == "GPU-{NODE_B}-1"'),
    )
    dc.create()
    try:
        template = pykube.object_factory(world.api, "resource.k8s.io/v1", "ResourceClaimTemplate")
        template(
            world.api,
            {
                "metadata": {"name": "same-device", "namespace": world.namespace},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": only}}]
                        }
                    }
                },
            },
        ).create()
        waiting = pod(world, "wants-held", {"resourceClaimTemplateName": "same-device"})

        def unschedulable(p: Obj) -> bool:
            return any(
                c["type"] == "PodScheduled"
                and c["status"] == "False"
                and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )

        seen = wait_for(
            "kube-scheduler to find the held device unavailable",
            lambda: (waiting.reload(), waiting.obj)[1],
            unschedulable,
            timeout=60,
        )
        assert not seen["spec"].get("nodeName")
    finally:
        dc.delete()
    # The allocation outlives its pod.
    placed.delete()
    wait_for(
        "the pod to be gone",
        lambda: pykube.Pod.objects(world.api, namespace=world.namespace).get_or_none(
            name="uses-held"
        ),
        lambda p: p is None,
        timeout=60,
    )
    after = ResourceClaim.objects(world.api, namespace=world.namespace).get(name="held")
    assert after.obj["status"]["allocation"] == claim["status"]["allocation"]
    assert world.free()[NODE_B] == 1


def test_a_device_taint_bumps_the_generation_and_takes_the_device(world: World) -> None:
    before = world.free()[NODE_A]
    stored = world.driver.taint(NODE_A, "gpu-0", "NoSchedule")
    assert stored["spec"]["pool"]["generation"] == 2
    kept = stored["spec"]["devices"][0].get("taints")
    assert kept and kept[0]["effect"] == "NoSchedule", "the API server dropped device taints"
    assert world.free()[NODE_A] == before - 1
    assert world.inventory(topology_attribute="pcieRoot").nodes[NODE_A].free_by_topology() == {
        "pci0": 1,
        "pci1": 2,
    }


def hand_count(world: World, node: str) -> dict[str, int]:
    """The node's A10 devices counted by hand from the API server's objects: the oracle of
    the GPUNode's ``draDevices`` (not the model's code)."""
    [published] = [s for s in world.slices() if s["spec"]["nodeName"] == node]
    a10 = [d for d in published["spec"]["devices"] if d["attributes"]["model"]["string"] == "A10"]
    held = {
        r["device"]
        for c in world.claims()
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results", []
        )
        if r["pool"] == node
    }
    names_ = {d["name"] for d in a10}
    tainted = {
        d["name"]
        for d in a10
        if any(t["effect"] in ("NoSchedule", "NoExecute") for t in d.get("taints") or [])
    }
    return {
        "count": len(a10),
        "allocated": len(held & names_),
        "tainted": len(tainted),
        "free": len(names_ - held - tainted),
    }


@pytest.mark.operator_process
def test_the_gpunode_reports_a_dra_class_devices_per_node_and_kubectl_shows_them(
    world: World,
    api: pykube.HTTPClient,
    made_classes: list[GPUClass],
    start_operator: Start,
    kubeconfig: Path,
) -> None:
    name = f"dra-nodes-{TAG}"
    create(api, made_classes, dra_class(name))
    start_operator()

    def figures(node: str) -> dict[str, int] | None:
        found = GPUNode.objects(api).get_or_none(name=node)
        entries = ((found.obj if found is not None else {}).get("status") or {}).get(
            "draDevices"
        ) or []
        mine = [e for e in entries if e["name"] == name]
        if not mine:
            return None
        assert mine[0]["deviceClassName"] == A10_CLASS
        return {k: mine[0][k] for k in ("count", "allocated", "tainted", "free")}

    for node in (NODE_A, NODE_B):
        wait_for(
            f"GPUNode {node} to report the class's devices",
            lambda node=node: (figures(node), hand_count(world, node)),  # type: ignore[misc]
            lambda pair: pair[0] == pair[1],
            timeout=60,
        )
    # A new taint on a free device moves the figures without a restart.
    untainted = [
        d["name"]
        for s in world.slices()
        if s["spec"]["nodeName"] == NODE_B
        for d in s["spec"]["devices"]
        if not d.get("taints") and d["attributes"]["model"]["string"] == "A10"
    ]
    world.driver.taint(NODE_B, untainted[-1], "NoExecute")
    expected = hand_count(world, NODE_B)
    assert expected["tainted"] >= 1
    wait_for(
        f"GPUNode {NODE_B} to count the new taint",
        lambda: figures(NODE_B),
        lambda got: got == expected,
        timeout=60,
    )
    lines = kubectl(kubeconfig, "get", "gpunodes", NODE_B, "-o", "wide").splitlines()
    header = lines[0].split()
    assert {"DRACLASSES", "DRAFREE", "DRATAINTED"} <= set(header)
    assert name in lines[1].split()


# ---------------------------------------------------------------------------------------
# the GPUClass API


def dra_class(name: str, **dra: Any) -> Obj:
    source = {"dra": {"deviceClassName": A10_CLASS, **dra}}
    return objects.gpuclass(name, source=source, vendor="nvidia", model="A10")


@pytest.fixture
def made_classes(api: pykube.HTTPClient) -> Iterator[list[GPUClass]]:
    made: list[GPUClass] = []
    yield made
    for cls in made:
        cls.delete()


def create(api: pykube.HTTPClient, made: list[GPUClass], obj: Obj) -> GPUClass:
    cls = GPUClass(api, obj)
    cls.create()
    made.append(cls)
    return cls


def test_a_dra_class_is_accepted_and_listed_with_its_device_class(
    api: pykube.HTTPClient, made_classes: list[GPUClass], kubeconfig: Path
) -> None:
    name = f"dra-{TAG}"
    cls = create(api, made_classes, dra_class(name, topologyAttribute=f"{DRIVER}/pcieRoot"))
    assert cls.obj["spec"]["source"] == {
        "dra": {"deviceClassName": A10_CLASS, "topologyAttribute": f"{DRIVER}/pcieRoot"}
    }
    lines = kubectl(kubeconfig, "get", "gpuclasses", name, "-o", "wide").splitlines()
    assert "DEVICECLASS" in lines[0].split()
    # The Resource column is empty for a DRA class, so the row has one word fewer.
    assert A10_CLASS in lines[1].split()


@pytest.mark.parametrize(
    ("dra", "fragments"),
    [
        pytest.param(
            {"deviceClassName": "GPU_Class"},
            ("spec.source.dra.deviceClassName", "DNS subdomain", "not GPU_Class"),
            id="device-class-not-a-subdomain",
        ),
        pytest.param(
            {"deviceClassName": "g" * 254},
            ("spec.source.dra.deviceClassName", "253"),
            id="device-class-too-long",
        ),
        pytest.param({}, ("deviceClassName", "Required"), id="device-class-missing"),
        pytest.param(
            {"deviceClassName": "gpu", "topologyAttribute": "pcie-root"},
            ("spec.source.dra.topologyAttribute", "C identifier", "not pcie-root"),
            id="topology-not-an-identifier",
        ),
        pytest.param(
            {"deviceClassName": "gpu", "topologyAttribute": "x" * 33},
            ("spec.source.dra.topologyAttribute", "32 characters"),
            id="topology-identifier-too-long",
        ),
    ],
)
def test_an_invalid_dra_source_is_refused_naming_field_value_and_what_is_allowed(
    api: pykube.HTTPClient,
    made_classes: list[GPUClass],
    dra: Obj,
    fragments: tuple[str, ...],
) -> None:
    obj = dra_class(f"bad-{uuid.uuid4().hex[:6]}")
    obj["spec"]["source"]["dra"] = dra
    with refused() as r:
        create(api, made_classes, obj)
    for fragment in fragments:
        assert fragment in r[0].message, r[0].message


def test_both_members_are_refused_as_a_union(
    api: pykube.HTTPClient, made_classes: list[GPUClass]
) -> None:
    obj = dra_class(f"both-{TAG}")
    obj["spec"]["source"]["devicePlugin"] = {"resourceName": "nvidia.com/GA102GL_A10"}
    with refused() as r:
        create(api, made_classes, obj)
    message = r[0].message
    assert "spec.source" in message and "exactly one member" in message, message


@pytest.mark.parametrize(
    "source",
    [
        pytest.param({"dra": {"deviceClassName": "other.example.com"}}, id="device-class"),
        pytest.param(
            {"dra": {"deviceClassName": A10_CLASS, "topologyAttribute": "numaNode"}},
            id="topology-added",
        ),
        pytest.param({"devicePlugin": {"resourceName": "nvidia.com/x"}}, id="to-device-plugin"),
    ],
)
def test_a_dra_source_is_immutable(
    api: pykube.HTTPClient, made_classes: list[GPUClass], source: Obj
) -> None:
    cls = create(api, made_classes, dra_class(f"imm-{uuid.uuid4().hex[:6]}"))
    before = copy.deepcopy(cls.obj["spec"])

    def attempt() -> str | None:
        """The refusal's message; ``None`` when another writer (an operator replica
        adding its finalizer or status) raced this update (409), so it is tried again."""
        cls.reload()
        cls.obj["spec"]["source"] = source
        try:
            replace(cls)
        except pykube.exceptions.HTTPError as exc:
            if exc.code == 409:
                return None
            if exc.code != 422:
                raise HopelessWaitError(f"expected HTTP 422, got {exc.code}: {exc}") from exc
            return str(exc)
        raise HopelessWaitError(f"the API server accepted spec.source {source}")

    message = wait_for("a refused, uncontended update", attempt, lambda m: m is not None)
    assert message is not None
    assert "spec.source" in message and "immutable" in message, message
    cls.reload()
    assert cls.obj["spec"] == before


def test_an_edit_tenant_cannot_create_a_dra_class(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str
) -> None:
    tenant = as_tenant(kubeconfig, api, namespace)
    with refused(403):
        GPUClass(tenant, dra_class(f"tenant-{TAG}")).create()
    assert GPUClass.objects(api).get_or_none(name=f"tenant-{TAG}") is None
