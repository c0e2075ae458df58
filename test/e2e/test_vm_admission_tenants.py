"""The VMI webhook against tenants, on the real API server, each tenant a ServiceAccount with
only ``edit`` in her namespace and KubeVirt's VMI rights (``harness.edit_tenant``):

* it writes nothing: a review sent straight to its port over TLS, no API server involved,
  naming another tenant's held claim changes nothing in the cluster (the claim's
  resourceVersion stays), and that tenant's VM then starts on her claim; its refusals name
  none of her claims or VMs;
* the attachments controller records attachments: of two VMIs admitted at once for one held
  claim the older runs and the younger waits gated, told by an Event which VM holds the
  claim, and starts once that VM is gone;
* a claim template is judged like an order and refused when no node could ever hold it; a
  template added by labelling a VMI after its create (never judged by the webhook) orders
  nothing.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest
import requests

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass, VirtualMachineInstance
from harness.claims import bound_node, create_claim, create_vmi, vmi_metadata
from harness.edit_tenant import tenant_client
from harness.fleet import Fleet
from harness.kube import Obj, mutate, refused
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, ca_bundle, secret_name

CONVERGE = 30.0
VMI_PATH = "/mutate-vmi"


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


@pytest.fixture
def tenant_api(api: pykube.HTTPClient, kubeconfig: Path, tenant: str) -> pykube.HTTPClient:
    """The tenant of ``tenant``, once the API server authorises her."""
    client = tenant_client(api, kubeconfig, tenant)
    wait_for(
        "the tenant's rights",
        lambda: list(GPUClaim.objects(client, namespace=tenant)),
        until=lambda _claims: True,
    )
    return client


@pytest.fixture
def webhook_ca(api: pykube.HTTPClient, deployed: Deployed, tmp_path: Path) -> Path:
    """The CA of the webhook server's certificate, as a file."""
    bundle = ca_bundle(api, deployed, secret_name(deployed))
    path = tmp_path / "webhook-ca.crt"
    path.write_bytes(base64.b64decode(bundle))
    return path


def claim_obj(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    return dict(GPUClaim.objects(api, namespace=ns).get(name=name).obj)


def vmi_status(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    found = VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name=name)
    return dict((found.obj.get("status") or {}) if found else {})


def scheduled_on(api: pykube.HTTPClient, ns: str, name: str) -> str:
    status = wait_for(
        f"{name} Scheduled",
        lambda: vmi_status(api, ns, name),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    return str(status["nodeName"])


def event_messages(api: pykube.HTTPClient, ns: str, name: str, reason: str) -> list[str]:
    return [
        str(e.obj.get("message") or "")
        for e in pykube.Event.objects(api, namespace=ns).filter(
            field_selector={"involvedObject.name": name, "reason": reason}
        )
    ]


def settled(api: pykube.HTTPClient, cls: str, free: int) -> None:
    wait_for(
        "the class's units published",
        lambda: (GPUClass.objects(api).get(name=cls).obj.get("status") or {}).get("free"),
        until=lambda n: n == free,
        timeout=CONVERGE,
    )


def forged_review(port: int, ca: Path, ns: str, name: str, refs: list[Obj]) -> Obj:
    """An AdmissionReview for a VMI create in ``ns``, posted straight to the webhook's port by
    a client without any certificate, as any pod that reaches the port could; its response."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "resource": {
                "group": "kubevirt.io",
                "version": "v1",
                "resource": "virtualmachineinstances",
            },
            "namespace": ns,
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:attacker:default"},
            "object": {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": vmi_metadata(ns, name, refs),
                "spec": {"domain": {"devices": {}}},
            },
            "dryRun": False,
        },
    }
    answer = requests.post(
        f"https://127.0.0.1:{port}{VMI_PATH}", json=review, verify=str(ca), timeout=10
    )
    assert answer.status_code == 200, answer.text
    response: Obj = answer.json()["response"]
    return response


# -- no side effects --------------------------------------------------------------------------


@pytest.mark.operator_process  # the review goes to the port of the suite's own replica
def test_a_forged_review_changes_nothing_and_learns_no_other_name(
    api: pykube.HTTPClient,
    fleet: Fleet,
    hooks: WebhookOperator,
    tenant: str,
    tenant_api: pykube.HTTPClient,
    webhook_ca: Path,
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, 4)
    create_claim(tenant_api, tenant, "hold", cls, 1)
    node = bound_node(tenant_api, tenant, "hold")
    port = hooks.replica.webhook_port
    before = claim_obj(api, tenant, "hold")

    # The attack of before: a review for a VM that will never exist, naming her claim.
    answer = forged_review(port, webhook_ca, tenant, "ghost", [{"claim": "hold"}])
    assert answer["allowed"] is True  # a well-formed VMI: the webhook only answers
    after = claim_obj(api, tenant, "hold")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "attachment" not in (after.get("status") or {})

    # A guess at a claim name learns nothing of hers.
    answer = forged_review(port, webhook_ca, tenant, "probe", [{"claim": "nope"}])
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert f"claim nope: no such GPUClaim in namespace {tenant}" in message
    assert "hold" not in message

    # Her own VM starts on her claim: nothing was marked attached to the ghost.
    create_vmi(tenant_api, tenant, "vm-real", [{"claim": "hold"}])
    assert scheduled_on(api, tenant, "vm-real") == node
    uid = (
        VirtualMachineInstance.objects(api, namespace=tenant)
        .get(name="vm-real")
        .obj["metadata"]["uid"]
    )
    attached = wait_for(
        "the attachment to her VM",
        lambda: (claim_obj(api, tenant, "hold").get("status") or {}).get("attachment"),
        until=lambda a: a == {"vmi": "vm-real", "uid": uid},
        timeout=CONVERGE,
    )
    assert attached == {"vmi": "vm-real", "uid": uid}

    # Naming her claim in use: refused, without the name of her VM, and nothing written.
    before = claim_obj(api, tenant, "hold")
    answer = forged_review(port, webhook_ca, tenant, "ghost", [{"claim": "hold"}])
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert "claim hold: the claim is in use by another VM instance" in message
    assert "vm-real" not in message and uid not in message
    after = claim_obj(api, tenant, "hold")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


# -- the attachment is the controller's -------------------------------------------------------


def _create(client: pykube.HTTPClient, ns: str, name: str, box: dict[str, Obj | str]) -> None:
    try:
        box[name] = dict(create_vmi(client, ns, name, [{"claim": "hold"}]).obj)
    except pykube.exceptions.HTTPError as exc:
        box[name] = str(exc)


def _at_once(client: pykube.HTTPClient, ns: str, vmi_names: list[str]) -> dict[str, Obj | str]:
    """Create the VMIs ``vmi_names`` on claim ``hold`` from one thread each, at once: each
    created VMI's object, or the refusal's text."""
    box: dict[str, Obj | str] = {}
    clients = [pykube.HTTPClient(client.config, timeout=30) for _ in vmi_names]
    threads = [
        threading.Thread(target=_create, args=(c, ns, n, box))
        for c, n in zip(clients, vmi_names, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return box


def _age(vmi: Obj) -> tuple[str, str]:
    return (vmi["metadata"]["creationTimestamp"], vmi["metadata"]["name"])


@pytest.fixture
def admitted_at_once(
    api: pykube.HTTPClient, tenant: str, tenant_api: pykube.HTTPClient
) -> Iterator[tuple[Obj, Obj]]:
    """Two VMIs the webhook admitted for one held claim ``hold`` (each judged before the
    other reached the operator's caches), older first. A race: an attempt where the
    webhook already saw the first VMI (and refused the second), or where the creation order
    and the age order (creationTimestamp has whole seconds, then names) disagree, is
    undone and tried again."""
    attempt = 0

    def race() -> tuple[Obj, Obj] | None:
        nonlocal attempt
        attempt += 1
        pair = [f"vm-{attempt}-a", f"vm-{attempt}-b"]
        box = _at_once(tenant_api, tenant, pair)
        made = [v for v in box.values() if isinstance(v, dict)]
        if len(made) == 2:
            by_age = sorted(made, key=_age)
            by_creation = sorted(made, key=lambda v: int(v["metadata"]["resourceVersion"]))
            if by_age == by_creation:
                return (by_age[0], by_age[1])
        for vmi in made:
            VirtualMachineInstance(tenant_api, vmi).delete()
        wait_for(
            "the attempt's VMIs gone",
            lambda: [
                v.name
                for v in VirtualMachineInstance.objects(api, namespace=tenant)
                if v.name in pair
            ],
            until=lambda left: not left,
            timeout=CONVERGE,
        )
        return None

    pair = wait_for("two VMIs admitted at once", race, until=lambda p: p is not None, timeout=120)
    assert pair is not None
    yield pair


def test_of_two_vms_admitted_at_once_for_one_claim_the_older_runs_the_younger_waits(
    api: pykube.HTTPClient,
    fleet: Fleet,
    tenant: str,
    tenant_api: pykube.HTTPClient,
    request: pytest.FixtureRequest,
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, 4)
    create_claim(tenant_api, tenant, "hold", cls, 1)
    node = bound_node(tenant_api, tenant, "hold")
    older, younger = request.getfixturevalue("admitted_at_once")
    old_name, young_name = older["metadata"]["name"], younger["metadata"]["name"]

    assert scheduled_on(api, tenant, old_name) == node
    status = claim_obj(api, tenant, "hold")["status"]
    assert status["attachment"] == {"vmi": old_name, "uid": older["metadata"]["uid"]}
    told = wait_for(
        "the younger VMI told which VM holds the claim",
        lambda: event_messages(tenant_api, tenant, young_name, "ClaimInUse"),
        until=bool,
        timeout=CONVERGE,
    )
    assert f"claim hold is attached to VM instance {old_name}" in told[0]
    condition = wait_for(
        "the claim's Attached condition naming the waiting VM",
        lambda: next(
            c
            for c in claim_obj(tenant_api, tenant, "hold")["status"].get("conditions", [])
            if c["type"] == "Attached"
        ),
        until=lambda c: c["reason"] == "VMsWaiting",
        timeout=CONVERGE,
    )
    assert old_name in condition["message"] and young_name in condition["message"]
    [pod] = wait_for(
        "the younger VM's launcher pod",
        lambda: list(
            pykube.Pod.objects(api, namespace=tenant).filter(
                selector={"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": young_name}
            )
        ),
        until=lambda pods: len(pods) == 1,
        timeout=CONVERGE,
    )
    gates = [g["name"] for g in pod.obj["spec"].get("schedulingGates") or []]
    assert gates == [names.PLACEMENT_GATE], "the younger VM's launcher pod stays gated"
    assert vmi_status(api, tenant, young_name).get("phase") != "Scheduled"

    # The older VM goes: the claim passes to the younger, which starts on it.
    VirtualMachineInstance(tenant_api, older).delete()
    assert scheduled_on(api, tenant, young_name) == node
    wait_for(
        "the attachment to the younger VM",
        lambda: claim_obj(api, tenant, "hold")["status"].get("attachment"),
        until=lambda a: a == {"vmi": young_name, "uid": younger["metadata"]["uid"]},
        timeout=CONVERGE,
    )


# -- templates judged like orders -------------------------------------------------------------


def test_a_template_no_node_could_hold_is_refused_at_vmi_create(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, tenant_api: pykube.HTTPClient
) -> None:
    cls = fleet.gpu_class()  # passthrough, no maxCount: only the nodes bound a template
    fleet.node(4)
    fleet.node(2)
    settled(api, cls, 6)
    with refused(403) as r:
        create_vmi(
            tenant_api, tenant, "vm-big", [{"claimTemplate": {"className": cls, "count": 5}}]
        )
    assert (
        f"annotation {names.CLAIMS_ANNOTATION}: item 1: claimTemplate.count: 5 GPUs of class "
        f"{cls} could never fit on one node: the most one node serving class {cls} has "
        "allocatable is 4; allowed: a count of at most 4"
    ) in r[0].message
    assert list(GPUClaim.objects(api, namespace=tenant)) == []

    create_vmi(tenant_api, tenant, "vm-fits", [{"claimTemplate": {"className": cls, "count": 4}}])
    node = scheduled_on(api, tenant, "vm-fits")
    [made] = list(GPUClaim.objects(api, namespace=tenant))
    assert (made.obj["spec"]["count"], made.obj["status"]["nodeName"]) == (4, node)


def test_a_template_labelled_on_after_create_orders_nothing(
    api: pykube.HTTPClient,
    fleet: Fleet,
    tenant: str,
    tenant_api: pykube.HTTPClient,
    hoster_namespace: str,
) -> None:
    """The webhook's objectSelector skips a VMI created without the claims label. The
    tenant cannot label and annotate it afterwards (the admission policy refuses her); and
    where no policy applies (an exempt namespace, a cluster without the policies), the
    references were never judged, so the template controller orders nothing of them."""
    cls = fleet.gpu_class()
    fleet.node(4)
    settled(api, cls, 4)
    refs = json.dumps([{"claimTemplate": {"className": cls, "count": 64}}])

    def label_and_annotate(obj: Obj) -> None:
        obj["metadata"].setdefault("labels", {})[names.CLAIMS_LABEL] = "true"
        obj["metadata"].setdefault("annotations", {})[names.CLAIMS_ANNOTATION] = refs

    def plain_vmi(client: pykube.HTTPClient, namespace: str) -> VirtualMachineInstance:
        v = VirtualMachineInstance(
            client,
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {"name": "vm-late", "namespace": namespace},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}},
            },
        )
        v.create()
        return v

    # The tenant: edit and KubeVirt's VMI rights allow the update, the policy does not.
    late = plain_vmi(tenant_api, tenant)
    with refused(403) as refusal:  # a merge patch: no conflict with KubeVirt's status writes
        late.patch(
            {
                "metadata": {
                    "labels": {names.CLAIMS_LABEL: "true"},
                    "annotations": {names.CLAIMS_ANNOTATION: refs},
                }
            }
        )
    assert names.CLAIMS_LABEL in refusal[0].message
    assert list(GPUClaim.objects(api, namespace=tenant)) == []

    # Where the policy does not apply, the controller's own check holds.
    mutate(plain_vmi(api, hoster_namespace), label_and_annotate)
    [message] = wait_for(
        "the template controller's refusal",
        lambda: event_messages(api, hoster_namespace, "vm-late", "TemplateClaimRefused"),
        until=bool,
        timeout=CONVERGE,
    )
    assert "spec.domain.devices.gpus: 0 entries, not the 64 entries the VMI webhook writes" in (
        message
    )
    assert list(GPUClaim.objects(api, namespace=hoster_namespace)) == []
