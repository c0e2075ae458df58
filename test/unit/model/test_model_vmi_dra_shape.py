"""KubeVirt's DRA shape for VMI references to claims of DRA classes (docs/design.md §5
"DRA classes"): ``spec.resourceClaims`` naming each claim's hold and ``gpus`` entries naming
the claim and request, never a ``deviceName``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuoperator.model import templates, vmi_admission
from gpuoperator.model.references import HeldRef, Reference, TemplateRef
from harness import objects
from harness.offline import apply_json_patch

Obj = dict[str, Any]

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
CLASSES: dict[str, Obj] = {
    "a10-dra": objects.gpuclass("a10-dra", source={"dra": {"deviceClassName": "a10.example.com"}}),
    "a10": objects.gpuclass("a10"),
}


def test_held_and_template_references_name_their_holds_and_the_one_request() -> None:
    long_claim = "h" * 200
    claims = {long_claim: objects.claim(long_claim, class_name="a10-dra", count=2)}
    refs: list[Reference] = [HeldRef(long_claim), TemplateRef("a10-dra", 3)]
    names = [long_claim, "vm1-gpu-1"]
    resource_claims, gpus = vmi_admission.dra_shape(refs, names, CLASSES, claims)
    # Written out by hand: the hold is the ResourceClaim named as its GPUClaim, its request "gpu".
    assert resource_claims == [
        {"name": "gpuop-0", "resourceClaimName": long_claim},
        {"name": "gpuop-1", "resourceClaimName": "vm1-gpu-1"},
    ]
    assert gpus == [
        {"name": "gpuop-0", "claimName": "gpuop-0", "requestName": "gpu"},
        {"name": "gpuop-1", "claimName": "gpuop-1", "requestName": "gpu"},
    ]
    assert all(DNS_LABEL.fullmatch(e["name"]) for e in resource_claims)
    assert all(vmi_admission.is_operator_entry(e) for e in gpus)
    assert not any("deviceName" in e for e in gpus)


def test_template_claim_names_come_from_the_template_scheme() -> None:
    refs: list[Reference] = [TemplateRef("a10-dra", 1), TemplateRef("a10-dra", 1)]
    names = templates.claim_names("vm1", refs)
    resource_claims, _ = vmi_admission.dra_shape(refs, names, CLASSES, {})
    assert [e["resourceClaimName"] for e in resource_claims] == ["vm1-gpu-0", "vm1-gpu-1"]


@pytest.mark.parametrize(
    ("refs", "names", "why"),
    [
        pytest.param([HeldRef("ghost")], ["ghost"], "unknown", id="unknown-claim"),
        pytest.param([TemplateRef("nope", 1)], ["vm1-gpu-0"], "unknown", id="unknown-class"),
        pytest.param([TemplateRef("a10", 1)], ["vm1-gpu-0"], "not a DRA class", id="device-plugin"),
        pytest.param([TemplateRef("a10-dra", 1)], [], "claim names", id="names-missing"),
        pytest.param([HeldRef("hold")], ["other"], "not the reference", id="names-differ"),
    ],
)
def test_what_cannot_be_written_raises(refs: list[Reference], names: list[str], why: str) -> None:
    claims = {"hold": objects.claim("hold", class_name="a10-dra")}
    with pytest.raises(ValueError, match=why):
        vmi_admission.dra_shape(refs, names, CLASSES, claims)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"metadata": {"name": "vm1"}}, id="no-spec"),
        pytest.param({"metadata": {"name": "vm1"}, "spec": {}}, id="no-claims"),
        pytest.param(
            {"metadata": {"name": "vm1"}, "spec": {"resourceClaims": [{"name": "x"}]}},
            id="tenant-claims-replaced",
        ),
    ],
)
def test_resource_claims_patch_makes_the_list_exactly_the_entries_once(obj: Obj) -> None:
    entries, _ = vmi_admission.dra_shape([TemplateRef("a10-dra", 1)], ["vm1-gpu-0"], CLASSES, {})
    ops = vmi_admission.resource_claims_patch(obj, entries)
    assert ops
    patched = apply_json_patch(obj, ops)
    assert patched["spec"]["resourceClaims"] == entries
    assert vmi_admission.resource_claims_patch(patched, entries) == []
