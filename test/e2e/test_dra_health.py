"""Device health of DRA holds on the real control plane (docs/design.md §5 "DRA classes"): the
driver stand-in taints a device a Bound claim holds, or stops publishing it, and the idle
hold moves to a healthy device (its ResourceClaim allocated there, Event ``Moved`` naming the
cause); a hold serving a running VM stays, with the ``DeviceUnhealthy`` condition, a Warning
Event and ``gpuoperator status --node``, and moves once the VM is stopped.

The claims are ordered and read as the tenant (the built-in ``edit`` role). The oracle is the
driver's published devices and the ResourceClaims the API server holds, never the ledger."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import (
    DeviceTaintRule,
    GPUClaim,
    GPUClass,
    GPUNode,
    ResourceClaim,
    VirtualMachineInstance,
)
from gpuoperator.model import dra_holds
from harness import dra_driver, objects
from harness.claims import bound_node, create_claim, create_vmi, node_report
from harness.dra_driver import DRIVER, DraNodeGroup, GpuGroup
from harness.kube import Obj
from harness.tenancy import as_tenant
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator

TAG = uuid.uuid4().hex[:5]
NODE_A, NODE_B = f"drahealth-{TAG}-a", f"drahealth-{TAG}-b"
PROFILE = [DraNodeGroup(name=n, gpus=[GpuGroup(model="A10", count=3)]) for n in (NODE_A, NODE_B)]
DEVICE_CLASS = f"a10-health-{TAG}.example.com"
SELECTOR = f'device.attributes["{DRIVER}"].uuid.startsWith("GPU-drahealth-{TAG}-")'
CLASS = f"dra-health-{TAG}"
TIMEOUT = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver(api: pykube.HTTPClient, hooks: WebhookOperator) -> Iterator[dra_driver.DraDriver]:
    device_classes = [dra_driver.device_class(DEVICE_CLASS, SELECTOR)]
    with dra_driver.installed(api, f"drahealth-{TAG}", PROFILE, device_classes) as published:
        cls = GPUClass(
            api,
            objects.gpuclass(
                CLASS,
                source={"dra": {"deviceClassName": DEVICE_CLASS}},
                vendor="nvidia",
                model="A10",
            ),
        )
        cls.create()
        try:
            yield published
        finally:
            cls.delete()


def claim_of(client: pykube.HTTPClient, ns: str, name: str) -> Obj:
    found: Obj = GPUClaim.objects(client, namespace=ns).get(name=name).obj
    return found


def held(api: pykube.HTTPClient, ns: str, name: str) -> list[tuple[str, str, str]]:
    found = ResourceClaim.objects(api, namespace=ns).get_or_none(name=name)
    return [] if found is None else [tuple(r) for r in dra_holds.allocated(found.obj)]  # type: ignore[misc]


def every_allocation(api: pykube.HTTPClient) -> list[tuple[str, str, str]]:
    """Every device any ResourceClaim of the cluster holds, once per holder."""
    return [
        (r.driver, r.pool, r.device)
        for c in ResourceClaim.objects(api, namespace=pykube.all)
        for r in dra_holds.allocated(c.obj)
    ]


def devices_of(claim: Obj) -> list[tuple[str, str, str]]:
    return [(d["driver"], d["pool"], d["device"]) for d in claim["status"].get("devices") or []]


def events(client: pykube.HTTPClient, ns: str, name: str) -> list[Obj]:
    return [
        e.obj
        for e in pykube.Event.objects(client, namespace=ns).filter(
            field_selector={"involvedObject.name": name, "involvedObject.kind": "GPUClaim"}
        )
    ]


def condition(claim: Obj, type_: str) -> Obj | None:
    found = (claim.get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == type_), None)


def moved_off(
    api: pykube.HTTPClient, tenant: pykube.HTTPClient, ns: str, name: str, bad: tuple[str, ...]
) -> Obj:
    """The claim once it holds devices other than ``bad``, with the oracle's checks: its
    ResourceClaim's allocation is what its status names, on its node, and no allocation of
    the cluster holds the bad device or any device twice."""
    claim = wait_for(
        f"claim {name} to move off {'/'.join(bad)}",
        lambda: claim_of(tenant, ns, name),
        lambda c: bool(devices_of(c)) and bad not in devices_of(c),
        timeout=TIMEOUT,
    )
    assert claim["status"]["phase"] == "Bound"
    assert held(api, ns, name) == devices_of(claim)
    hold = ResourceClaim.objects(api, namespace=ns).get(name=name).obj
    assert dra_holds.allocation_node(hold) == claim["status"]["nodeName"]
    assert {d[1] for d in devices_of(claim)} == {claim["status"]["nodeName"]}
    everything = every_allocation(api)
    assert bad not in everything
    assert len(everything) == len(set(everything))
    return claim


def release(api: pykube.HTTPClient, ns: str, name: str) -> None:
    GPUClaim.objects(api, namespace=ns).get(name=name).delete()
    wait_for(
        f"claim {name} and its hold gone",
        lambda: (
            GPUClaim.objects(api, namespace=ns).get_or_none(name=name),
            ResourceClaim.objects(api, namespace=ns).get_or_none(name=name),
        ),
        lambda both: both == (None, None),
        timeout=TIMEOUT,
    )


def test_a_tainted_held_device_moves_an_idle_hold(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "idle", CLASS, 1)
    node = bound_node(client, tenant, "idle", timeout=TIMEOUT)
    [bad] = devices_of(claim_of(client, tenant, "idle"))

    driver.taint(node, bad[2], "NoSchedule")

    claim = moved_off(api, client, tenant, "idle", bad)
    bound = condition(claim, "Bound")
    assert bound is not None and bound["reason"] == "Moved"
    found = wait_for(
        "the Moved Event naming the taint",
        lambda: [e for e in events(client, tenant, "idle") if e["reason"] == "Moved"],
        bool,
        timeout=TIMEOUT,
    )
    assert "DeviceTainted" in found[0]["message"] and "/".join(bad) in found[0]["message"]
    release(api, tenant, "idle")


def test_a_device_gone_from_the_slice_moves_an_idle_hold(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "vanish", CLASS, 1)
    node = bound_node(client, tenant, "vanish", timeout=TIMEOUT)
    [bad] = devices_of(claim_of(client, tenant, "vanish"))

    driver.publish(node, [g for g in driver.gpus[node] if g.name != bad[2]])

    claim = moved_off(api, client, tenant, "vanish", bad)
    assert "DeviceGone" in (condition(claim, "Bound") or {}).get("message", "")
    release(api, tenant, "vanish")


def test_a_running_vms_hold_is_reported_not_moved_and_moves_once_the_vm_stops(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "serving", CLASS, 1)
    node = bound_node(client, tenant, "serving", timeout=TIMEOUT)
    [bad] = devices_of(claim_of(client, tenant, "serving"))
    create_vmi(api, tenant, "vm-1", [{"claim": "serving"}])
    wait_for(
        "the VM to run and its claim to be attached",
        lambda: (
            VirtualMachineInstance.objects(api, namespace=tenant).get(name="vm-1").obj,
            claim_of(client, tenant, "serving"),
        ),
        lambda both: (
            (both[0].get("status") or {}).get("phase") in ("Scheduled", "Running")
            and (both[1]["status"].get("attachment") or {}).get("vmi") == "vm-1"
        ),
        timeout=TIMEOUT,
    )

    # NoSchedule: a NoExecute device taint would have kube-controller-manager evict the pod.
    driver.taint(node, bad[2], "NoSchedule")

    claim = wait_for(
        "the claim to report its unhealthy device",
        lambda: claim_of(client, tenant, "serving"),
        lambda c: condition(c, "DeviceUnhealthy") is not None,
        timeout=TIMEOUT,
    )
    flagged = condition(claim, "DeviceUnhealthy")
    assert flagged is not None and flagged["status"] == "True"
    assert flagged["reason"] == "DeviceTainted"
    assert f"{tenant}/vm-1" in flagged["message"] and "/".join(bad) in flagged["message"]
    assert devices_of(claim) == [bad] and held(api, tenant, "serving") == [bad]
    warned = wait_for(
        "the Warning Event",
        lambda: [e for e in events(client, tenant, "serving") if e["reason"] == "DeviceTainted"],
        bool,
        timeout=TIMEOUT,
    )
    assert warned[0]["type"] == "Warning"
    report = node_report(kubeconfig, node)
    assert "HOLDS ON UNHEALTHY DEVICES" in report
    [row] = [
        line
        for line in report.splitlines()
        if line.split()[:2] == [tenant, "serving"] and "STAYS" in line
    ]
    assert f"serves VM {tenant}/vm-1 (running)" in row

    # Stopping the VM makes the hold idle: it moves, and the condition goes.
    VirtualMachineInstance.objects(api, namespace=tenant).get(name="vm-1").delete()
    claim = moved_off(api, client, tenant, "serving", bad)
    assert condition(claim, "DeviceUnhealthy") is None
    release(api, tenant, "serving")


def all_healthy(driver: dra_driver.DraDriver) -> None:
    """Every node publishes all its devices again, untainted (the tests above taint and
    withdraw some)."""
    driver.publish_all(dra_driver.expand(PROFILE))


def test_a_hold_deleted_by_the_cluster_admin_is_held_again_and_its_device_kept(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    """The admin (``system:masters``, whom the dra-holds policy lets delete a hold) deletes
    an idle claim's ResourceClaim: the claim keeps naming its device, an order made right
    then gets the one other free device, and the hold comes back on the same device."""
    all_healthy(driver)
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "kept", CLASS, 1)
    node = bound_node(client, tenant, "kept", timeout=TIMEOUT)
    [device] = devices_of(claim_of(client, tenant, "kept"))
    other = NODE_B if node == NODE_A else NODE_A
    # Fill every other device but one, on the other node.
    fillers = [f"fill-{i}" for i in range(4)]
    for name in fillers:
        create_claim(client, tenant, name, CLASS, 1)
        bound_node(client, tenant, name, timeout=TIMEOUT)
    [free] = [
        (DRIVER, other, g.name)
        for g in driver.gpus[other]
        if (DRIVER, other, g.name) not in every_allocation(api)
    ]
    old = ResourceClaim.objects(api, namespace=tenant).get(name="kept").obj

    ResourceClaim.objects(api, namespace=tenant).get(name="kept").delete()
    create_claim(client, tenant, "next", CLASS, 1)

    assert bound_node(client, tenant, "next", timeout=TIMEOUT) == other
    assert devices_of(claim_of(client, tenant, "next")) == [free]
    hold = wait_for(
        "the hold to be created again",
        lambda: ResourceClaim.objects(api, namespace=tenant).get_or_none(name="kept"),
        lambda h: (
            h is not None
            and h.obj["metadata"]["uid"] != old["metadata"]["uid"]
            and bool(dra_holds.allocated(h.obj))
        ),
        timeout=TIMEOUT,
    )
    assert hold is not None
    assert [tuple(r) for r in dra_holds.allocated(hold.obj)] == [device]
    assert dra_holds.allocation_node(hold.obj) == node
    claim = claim_of(client, tenant, "kept")
    assert claim["status"]["phase"] == "Bound" and devices_of(claim) == [device]
    assert (condition(claim, "Bound") or {}).get("reason") == "HoldRestored"
    restored = wait_for(
        "the HoldRestored Event",
        lambda: [e for e in events(client, tenant, "kept") if e["reason"] == "HoldRestored"],
        bool,
        timeout=TIMEOUT,
    )
    assert "ResourceClaim kept was gone" in restored[0]["message"]
    everything = every_allocation(api)
    assert len(everything) == len(set(everything))
    for name in ["kept", "next", *fillers]:
        release(api, tenant, name)


def test_cordoning_a_dra_node_moves_its_idle_hold_to_the_other_node(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    all_healthy(driver)
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "drained", CLASS, 1)
    node = bound_node(client, tenant, "drained", timeout=TIMEOUT)
    [device] = devices_of(claim_of(client, tenant, "drained"))
    other = NODE_B if node == NODE_A else NODE_A
    cordoned = pykube.Node.objects(api).get(name=node)
    cordoned.patch({"spec": {"unschedulable": True}})
    try:
        claim = moved_off(api, client, tenant, "drained", device)
        assert claim["status"]["nodeName"] == other
        bound = condition(claim, "Bound")
        assert bound is not None and bound["reason"] == "Moved"
        assert bound["message"] == f"moved from {node} to {other}: node cordoned"
        assert condition(claim, "NodeCordoned") is None
        moved = wait_for(
            "the Moved Event",
            lambda: [e for e in events(client, tenant, "drained") if e["reason"] == "Moved"],
            bool,
            timeout=TIMEOUT,
        )
        assert moved[0]["message"] == f"moved from {node} to {other}: node cordoned"
        release(api, tenant, "drained")
    finally:
        cordoned.reload()
        cordoned.patch({"spec": {"unschedulable": False}})


def dra_figures(api: pykube.HTTPClient, node: str) -> dict[str, int] | None:
    """The GPUNode's ``draDevices`` entry of this module's class, as the API server has it."""
    found = GPUNode.objects(api).get_or_none(name=node)
    entries = ((found.obj if found is not None else {}).get("status") or {}).get("draDevices")
    mine = [e for e in entries or [] if e["name"] == CLASS]
    return {k: mine[0][k] for k in ("count", "allocated", "tainted", "free")} if mine else None


def test_a_device_taint_rule_on_a_held_device_moves_the_idle_hold_and_counts_as_tainted(
    api: pykube.HTTPClient, driver: dra_driver.DraDriver, tenant: str, kubeconfig: Path
) -> None:
    """The local control plane serves DeviceTaintRules (resource.k8s.io/v1beta2, the
    DRADeviceTaintRules gate on); the cluster admin's rule on a held device is read as the
    driver's own taint would be."""
    all_healthy(driver)
    client = as_tenant(kubeconfig, api, tenant)
    create_claim(client, tenant, "ruled", CLASS, 1)
    node = bound_node(client, tenant, "ruled", timeout=TIMEOUT)
    [device] = devices_of(claim_of(client, tenant, "ruled"))
    rule = DeviceTaintRule(
        api,
        {
            "apiVersion": names.DEVICE_TAINT_RULE_API_VERSION,
            "kind": names.DEVICE_TAINT_RULE_KIND,
            "metadata": {"name": f"maintenance-{TAG}"},
            "spec": {
                "deviceSelector": {"driver": device[0], "pool": device[1], "device": device[2]},
                "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
            },
        },
    )
    rule.create()
    try:
        claim = moved_off(api, client, tenant, "ruled", device)
        assert "DeviceTainted" in (condition(claim, "Bound") or {}).get("message", "")
        wait_for(
            f"GPUNode {node} to count the rule's taint",
            lambda: dra_figures(api, node),
            lambda got: got is not None and got["tainted"] == 1,
            timeout=TIMEOUT,
        )
        release(api, tenant, "ruled")
    finally:
        rule.delete()
    wait_for(
        f"GPUNode {node} to count no taint once the rule is gone",
        lambda: dra_figures(api, node),
        lambda got: got is not None and got["tainted"] == 0,
        timeout=TIMEOUT,
    )
