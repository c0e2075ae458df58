"""Naming a DRA hold raw (docs/design.md §5 "DRA classes"): the pod webhook refuses a pod
that names a hold's ResourceClaim unless KubeVirt made it for the VMI the hold's claim
serves; the VMI webhook refuses a VMI that names the hold of a claim it does not request.
The oracle is the refusal's text and the objects' fields as written here."""

from __future__ import annotations

from typing import Any

from unit.admission.test_admission_pods import KUBEVIRT, VMI_OWNER, pod
from unit.admission.test_admission_vmis import FakeInventory, vmi

from admission import pods, vmis
from gpuoperator import names, settings
from gpuoperator.model import dra_holds
from gpuoperator.runtime import admitting
from harness import objects
from harness.offline import store_caches

Obj = dict[str, Any]
NS = objects.NS
TENANT = f"system:serviceaccount:{NS}:default"
DRA = objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "a10.example.com"}})


def hold_of(claim: Obj) -> Obj:
    return dra_holds.resource_claim(claim, "a10.example.com", 1)


ATTACHED = objects.claim(
    "gpu", class_name="dra-a10", uid="u-gpu", attached={"vmi": "vm1", "uid": "u-vmi"}
)
ELSEWHERE = objects.claim(
    "other", class_name="dra-a10", uid="u-other", attached={"vmi": "vm2", "uid": "u-vm2"}
)
FREE = objects.claim("free", class_name="dra-a10", uid="u-free")
UNHELD = objects.claim("soon", class_name="dra-a10", uid="u-soon")  # no ResourceClaim yet
MINE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "mine", "namespace": NS, "uid": "u-mine"},
}


def caches() -> Any:
    found = store_caches([DRA], [ATTACHED, ELSEWHERE, FREE, UNHELD])
    for obj in (hold_of(ATTACHED), hold_of(ELSEWHERE), hold_of(FREE), MINE):
        found.resource_claims.store.put(obj)
    return found


def naming(obj: Obj, *claim_names: str) -> Obj:
    spec = obj.setdefault("spec", {})
    spec["resourceClaims"] = [
        {"name": f"c{i}", "resourceClaimName": n} for i, n in enumerate(claim_names)
    ]
    return obj


def tenant_pod(*claim_names: str) -> Obj:
    return naming(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mine", "namespace": NS},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
        *claim_names,
    )


def pod_review(obj: Obj, user: str, **settings_: Any) -> admitting.Admission:
    hook = pods.PodWebhook(caches(), settings.load(settings_, {}, {}))
    return hook(objects.admission_request(obj, kind="Pod", operation="CREATE", user=user))


def vmi_review(obj: Obj) -> admitting.Admission:
    hook = vmis.VmiWebhook(caches(), FakeInventory(), settings.load(None, {}, {}))
    request = objects.admission_request(
        obj, kind="VirtualMachineInstance", group="kubevirt.io", operation="CREATE"
    )
    return hook(request)


def test_a_tenants_pod_naming_a_hold_is_refused_naming_field_claim_and_what_is_allowed() -> None:
    refused = pod_review(tenant_pod("mine", "gpu"), TENANT)
    assert not refused.allowed
    assert refused.message == (
        f"Pod {NS}/mine: spec.resourceClaims[1].resourceClaimName: ResourceClaim gpu is the "
        "hold of GPUClaim gpu; only the launcher pod KubeVirt creates for the VM that claim "
        "serves may name it: reference the claim from a VirtualMachineInstance (annotation "
        f"{names.CLAIMS_ANNOTATION}) instead"
    )


def test_a_tenants_pod_naming_her_own_resource_claim_is_admitted_untouched() -> None:
    admitted = pod_review(tenant_pod("mine"), TENANT)
    assert admitted.allowed and not admitted.patch


def test_a_claim_whose_hold_is_not_made_yet_is_protected_by_its_name() -> None:
    refused = pod_review(tenant_pod("soon"), TENANT)
    assert not refused.allowed and "ResourceClaim soon is the hold of GPUClaim soon" in (
        refused.message or ""
    )


def test_kubevirts_launcher_pod_of_the_vm_the_claim_serves_is_admitted() -> None:
    admitted = pod_review(naming(pod('[{"claim":"gpu"}]'), "gpu"), KUBEVIRT)
    assert admitted.allowed, admitted.message


def test_kubevirts_pod_of_a_vm_the_claim_does_not_serve_is_refused() -> None:
    refused = pod_review(naming(pod('[{"claim":"gpu"}]'), "other"), KUBEVIRT)
    assert not refused.allowed
    assert "spec.resourceClaims[0].resourceClaimName: ResourceClaim other" in (
        refused.message or ""
    )


def test_an_unattached_claim_is_served_by_the_vm_whose_references_name_it() -> None:
    assert pod_review(naming(pod('[{"claim":"free"}]'), "free"), KUBEVIRT).allowed
    refused = pod_review(naming(pod('[{"claim":"gpu"}]'), "free"), KUBEVIRT)
    assert not refused.allowed


def test_a_pod_claiming_to_be_the_launcher_but_made_by_the_tenant_is_refused() -> None:
    forged = naming(pod('[{"claim":"gpu"}]', labelled=False), "gpu")
    assert forged["metadata"]["ownerReferences"] == [VMI_OWNER]
    assert not pod_review(forged, TENANT).allowed


def test_exempt_namespaces_are_left_alone() -> None:
    assert pod_review(tenant_pod("gpu"), TENANT, exemptNamespaces=NS).allowed


def test_a_vmi_without_references_naming_a_hold_is_refused() -> None:
    refused = vmi_review(naming(vmi(labelled=False), "gpu"))
    assert not refused.allowed
    assert refused.message == (
        f"VirtualMachineInstance {NS}/vm1: spec.resourceClaims[0].resourceClaimName: "
        "ResourceClaim gpu is the hold of GPUClaim gpu, which this VMI does not request; a "
        "VMI may name only the holds of the claims it references: reference the claim in "
        f"annotation {names.CLAIMS_ANNOTATION} and the webhook names its hold"
    )


def test_a_vmi_naming_its_own_claims_hold_or_a_plain_claim_is_admitted() -> None:
    assert vmi_review(naming(vmi(labelled=False), "mine")).allowed
    admitted = vmi_review(naming(vmi(refs='[{"claim":"free"}]'), "free"))
    assert admitted.allowed, admitted.message


def test_a_vmi_naming_the_hold_of_a_claim_it_does_not_reference_is_refused() -> None:
    refused = vmi_review(naming(vmi(refs='[{"claim":"free"}]'), "free", "soon"))
    assert not refused.allowed
    assert "spec.resourceClaims[1].resourceClaimName: ResourceClaim soon" in (refused.message or "")
