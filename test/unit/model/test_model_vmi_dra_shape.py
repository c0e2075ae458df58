"""KubeVirt's DRA shape for VMI references to claims of DRA classes (docs/design.md §5
"DRA classes"): ``spec.resourceClaims`` naming each claim's hold and ``gpus`` entries naming
the claim and request, never a ``deviceName``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuoperator.model import slimming, templates, vmi_admission
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


# -- the webhook's decision -----------------------------------------------------------------


def refusals(refs: list[Reference], claims: dict[str, Obj], name: str = "vm1") -> list[str]:
    return vmi_admission.vmi_refusals(
        {"metadata": {"name": name, "namespace": "t"}, "spec": {}},
        refs,
        classes=CLASSES,
        claims=claims,
        live_vmis={},
        namespace={"metadata": {"name": "t"}},
        permitted=frozenset(),  # permits no device-plugin resource; DRA classes need none
        gpu_for_vms=True,
        largest_allocatable={"a10-dra": 2},
    )


def test_a_dra_template_or_held_claim_is_admitted_and_gets_the_dra_shape() -> None:
    held = {"hold": objects.claim("hold", namespace="t", class_name="a10-dra", count=2)}
    admitted: list[list[Reference]] = [[TemplateRef("a10-dra", 2)], [HeldRef("hold")]]
    for refs in admitted:
        assert refusals(refs, held) == []
    obj: Obj = {"metadata": {"name": "vm1"}, "spec": {"domain": {"devices": {}}}}
    refs2: list[Reference] = [HeldRef("hold")]
    ops = vmi_admission.admission_patch(obj, refs2, ["hold"], CLASSES, held)
    patched = apply_json_patch(obj, ops)
    assert patched["spec"]["resourceClaims"] == [{"name": "gpuop-0", "resourceClaimName": "hold"}]
    assert patched["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "gpuop-0", "claimName": "gpuop-0", "requestName": "gpu"}
    ]
    assert vmi_admission.admission_patch(patched, refs2, ["hold"], CLASSES, held) == []
    assert vmi_admission.unadmitted_entries(patched, refs2, CLASSES, held, ["hold"]) is None
    # The same gpus without the webhook's resourceClaims were not judged at admission.
    del patched["spec"]["resourceClaims"]
    why = vmi_admission.unadmitted_entries(patched, refs2, CLASSES, held, ["hold"])
    assert why is not None and why.startswith("spec.resourceClaims: "), why


def test_a_device_plugin_vmi_keeps_its_own_resource_claims() -> None:
    obj: Obj = {"metadata": {"name": "vm1"}, "spec": {"resourceClaims": [{"name": "nic"}]}}
    refs: list[Reference] = [TemplateRef("a10", 1)]
    patched = apply_json_patch(
        obj, vmi_admission.admission_patch(obj, refs, ["vm1-gpu-0"], CLASSES, {})
    )
    assert patched["spec"]["resourceClaims"] == [{"name": "nic"}]
    assert patched["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] == objects.A10


@pytest.mark.parametrize(
    ("refs", "name", "fragment"),
    [
        pytest.param(
            [TemplateRef("a10-dra", 1), TemplateRef("a10", 1)],
            "vm1",
            "items 0 are claims of DRA classes and items 1 of device-plugin classes",
            id="mixed",
        ),
        pytest.param(
            [TemplateRef("a10-dra", 1), TemplateRef("a10-dra", 1)],
            "vm1",
            "items 0, 1 are 2 claims of DRA classes",
            id="two-dra",
        ),
        pytest.param([TemplateRef("a10-dra", 1)], "", "no metadata.name", id="unnamed"),
    ],
)
def test_what_the_dra_shape_cannot_serve_is_refused(
    refs: list[Reference], name: str, fragment: str
) -> None:
    found = refusals(refs, {}, name)
    assert any(fragment in r and "allowed: " in r for r in found), found


def test_the_cached_vmi_keeps_the_dra_shape_the_template_controller_compares() -> None:
    refs: list[Reference] = [TemplateRef("a10-dra", 1)]
    obj: Obj = {
        "metadata": {"name": "vm1", "namespace": "t"},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}},
    }
    patched = apply_json_patch(
        obj, vmi_admission.admission_patch(obj, refs, ["vm1-gpu-0"], CLASSES, {})
    )
    cached = slimming.slim_vmi(patched)
    assert vmi_admission.unadmitted_entries(cached, refs, CLASSES, {}, ["vm1-gpu-0"]) is None
