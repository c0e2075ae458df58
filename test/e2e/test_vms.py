"""VMs on claims, end to end, with the KubeVirt stand-in: the VMI webhook writes the GPU
entries and attaches held claims, the template controller orders template claims, the pod
webhook gates the launcher pod and the placement controller pins it to the claims' node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pykube
import pytest

from gpuoperator import names
from gpuoperator.runtime.kinds import GPUClaim, GPUClass, VirtualMachineInstance
from harness.fleet import Fleet
from harness.kube import Obj, refused
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, webhook_operator

CONVERGE = 30.0


@pytest.fixture(scope="module")
def hooks(
    api: pykube.HTTPClient, deployed: Deployed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookOperator]:
    with webhook_operator(api, deployed, tmp_path_factory.mktemp("vms")) as w:
        yield w


@pytest.fixture
def fleet(api: pykube.HTTPClient, hooks: WebhookOperator) -> Iterator[Fleet]:
    f = Fleet(api)
    yield f
    f.cleanup()


@pytest.fixture
def tenant(api: pykube.HTTPClient, hooks: WebhookOperator, kubevirt: object) -> str:
    ns = hooks.tenant(api)
    wait_for(
        "the default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=ns).get_or_none(name="default"),
    )
    return ns


def claim(api: pykube.HTTPClient, ns: str, name: str, cls: str, count: int) -> GPUClaim:
    c = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"className": cls, "count": count},
        },
    )
    c.create()
    return c


def bound_node(api: pykube.HTTPClient, ns: str, name: str) -> str:
    status = wait_for(
        f"claim {name} Bound",
        lambda: GPUClaim.objects(api, namespace=ns).get(name=name).obj.get("status") or {},
        until=lambda s: s.get("phase") == "Bound",
        timeout=CONVERGE,
    )
    return str(status["nodeName"])


def vmi(
    api: pykube.HTTPClient, ns: str, name: str, refs: list[Obj], **spec: Any
) -> VirtualMachineInstance:
    v = VirtualMachineInstance(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {names.CLAIMS_LABEL: "true"},
                "annotations": {names.CLAIMS_ANNOTATION: json.dumps(refs)},
            },
            "spec": {
                "domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}},
                **spec,
            },
        },
    )
    v.create()
    return v


def vmi_status(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    found = VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name=name)
    return dict((found.obj.get("status") or {}) if found else {})


def launcher(api: pykube.HTTPClient, ns: str) -> pykube.Pod:
    return wait_for(
        "the launcher pod",
        lambda: next(
            iter(
                pykube.Pod.objects(api, namespace=ns).filter(
                    selector={"kubevirt.io": "virt-launcher"}
                )
            ),
            None,
        ),
        until=lambda p: p is not None,
        timeout=CONVERGE,
    )


def test_a_vm_on_a_held_claim_starts_on_the_claims_node(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    fleet.node(4)
    claim(api, tenant, "hold", cls, 2)
    node = bound_node(api, tenant, "hold")
    v = vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    gpus = v.obj["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == [fleet.resource] * 2
    attached = GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"]
    assert attached["attachment"]["vmi"] == "vm-1"
    status = wait_for(
        "the VMI Scheduled",
        lambda: vmi_status(api, tenant, "vm-1"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    assert status["nodeName"] == node
    pod = launcher(api, tenant)
    assert pod.obj["spec"].get("schedulingGates") in (None, [])
    terms = pod.obj["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert any(e["values"] == [node] for t in terms for e in t["matchExpressions"])
    wait_for(
        "the attachment uid",
        lambda: (
            GPUClaim.objects(api, namespace=tenant)
            .get(name="hold")
            .obj["status"]["attachment"]
            .get("uid")
        ),
        until=lambda uid: uid == v.obj["metadata"]["uid"],
        timeout=CONVERGE,
    )
    # Created gated, then pinned and ungated by the placement controller in one update.
    wait_for(
        "a Pinned event on the launcher pod",
        lambda: len(
            pykube.Event.objects(api, namespace=tenant).filter(
                field_selector={"involvedObject.name": pod.name, "reason": "Pinned"}
            )
        ),
        until=lambda n: n >= 1,
        timeout=CONVERGE,
    )


def test_a_stopped_vm_keeps_its_claim_and_starts_again_on_the_same_node(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    fleet.node(4)
    claim(api, tenant, "hold", cls, 1)
    node = bound_node(api, tenant, "hold")
    first = vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-1"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    first.delete()
    wait_for(
        "the VMI gone",
        lambda: VirtualMachineInstance.objects(api, namespace=tenant).get_or_none(name="vm-1"),
        until=lambda o: o is None,
        timeout=CONVERGE,
    )
    wait_for(
        "the old launcher gone",
        lambda: len(pykube.Pod.objects(api, namespace=tenant)),
        until=lambda n: n == 0,
        timeout=CONVERGE,
    )
    held = GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"]
    assert (held["phase"], held["nodeName"]) == ("Bound", node), "a stopped VM's hold stays"
    vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    status = wait_for(
        "Scheduled again",
        lambda: vmi_status(api, tenant, "vm-1"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    assert status["nodeName"] == node


def test_a_vm_with_a_claim_template_gets_a_marked_claim_that_goes_with_it(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    v = vmi(api, tenant, "vm-t", [{"claimTemplate": {"className": cls, "count": 3}}])
    status = wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-t"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    claims = list(GPUClaim.objects(api, namespace=tenant))
    assert len(claims) == 1
    made = claims[0].obj
    assert made["metadata"]["labels"][names.TEMPLATE_CLAIM_LABEL] == "true"
    assert made["metadata"]["ownerReferences"][0]["uid"] == v.obj["metadata"]["uid"]
    assert made["status"]["nodeName"] == status["nodeName"]
    v.delete()
    # Garbage collection (kube-controller-manager) watches the VMI kind only after its
    # periodic discovery (30 s) has seen the CRD: allow for it on a fresh cluster.
    wait_for(
        "the template claim garbage-collected",
        lambda: len(list(GPUClaim.objects(api, namespace=tenant))),
        until=lambda n: n == 0,
        timeout=CONVERGE + 30,
    )
    wait_for(
        "the capacity returned",
        lambda: (GPUClass.objects(api).get(name=cls).obj.get("status") or {}).get("free"),
        until=lambda free: free == 4,
        timeout=CONVERGE,
    )


def test_refusals_of_the_vmi_webhook(api: pykube.HTTPClient, fleet: Fleet, tenant: str) -> None:
    cls = fleet.gpu_class(maxCount=2)
    fleet.node(4)
    claim(api, tenant, "hold", cls, 1)
    bound_node(api, tenant, "hold")
    with refused(403) as r:
        vmi(api, tenant, "unknown", [{"claim": "nope"}])
    assert "nope" in r[0].message
    with refused(403) as r:
        vmi(api, tenant, "too-many", [{"claimTemplate": {"className": cls, "count": 3}}])
    assert "3" in r[0].message and "2" in r[0].message
    with refused(403) as r:
        vmi(
            api,
            tenant,
            "both",
            [{"claim": "hold"}],
            domain={"devices": {"gpus": [{"name": "mine", "deviceName": fleet.resource}]}},
        )
    assert "gpus" in r[0].message
    vmi(api, tenant, "first", [{"claim": "hold"}])
    with refused(403) as r:
        vmi(api, tenant, "second", [{"claim": "hold"}])
    assert "first" in r[0].message


def test_migration_targets_pass_untouched_and_a_repeated_admission_gates_once(
    api: pykube.HTTPClient, tenant: str, fleet: Fleet
) -> None:
    cls = fleet.gpu_class()
    refs = json.dumps([{"claimTemplate": {"className": cls, "count": 1}}])
    labels = {"kubevirt.io": "virt-launcher", names.CLAIMS_LABEL: "true"}
    base = {
        "namespace": tenant,
        "labels": labels,
        "annotations": {names.CLAIMS_ANNOTATION: refs},
    }
    target = pykube.Pod(
        api,
        {
            "metadata": {
                **base,
                "name": "target",
                "labels": {**labels, "kubevirt.io/migrationJobUID": "m-1"},
            },
            "spec": {
                "containers": [{"name": "compute", "image": "x"}],
                "nodeSelector": {"nowhere": "true"},
            },
        },
    )
    target.create()
    assert not target.obj["spec"].get("schedulingGates")
    gated = pykube.Pod(
        api,
        {
            "metadata": {**base, "name": "gated"},
            "spec": {
                "containers": [{"name": "compute", "image": "x"}],
                "nodeSelector": {"nowhere": "true"},
                "schedulingGates": [{"name": names.PLACEMENT_GATE}],
            },
        },
    )
    gated.create()
    assert gated.obj["spec"]["schedulingGates"] == [{"name": names.PLACEMENT_GATE}]


def test_two_held_claims_on_different_nodes_are_gathered_on_one(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    first_node, second_node = fleet.node(4), fleet.node(4)
    wait_for(
        "both nodes published",
        lambda: (GPUClass.objects(api).get(name=cls).obj.get("status") or {}).get("nodes"),
        until=lambda n: n == 2,
        timeout=CONVERGE,
    )
    claim(api, tenant, "a", cls, 1)
    assert bound_node(api, tenant, "a") == first_node  # binpack tie: the first by name
    claim(api, tenant, "filler", cls, 3)
    assert bound_node(api, tenant, "filler") == first_node  # the tightest fit
    claim(api, tenant, "b", cls, 2)
    assert bound_node(api, tenant, "b") == second_node
    GPUClaim.objects(api, namespace=tenant).get(name="filler").delete()
    wait_for(
        "the filler gone",
        lambda: GPUClaim.objects(api, namespace=tenant).get_or_none(name="filler"),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )
    vmi(api, tenant, "vm-ab", [{"claim": "a"}, {"claim": "b"}])
    status = wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-ab"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    nodes = {bound_node(api, tenant, n) for n in ("a", "b")}
    assert nodes == {status["nodeName"]}, "the movable claim joined the other"


def test_a_node_that_refuses_the_pinned_pod_is_remembered_and_the_set_moves(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    small = fleet.node(4, memory="8Gi")
    big = fleet.node(4, memory="64Gi")
    claim(api, tenant, "hold", cls, 2)
    assert bound_node(api, tenant, "hold") == small  # binpack tie: the first by name
    vmi(
        api,
        tenant,
        "vm-big",
        [{"claim": "hold"}],
        domain={"devices": {}, "resources": {"requests": {"memory": "16Gi"}}},
    )
    refused_status = wait_for(
        "the small node recorded as refusing",
        lambda: GPUClaim.objects(api, namespace=tenant).get(name="hold").obj.get("status") or {},
        until=lambda s: any(r["nodeName"] == small for r in s.get("refusedNodes", [])),
        timeout=CONVERGE,
    )
    entry = next(r for r in refused_status["refusedNodes"] if r["nodeName"] == small)
    assert entry["until"] > refused_status.get("boundTime", "")
    wait_for(
        "the VMI failed (its pod was deleted)",
        lambda: vmi_status(api, tenant, "vm-big"),
        until=lambda s: s.get("phase") == "Failed",
        timeout=CONVERGE,
    )
    assert bound_node(api, tenant, "hold") == big
    # The VM controller would start a new VMI after its backoff: do it by hand.
    VirtualMachineInstance.objects(api, namespace=tenant).get(name="vm-big").delete()
    wait_for(
        "the failed VMI gone",
        lambda: VirtualMachineInstance.objects(api, namespace=tenant).get_or_none(name="vm-big"),
        until=lambda o: o is None,
        timeout=CONVERGE,
    )
    vmi(
        api,
        tenant,
        "vm-big",
        [{"claim": "hold"}],
        domain={"devices": {}, "resources": {"requests": {"memory": "16Gi"}}},
    )
    status = wait_for(
        "Scheduled on the big node",
        lambda: vmi_status(api, tenant, "vm-big"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    assert status["nodeName"] == big


def test_a_vgpu_template_needs_the_entitlement(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class(mode="vgpu", profile="G1-8Q")
    fleet.node(2)
    with refused(403) as r:
        vmi(api, tenant, "vgpu", [{"claimTemplate": {"className": cls, "count": 1}}])
    assert "vgpu-entitled" in r[0].message
