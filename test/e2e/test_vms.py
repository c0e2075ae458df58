"""VMs on claims, end to end, with the KubeVirt stand-in: the VMI webhook writes the GPU
entries, the attachments controller attaches held claims to the VMIs that exist, the
template controller orders template claims, the pod webhook gates the launcher pod and the
placement controller pins it to the claims' node."""

from __future__ import annotations

import json
from typing import Any

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass, GPUNode, VirtualMachineInstance
from harness.claims import bound_node, create_claim, create_vmi
from harness.fleet import Fleet
from harness.kube import Obj, mutate, refused
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator

CONVERGE = 30.0


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


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
    settled(api, cls, fleet, 8)
    create_claim(api, tenant, "hold", cls, 2)
    node = bound_node(api, tenant, "hold")
    v = create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    gpus = v.obj["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == [fleet.resource] * 2
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
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]
    wait_for(
        "the attachment, by name and uid",
        lambda: GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"],
        until=lambda s: s.get("attachment") == {"vmi": "vm-1", "uid": v.obj["metadata"]["uid"]},
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
    # The running launcher pod is accounted by its VMI's claim: its units count once.
    wait_for(
        "the launcher pod running",
        lambda: pykube.Pod.objects(api, namespace=tenant).get(name=pod.name).obj["status"],
        until=lambda s: s.get("phase") == "Running",
        timeout=CONVERGE,
    )
    wait_for(
        "the class counting the VM's units once",
        lambda: class_free(api, cls),
        until=lambda free: free == 8 - 2,
        timeout=CONVERGE,
    )
    wait_for(
        "the GPUNode counting the VM's units once",
        lambda: [
            (d["allocated"], d["free"])
            for d in GPUNode.objects(api).get(name=node).obj["status"]["devices"]
            if d["resourceName"] == fleet.resource
        ],
        until=lambda figures: figures == [(2, 2)],
        timeout=CONVERGE,
    )


def class_free(api: pykube.HTTPClient, cls: str) -> int:
    return int((GPUClass.objects(api).get(name=cls).obj.get("status") or {}).get("free", -1))


def test_a_pod_posing_as_a_vms_second_launcher_counts_beyond_the_vms_claim(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, kubevirt_controller: pykube.HTTPClient
) -> None:
    """Ownership, not labels, decides what a claim accounts for, and a VM's claims cover its
    pods together: a second pod with the launcher label and a controller reference to the
    VMI still counts the units the claim does not hold. Only KubeVirt's controller may make
    such a pod (the admission policies), so it is made as KubeVirt."""
    cls = fleet.gpu_class()
    node = fleet.node(4)
    settled(api, cls, fleet, 4)
    create_claim(api, tenant, "hold", cls, 2)
    assert bound_node(api, tenant, "hold") == node
    v = create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-1"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    wait_for(
        "the VM's units counted once",
        lambda: class_free(api, cls),
        until=lambda free: free == 2,
        timeout=CONVERGE,
    )
    meta = v.obj["metadata"]
    twin = pykube.Pod(
        kubevirt_controller,
        {
            "metadata": {
                "name": "twin",
                "namespace": tenant,
                "labels": {"kubevirt.io": "virt-launcher"},
                "ownerReferences": [
                    {
                        "apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstance",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {fleet.resource: "2"}}}
                ],
            },
        },
    )
    twin.create()
    wait_for(
        "the twin's units counted",
        lambda: [
            (d["allocated"], d["free"])
            for d in GPUNode.objects(api).get(name=node).obj["status"]["devices"]
            if d["resourceName"] == fleet.resource
        ],
        until=lambda figures: figures == [(4, 0)],
        timeout=CONVERGE,
    )
    wait_for(
        "the class without free units",
        lambda: class_free(api, cls),
        until=lambda free: free == 0,
        timeout=CONVERGE,
    )


def test_a_stopped_vm_keeps_its_claim_and_starts_again_on_the_same_node(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    fleet.node(4)
    settled(api, cls, fleet, 8)
    create_claim(api, tenant, "hold", cls, 1)
    node = bound_node(api, tenant, "hold")
    first = create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
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
    create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
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
    settled(api, cls, fleet, 4)
    v = create_vmi(api, tenant, "vm-t", [{"claimTemplate": {"className": cls, "count": 3}}])
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


def events(api: pykube.HTTPClient, ns: str, name: str, reason: str) -> int:
    return len(
        pykube.Event.objects(api, namespace=ns).filter(
            field_selector={"involvedObject.name": name, "reason": reason}
        )
    )


def settled(api: pykube.HTTPClient, cls: str, fleet: Fleet, free: int) -> None:
    """Wait until the class publishes ``free`` units and the scheduler can use the fleet's
    nodes: the node lifecycle controller lifts its ``not-ready`` taint a moment after a new
    node turns Ready, and a pod pinned before that would be refused."""
    wait_for(
        "the node's units published",
        lambda: class_free(api, cls),
        until=lambda n: n == free,
        timeout=CONVERGE,
    )

    def not_ready_tainted() -> list[str]:
        return [
            node.name
            for node in pykube.Node.objects(api)
            if node.name in {n.name for n in fleet.nodes}
            and any(
                t.get("key") == "node.kubernetes.io/not-ready"
                for t in node.obj["spec"].get("taints") or []
            )
        ]

    wait_for(
        "the fleet's nodes without the not-ready taint",
        not_ready_tainted,
        until=lambda tainted: not tainted,
        timeout=CONVERGE,
    )


def refusal(api: pykube.HTTPClient, ns: str, name: str, refs: list[Obj]) -> str:
    """The VMI webhook's refusal of a VMI (it must be refused)."""
    with refused(403) as r:
        create_vmi(api, ns, name, refs)
    return r[0].message


def test_a_running_vms_template_claim_stays_until_the_vmi_is_gone(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, fleet, 4)
    v = create_vmi(api, tenant, "vm-t", [{"claimTemplate": {"className": cls, "count": 3}}])
    wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-t"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    [made] = list(GPUClaim.objects(api, namespace=tenant))
    made.delete()
    wait_for(
        "the deletion held (DeletionHeld event)",
        lambda: events(api, tenant, made.name, "DeletionHeld"),
        until=lambda n: n >= 1,
        timeout=CONVERGE,
    )
    held = GPUClaim.objects(api, namespace=tenant).get(name=made.name).obj
    assert held["metadata"]["deletionTimestamp"]
    assert names.CLAIM_PROTECTION_FINALIZER in held["metadata"]["finalizers"]
    assert held["status"]["phase"] == "Bound", "the running VM keeps its units"
    assert [c.name for c in GPUClaim.objects(api, namespace=tenant)] == [made.name]
    # Class figures are written at most once per statusInterval: wait for them to settle.
    wait_for(
        "the class to publish the VM's units as held (nobody else is promised them)",
        lambda: class_free(api, cls),
        until=lambda n: n == 1,
        timeout=CONVERGE,
    )
    v.delete()
    wait_for(
        "the template claim gone with its VMI",
        lambda: len(list(GPUClaim.objects(api, namespace=tenant))),
        until=lambda n: n == 0,
        timeout=CONVERGE + 30,
    )


def test_a_vm_deleted_in_the_foreground_takes_its_template_claim_with_it(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    """Foreground deletion waits for the template claim (its ownerReference blocks the
    VMI's deletion) while the claim's protection waits for the VMI: once the VMI's pods are
    gone the claim is released, so neither waits forever."""
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, fleet, 4)
    v = create_vmi(api, tenant, "vm-f", [{"claimTemplate": {"className": cls, "count": 2}}])
    wait_for(
        "Scheduled",
        lambda: vmi_status(api, tenant, "vm-f"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    v.delete(propagation_policy="Foreground")
    # Garbage collection learns the VMI kind at its periodic discovery (every 30 s) and
    # may need a second round on a loaded machine.
    wait_for(
        "the VMI and its template claim gone",
        lambda: (
            VirtualMachineInstance.objects(api, namespace=tenant).get_or_none(name="vm-f"),
            len(list(GPUClaim.objects(api, namespace=tenant))),
        ),
        until=lambda state: state == (None, 0),
        timeout=CONVERGE + 60,
    )
    wait_for(
        "the capacity returned",
        lambda: class_free(api, cls),
        until=lambda free: free == 4,
        timeout=CONVERGE,
    )


def test_a_vmi_being_deleted_keeps_its_claim_protected_and_attached(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, fleet, 4)
    create_claim(api, tenant, "hold", cls, 1)
    bound_node(api, tenant, "hold")
    v = create_vmi(api, tenant, "vm-1", [{"claim": "hold"}])
    wait_for(
        "the attachment confirmed",
        lambda: GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"],
        until=lambda s: (s.get("attachment") or {}).get("uid") == v.obj["metadata"]["uid"],
        timeout=CONVERGE,
    )
    hold_finalizer = "test.gpu.cozystack.io/hold"
    mutate(v, lambda o: o["metadata"].setdefault("finalizers", []).append(hold_finalizer))
    v.delete()  # graceful shutdown: the VMI stays, with a deletionTimestamp
    wait_for(
        "another VM refused the claim of the VM being deleted",
        lambda: refusal(api, tenant, "vm-2", [{"claim": "hold"}]),
        until=lambda message: "in use by another VM instance, which is being deleted" in message,
        timeout=CONVERGE,
    )
    GPUClaim.objects(api, namespace=tenant).get(name="hold").delete()
    wait_for(
        "the claim's deletion held",
        lambda: events(api, tenant, "hold", "DeletionHeld"),
        until=lambda n: n >= 1,
        timeout=CONVERGE,
    )
    status = GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"]
    assert status["attachment"] == {"vmi": "vm-1", "uid": v.obj["metadata"]["uid"]}
    assert status["phase"] == "Bound"
    mutate(v, lambda o: o["metadata"].__setitem__("finalizers", []))
    wait_for(
        "the claim gone once the VMI is",
        lambda: GPUClaim.objects(api, namespace=tenant).get_or_none(name="hold"),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )


def test_refusals_of_the_vmi_webhook(api: pykube.HTTPClient, fleet: Fleet, tenant: str) -> None:
    cls = fleet.gpu_class(maxCount=2)
    fleet.node(4)
    settled(api, cls, fleet, 4)
    create_claim(api, tenant, "hold", cls, 1)
    bound_node(api, tenant, "hold")
    with refused(403) as r:
        create_vmi(api, tenant, "unknown", [{"claim": "nope"}])
    assert "nope" in r[0].message
    with refused(403) as r:
        create_vmi(api, tenant, "too-many", [{"claimTemplate": {"className": cls, "count": 3}}])
    assert "3" in r[0].message and "2" in r[0].message
    with refused(403) as r:
        create_vmi(
            api,
            tenant,
            "both",
            [{"claim": "hold"}],
            domain={"devices": {"gpus": [{"name": "mine", "deviceName": fleet.resource}]}},
        )
    assert "gpus" in r[0].message
    with refused(403) as r:
        create_vmi(
            api,
            tenant,
            "host-gpu",
            [{"claim": "hold"}],
            domain={"devices": {"hostDevices": [{"name": "extra", "deviceName": fleet.resource}]}},
        )
    assert "spec.domain.devices.hostDevices" in r[0].message
    assert fleet.resource in r[0].message
    first = create_vmi(api, tenant, "first", [{"claim": "hold"}])
    # Once the attachment is recorded the operator's caches hold the first VMI, so the
    # second is refused as a claim of a live VM.
    wait_for(
        "the first VM's attachment recorded",
        lambda: GPUClaim.objects(api, namespace=tenant).get(name="hold").obj["status"],
        until=lambda s: (s.get("attachment") or {}).get("uid") == first.obj["metadata"]["uid"],
        timeout=CONVERGE,
    )
    with refused(403) as r:
        create_vmi(api, tenant, "second", [{"claim": "hold"}])
    assert "claim hold: the claim is in use by another VM instance" in r[0].message
    assert "first" not in r[0].message, "another VM is not named"


def test_migration_targets_are_gated_as_launcher_pods_are_and_a_repeated_admission_gates_once(
    api: pykube.HTTPClient, tenant: str, fleet: Fleet, kubevirt_controller: pykube.HTTPClient
) -> None:
    """A migration target of a VM with GPU claims waits at the placement gate as a launcher
    pod does (placement pins it to its claims' transient holds' node, docs/design.md §5 "Live
    migration"); one of a VM without GPUs passes untouched; a pod that already carries the
    gate keeps exactly one. The pods are KubeVirt's (made as its controller, owned by a VMI),
    as only they may carry the claims label."""
    cls = fleet.gpu_class()
    refs = json.dumps([{"claimTemplate": {"className": cls, "count": 1}}])
    labels = {"kubevirt.io": "virt-launcher", names.CLAIMS_LABEL: "true"}
    owner = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "name": "vm-migrating",
        "uid": "00000000-0000-0000-0000-00000000cafe",
        "controller": True,
    }
    base: dict[str, Any] = {
        "namespace": tenant,
        "labels": labels,
        "annotations": {names.CLAIMS_ANNOTATION: refs},
        "ownerReferences": [owner],
    }
    target = pykube.Pod(
        kubevirt_controller,
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
    assert target.obj["spec"].get("schedulingGates") == [{"name": names.PLACEMENT_GATE}]
    plain = pykube.Pod(
        kubevirt_controller,
        {
            "metadata": {
                "namespace": tenant,
                "name": "plain-target",
                "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/migrationJobUID": "m-2"},
                "ownerReferences": [owner],
            },
            "spec": {
                "containers": [{"name": "compute", "image": "x"}],
                "nodeSelector": {"nowhere": "true"},
            },
        },
    )
    plain.create()
    assert not plain.obj["spec"].get("schedulingGates")
    gated = pykube.Pod(
        kubevirt_controller,
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
    settled(api, cls, fleet, 8)
    wait_for(
        "both nodes published",
        lambda: (GPUClass.objects(api).get(name=cls).obj.get("status") or {}).get("nodes"),
        until=lambda n: n == 2,
        timeout=CONVERGE,
    )
    create_claim(api, tenant, "a", cls, 1)
    assert bound_node(api, tenant, "a") == first_node  # binpack tie: the first by name
    create_claim(api, tenant, "filler", cls, 3)
    assert bound_node(api, tenant, "filler") == first_node  # the tightest fit
    create_claim(api, tenant, "b", cls, 2)
    assert bound_node(api, tenant, "b") == second_node
    GPUClaim.objects(api, namespace=tenant).get(name="filler").delete()
    wait_for(
        "the filler gone",
        lambda: GPUClaim.objects(api, namespace=tenant).get_or_none(name="filler"),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )
    create_vmi(api, tenant, "vm-ab", [{"claim": "a"}, {"claim": "b"}])
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
    settled(api, cls, fleet, 8)
    create_claim(api, tenant, "hold", cls, 2)
    assert bound_node(api, tenant, "hold") == small  # binpack tie: the first by name
    create_vmi(
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

    def recreate() -> bool:
        """One create; False while the webhook's cache still shows the old VMI (it answers
        409 with "retry")."""
        try:
            create_vmi(
                api,
                tenant,
                "vm-big",
                [{"claim": "hold"}],
                domain={"devices": {}, "resources": {"requests": {"memory": "16Gi"}}},
            )
        except pykube.exceptions.HTTPError as exc:
            if exc.code == 409 and "already exists" in str(exc):
                return False
            raise
        return True

    wait_for("the VMI created again", recreate, timeout=CONVERGE)
    status = wait_for(
        "Scheduled on the big node",
        lambda: vmi_status(api, tenant, "vm-big"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    assert status["nodeName"] == big


def test_a_vm_is_pinned_by_node_name_where_the_hostname_label_differs(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    """The pin selects the Node by ``metadata.name``: on a node whose hostname label is not
    its name, and next to the VM's own required node affinity (the API server accepts the
    added requirement only because the pod is still gated), the real scheduler places it."""
    cls = fleet.gpu_class()
    node = fleet.node(4)
    settled(api, cls, fleet, 4)
    mutate(
        pykube.Node.objects(api).get(name=node),
        lambda o: o["metadata"]["labels"].__setitem__("kubernetes.io/hostname", f"host-{node}"),
    )
    create_claim(api, tenant, "hold", cls, 1)
    assert bound_node(api, tenant, "hold") == node
    own = {"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]}
    create_vmi(
        api,
        tenant,
        "vm-renamed",
        [{"claim": "hold"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [own]}
            }
        },
    )
    status = wait_for(
        "Scheduled on the node whose hostname label differs",
        lambda: vmi_status(api, tenant, "vm-renamed"),
        until=lambda s: s.get("phase") in ("Scheduled", "Failed"),
        timeout=CONVERGE,
    )
    assert (status["phase"], status.get("nodeName")) == ("Scheduled", node)
    pod = launcher(api, tenant)
    terms = pod.obj["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    assert terms == [{**own, "matchFields": [pin]}]


def test_a_vgpu_template_needs_the_entitlement(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class(mode="vgpu", profile="G1-8Q")
    fleet.node(2)
    with refused(403) as r:
        create_vmi(api, tenant, "vgpu", [{"claimTemplate": {"className": cls, "count": 1}}])
    assert "vgpu-entitled" in r[0].message
