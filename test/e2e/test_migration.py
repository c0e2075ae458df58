"""Live migration on the real control plane (docs/design.md §5 "Live migration"), with the
KubeVirt stand-in playing virt-controller: a vGPU VM migrates to another node and each of
its claims follows it; a migration with no room on any other node is ended at once and the
VM keeps running where it is; a drain of a node whose VM may live-migrate empties the node
of the VM, its claim moving with it. The suite's over-allocation check closes every test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import KubeVirt, VirtualMachineInstance, VirtualMachineInstanceMigration
from harness.claims import bound_node, claim_status, create_claim, event_messages, start_vm
from harness.fleet import Fleet, published
from harness.kube import Obj
from harness.kubevirt import vgpu_migration_config
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator

CONVERGE = 30.0
#: The vGPU profile of the module's class, a mediated device in the KubeVirt CR.
PROFILE = "G1-4Q"


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


@pytest.fixture
def live_migration(api: pykube.HTTPClient, fleet: Fleet, tenant: str) -> Iterator[None]:
    """The KubeVirt CR as a hoster sets it for vGPU live migration: the fleet's resource a
    mediated device, the ``VGPULiveMigration`` feature gate on. Cluster-wide in effect, so
    deleted after the test whatever happens."""
    config = KubeVirt(api, vgpu_migration_config(tenant, fleet.resource, PROFILE))
    config.create()
    try:
        yield
    finally:
        config.delete()


def vgpu_class(api: pykube.HTTPClient, fleet: Fleet, tenant: str) -> str:
    """A vGPU class of the fleet's resource, once the tenant (entitled to vGPU here) may
    order it: the order webhook judges on its caches, so a dry-run order is repeated until
    it is admitted."""
    pykube.Namespace.objects(api).get(name=tenant).patch(
        {"metadata": {"labels": {names.VGPU_ENTITLED_LABEL: names.TRUE}}}
    )
    cls = fleet.gpu_class(mode="vgpu", profile=PROFILE)
    probe = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"name": "probe", "namespace": tenant},
        "spec": {"className": cls, "count": 1},
    }

    def admitted() -> bool:
        response = api.post(
            url="gpuclaims?dryRun=All",
            version=names.API_VERSION,
            namespace=tenant,
            data=json.dumps(probe),
        )
        return response.ok or "not entitled" not in response.text

    wait_for(f"{tenant} entitled to vGPU", admitted, timeout=CONVERGE)
    return cls


def vmi_of(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    return dict(VirtualMachineInstance.objects(api, namespace=ns).get(name=name).obj)


def launcher_pods(api: pykube.HTTPClient, ns: str, vm: str) -> list[Obj]:
    query = pykube.Pod.objects(api, namespace=ns).filter(
        selector={"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": vm}
    )
    return [dict(p.obj) for p in query.iterator()]


def migrate(api: pykube.HTTPClient, ns: str, vm: str) -> Obj:
    obj = VirtualMachineInstanceMigration(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": f"migrate-{vm}", "namespace": ns},
            "spec": {"vmiName": vm},
        },
    )
    obj.create()
    return dict(obj.obj)


def migrations(api: pykube.HTTPClient, ns: str) -> list[Obj]:
    return [
        dict(m.obj) for m in VirtualMachineInstanceMigration.objects(api, namespace=ns).iterator()
    ]


def condition(api: pykube.HTTPClient, ns: str, name: str, kind: str) -> Obj | None:
    found: list[Obj] = claim_status(api, ns, name).get("conditions", [])
    return next((c for c in found if c["type"] == kind), None)


def moved(api: pykube.HTTPClient, ns: str, claim: str, vm: str, source: str) -> str:
    """Wait until the VM runs on another node than ``source`` and ``claim`` is Bound there
    (reason ``Migrated``, its transient hold cleared); returns that node."""
    vmi = wait_for(
        f"VM {vm} on another node than {source}",
        partial(vmi_of, api, ns, vm),
        until=lambda v: (v.get("status") or {}).get("nodeName") not in (None, source),
        timeout=60,
    )
    target = str(vmi["status"]["nodeName"])
    status = wait_for(
        f"{ns}/{claim} Bound to {target} as Migrated",
        partial(claim_status, api, ns, claim),
        until=lambda s: (
            s.get("nodeName") == target
            and "migration" not in s
            and any(
                c["type"] == "Bound" and c.get("reason") == "Migrated"
                for c in s.get("conditions", [])
            )
        ),
        timeout=CONVERGE,
    )
    assert status["phase"] == "Bound"
    return target


def test_a_vgpu_vm_migrates_and_its_claim_follows(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, live_migration: None
) -> None:
    cls = vgpu_class(api, fleet, tenant)
    nodes = {fleet.node(1), fleet.node(1)}
    published(api, cls, 1)
    create_claim(api, tenant, "held", cls, 1)
    source = bound_node(api, tenant, "held")
    start_vm(api, tenant, "vm-1", "held", timeout=CONVERGE)
    [source_pod] = launcher_pods(api, tenant, "vm-1")
    assert source_pod["spec"]["nodeName"] == source

    job = migrate(api, tenant, "vm-1")
    target = moved(api, tenant, "held", "vm-1", source)
    assert target in nodes - {source}
    done = wait_for(
        "the migration Succeeded",
        lambda: (
            VirtualMachineInstanceMigration.objects(api, namespace=tenant)
            .get(name=job["metadata"]["name"])
            .obj
        ),
        until=lambda m: (m.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        timeout=CONVERGE,
    )
    assert done["status"]["phase"] == "Succeeded"
    [message] = wait_for(
        "the Migrated Event on held",
        partial(event_messages, api, tenant, "held", "Migrated"),
        timeout=CONVERGE,
    )
    assert source in message and target in message, message

    # The VM's one launcher pod is the target pod, pinned to the target node by placement.
    pods = wait_for(
        "the source pod gone",
        partial(launcher_pods, api, tenant, "vm-1"),
        until=lambda found: len(found) == 1,
        timeout=CONVERGE,
    )
    [pod] = pods
    assert pod["metadata"]["labels"]["kubevirt.io/migrationJobUID"] == job["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == target
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {"key": "metadata.name", "operator": "In", "values": [target]} in [
        field for term in terms for field in term.get("matchFields", [])
    ]
    assert not pod["spec"].get("schedulingGates")

    # The source's unit is free again: the next order of the class is bound there.
    published(api, cls, 1, timeout=CONVERGE)
    create_claim(api, tenant, "next", cls, 1)
    assert bound_node(api, tenant, "next", timeout=CONVERGE) == source


def test_a_migration_without_room_elsewhere_ends_at_once_and_the_vm_stays(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, live_migration: None
) -> None:
    cls = vgpu_class(api, fleet, tenant)
    fleet.node(1)
    fleet.node(1)
    published(api, cls, 1)
    create_claim(api, tenant, "held", cls, 1)
    source = bound_node(api, tenant, "held")
    create_claim(api, tenant, "other", cls, 1)  # the other node's one unit
    assert bound_node(api, tenant, "other") != source
    start_vm(api, tenant, "vm-1", "held", timeout=CONVERGE)
    [source_pod] = launcher_pods(api, tenant, "vm-1")

    migrate(api, tenant, "vm-1")
    refused = wait_for(
        "Migrating False on held",
        partial(condition, api, tenant, "held", "Migrating"),
        until=lambda c: c is not None and c["status"] == "False",
        timeout=CONVERGE,
    )
    assert refused is not None and refused["reason"] == "NoTargetCapacity", refused
    wait_for(
        "the migration deleted",
        partial(migrations, api, tenant),
        until=lambda found: found == [],
        timeout=CONVERGE,
    )
    [told] = wait_for(
        "the NoTargetCapacity Event on held",
        partial(event_messages, api, tenant, "held", "NoTargetCapacity"),
        timeout=CONVERGE,
    )
    assert "migration migrate-vm-1 was cancelled" in told, told
    status = claim_status(api, tenant, "held")
    assert status["phase"] == "Bound" and status["nodeName"] == source
    assert "migration" not in status
    vmi = vmi_of(api, tenant, "vm-1")
    assert vmi["status"]["phase"] == "Scheduled" and vmi["status"]["nodeName"] == source
    assert [p["metadata"]["name"] for p in launcher_pods(api, tenant, "vm-1")] == [
        source_pod["metadata"]["name"]
    ]


def test_a_drain_live_migrates_a_vm_off_the_cordoned_node(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, live_migration: None
) -> None:
    cls = vgpu_class(api, fleet, tenant)
    fleet.node(1)
    fleet.node(1)
    published(api, cls, 1)
    create_claim(api, tenant, "held", cls, 1)
    source = bound_node(api, tenant, "held")
    start_vm(api, tenant, "vm-1", "held", timeout=CONVERGE, evictionStrategy="LiveMigrate")

    pykube.Node.objects(api).get(name=source).patch({"spec": {"unschedulable": True}})
    target = moved(api, tenant, "held", "vm-1", source)
    assert target != source
    wait_for(
        f"no pod of vm-1 left on {source}",
        partial(launcher_pods, api, tenant, "vm-1"),
        until=lambda pods: [p["spec"].get("nodeName") for p in pods] == [target],
        timeout=CONVERGE,
    )
    assert condition(api, tenant, "held", "DrainBlocked") is None
    [job] = migrations(api, tenant)
    assert job["spec"]["vmiName"] == "vm-1"
    assert job["status"]["phase"] == "Succeeded"
