"""A VM's claim references (docs/design.md §2, §4, §5 "VMs"): the annotation's grammar with a
message for every error, the VMI webhook's refusals (each naming the field and what is
allowed), template claim names (valid, bounded, deterministic, distinct) and objects, the gpus
entries, the claims' attachment, the pod kinds, and the pod patches (the gate added once,
tolerations not doubled, the pin ANDed into every existing term, other gates kept)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import launcher_pods, patches, references, templates, vmi_admission
from gpuoperator.model.references import HeldRef, TemplateRef
from harness import objects
from harness.offline import apply_json_patch, apply_merge_patch, pointer_tokens

Obj = dict[str, Any]
NS = "tenant-a"
ANNOTATION = "annotation gpu.cozystack.io/claims"
A10_RES = "nvidia.com/GA102GL_A10"
L40S_RES = "nvidia.com/L40S-24Q"
GATE = "gpu.cozystack.io/placement"
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


# -- fixtures ---------------------------------------------------------------------------------


def gpuclass(
    name: str,
    mode: str = "passthrough",
    resource: str = A10_RES,
    max_count: int | None = None,
    tolerations: list[Obj] | None = None,
) -> Obj:
    extra: dict[str, Any] = {} if max_count is None else {"maxCount": max_count}
    return objects.gpuclass(name, mode=mode, resource=resource, tolerations=tolerations, **extra)


CLASSES: dict[str, Obj] = {
    "a10": gpuclass("a10"),
    "a10-max4": gpuclass("a10-max4", max_count=4),
    "l40s": gpuclass("l40s", "vgpu", L40S_RES),
}


def claim(
    name: str,
    class_name: str = "a10",
    count: int = 1,
    *,
    template: bool = False,
    deleting: bool = False,
    attachment: Obj | None = None,
) -> Obj:
    return objects.claim(
        name,
        class_name=class_name,
        count=count,
        rv=7,
        labels={"gpu.cozystack.io/template-claim": "true"} if template else None,
        deleting=deleting,
        phase="Bound" if attachment is not None else None,
        attached=attachment,
    )


def vmi(
    name: str = "vm1",
    *,
    uid: str | None = None,
    refs: str | None = None,
    gpus: list[Obj] | None = None,
    host_devices: list[Obj] | None = None,
    deleting: bool = False,
) -> Obj:
    devices: Obj = {"disks": []}
    if gpus is not None:
        devices["gpus"] = gpus
    if host_devices is not None:
        devices["hostDevices"] = host_devices
    return objects.vmi(
        name, uid=uid or None, refs=refs, deleting=deleting, rv=None, devices=devices
    )


def namespace(entitled: bool = False) -> Obj:
    return objects.namespace(NS, entitled=entitled)


# -- parsing ----------------------------------------------------------------------------------


def test_parse_reads_the_design_example_in_order() -> None:
    value = '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":2}}]'
    assert references.parse(value) == [HeldRef("hold-a"), TemplateRef("a10", 2)]


def test_parse_accepts_sixteen_references_and_repeated_templates() -> None:
    items = [{"claimTemplate": {"className": "a10", "count": 1}}] * 15 + [{"claim": "h"}]
    refs = references.parse(json.dumps(items, indent=2))
    assert len(refs) == 16
    assert refs[0] == refs[1] == TemplateRef("a10", 1)


def test_parse_accepts_the_largest_count() -> None:
    value = '[{"claimTemplate": {"count": 64, "className": "a10"}}]'
    assert references.parse(value) == [TemplateRef("a10", 64)]


def test_parse_accepts_the_longest_list_indented_and_refuses_a_longer_value() -> None:
    longest = [{"claimTemplate": {"className": "a" * 63, "count": 64}}] * 16
    indented = json.dumps(longest, indent=4)
    assert len(indented) <= references.MAX_ANNOTATION_LENGTH
    assert len(references.parse(indented)) == 16
    # Valid JSON, valid references, but padded with whitespace past the bound.
    padded = indented + " " * (references.MAX_ANNOTATION_LENGTH - len(indented) + 1)
    with pytest.raises(references.AnnotationError) as refused:
        references.parse(padded)
    assert str(refused.value) == (
        f"{ANNOTATION}: longer than 4096 characters; allowed: at most 4096 characters of "
        f"JSON such as {references.EXAMPLE}"
    )
    # The message does not depend on how much longer: a cut past the bound reads the same.
    with pytest.raises(references.AnnotationError) as cut:
        references.parse(padded + " " * 1_000_000)
    assert str(cut.value) == str(refused.value)


def seventeen() -> str:
    return json.dumps([{"claim": f"c{i}"} for i in range(17)])


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        pytest.param(None, ["missing", "gpu.cozystack.io/claims=true", "e.g. ["], id="missing"),
        pytest.param("hold-a", ["not valid JSON", "allowed: a JSON list"], id="not-json"),
        pytest.param("", ["not valid JSON", "allowed: a JSON list"], id="empty-string"),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":NaN}}]',
            ["not valid JSON", "NaN"],
            id="nan-is-not-json",
        ),
        pytest.param("[" * 2000 + "]" * 2000, ["not valid JSON"], id="nested-too-deep"),
        pytest.param(
            '{"claim":"hold-a"}', ["must be a JSON list", "got an object", "allowed"], id="object"
        ),
        pytest.param('"hold-a"', ["must be a JSON list", 'got "hold-a"'], id="string"),
        pytest.param("[]", ["the list is empty", "allowed: 1 to 16 references"], id="empty-list"),
        pytest.param(seventeen(), ["17 references, at most 16 are allowed"], id="too-many"),
        pytest.param(
            '[{"claim":"a"}, 1]',
            ["item 2: must be an object with exactly one of claim or claimTemplate, got 1"],
            id="item-not-object",
        ),
        pytest.param('[["a"]]', ["item 1: must be an object", "got a list"], id="item-list"),
        pytest.param(
            "[{}]",
            ["item 1: must have exactly one of claim or claimTemplate, got neither"],
            id="item-empty",
        ),
        pytest.param(
            '[{"claim":"a","claimTemplate":{"className":"a10","count":1}}]',
            ["item 1: must have exactly one of claim or claimTemplate, got both"],
            id="item-both",
        ),
        pytest.param(
            '[{"claim":"a","node":"n1"}]',
            ['item 1: unknown key "node"; allowed: claim or claimTemplate'],
            id="item-unknown-key",
        ),
        pytest.param(
            '[{"claim":"a","claim":"b"}]',
            ['the key "claim" appears twice', "each key is allowed once"],
            id="repeated-json-key",
        ),
        pytest.param(
            '[{"claim":5}]',
            ["item 1: claim must be a GPUClaim name (a DNS label", "got 5"],
            id="claim-not-string",
        ),
        pytest.param(
            '[{"claim":"Hold-A"}]', ["item 1: claim must be", 'got "Hold-A"'], id="claim-upper"
        ),
        pytest.param(
            '[{"claim":"hold.a"}]', ["item 1: claim must be", "DNS label"], id="claim-dotted"
        ),
        pytest.param(
            json.dumps([{"claim": "a" * 64}]),
            ["item 1: claim must be", "at most 63 characters"],
            id="claim-too-long",
        ),
        pytest.param('[{"claim":""}]', ["item 1: claim must be", 'got ""'], id="claim-empty"),
        pytest.param(
            '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":1}},'
            '{"claim":"hold-a"}]',
            [
                "item 3: claim hold-a is already referenced by item 1",
                "each held claim may be referenced once",
            ],
            id="same-held-claim-twice",
        ),
        pytest.param(
            '[{"claimTemplate":"a10"}]',
            ["item 1: claimTemplate must be an object", '"className"', 'got "a10"'],
            id="template-not-object",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":1,"node":"n"}}]',
            ['item 1: claimTemplate has unknown key "node"; allowed: className, count'],
            id="template-unknown-key",
        ),
        pytest.param(
            '[{"claimTemplate":{"count":1}}]',
            ["item 1: claimTemplate.className is required", "DNS label"],
            id="class-missing",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"A10!","count":1}}]',
            ["item 1: claimTemplate.className must be a class name", 'got "A10!"'],
            id="class-invalid",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10"}}]',
            ["item 1: claimTemplate.count is required (an integer >= 1)"],
            id="count-missing",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":-1}}]',
            ["item 1: claimTemplate.count must be an integer >= 1, got -1"],
            id="count-negative",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":"2"}}]',
            ['claimTemplate.count must be an integer >= 1, got "2"'],
            id="count-string",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":2.0}}]',
            ["claimTemplate.count must be an integer >= 1, got 2.0"],
            id="count-float",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":true}}]',
            ["claimTemplate.count must be an integer >= 1, got true"],
            id="count-bool",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":null}}]',
            ["claimTemplate.count must be an integer >= 1, got null"],
            id="count-null",
        ),
        pytest.param(
            '[{"claimTemplate":{"className":"a10","count":65}}]',
            ["item 1: claimTemplate.count must be at most 64, got 65"],
            id="count-too-large",
        ),
    ],
)
def test_parse_refuses_with_a_message_naming_annotation_item_and_allowed(
    value: str | None, fragments: list[str]
) -> None:
    with pytest.raises(references.AnnotationError) as caught:
        references.parse(value)
    message = str(caught.value)
    assert message.startswith(f"{ANNOTATION}: ")
    for fragment in fragments:
        assert fragment in message
    assert isinstance(caught.value, ValueError)


def test_parse_message_for_a_zero_count_is_the_documented_one() -> None:
    value = '[{"claim":"a"},{"claimTemplate":{"className":"a10","count":0}}]'
    with pytest.raises(references.AnnotationError) as caught:
        references.parse(value)
    assert str(caught.value) == (
        "annotation gpu.cozystack.io/claims: item 2: claimTemplate.count must be an integer "
        ">= 1, got 0"
    )


def test_parse_shortens_long_values_in_messages() -> None:
    with pytest.raises(references.AnnotationError) as caught:
        references.parse(json.dumps([{"claim": "X" * 10_000}]))
    assert len(str(caught.value)) < 300


def test_from_object_reads_the_annotation_of_a_vmi_or_pod() -> None:
    obj = vmi(refs='[{"claim":"hold-a"}]')
    assert references.has_references(obj)
    assert references.from_object(obj) == [HeldRef("hold-a")]
    assert not references.has_references(vmi())
    with pytest.raises(references.AnnotationError, match="missing"):
        references.from_object(vmi())


_names = st.from_regex(DNS_LABEL, fullmatch=True).filter(lambda s: len(s) <= 63)
_refs = st.lists(
    st.one_of(
        _names.map(HeldRef),
        st.builds(TemplateRef, _names, st.integers(1, references.MAX_TEMPLATE_COUNT)),
    ),
    min_size=1,
    max_size=references.MAX_REFERENCES,
).filter(lambda rs: len(references.held_claims(rs)) == len(set(references.held_claims(rs))))


@settings(max_examples=200, deadline=None)
@given(_refs)
def test_dump_then_parse_gives_the_references_back(refs: list[references.Reference]) -> None:
    assert references.parse(references.dump(refs)) == refs


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_either_returns_references_or_raises_reference_error(value: str) -> None:
    try:
        refs = references.parse(value)
    except references.AnnotationError as error:
        assert str(error).startswith(ANNOTATION)
    else:
        assert 1 <= len(refs) <= references.MAX_REFERENCES


def test_claim_and_class_names_follow_reference_order() -> None:
    refs: list[references.Reference] = [
        TemplateRef("l40s", 1),
        HeldRef("hold-a"),
        TemplateRef("a10", 2),
        HeldRef("ghost"),
    ]
    claims = {"hold-a": claim("hold-a", "a10")}
    assert references.held_claims(refs) == ["hold-a", "ghost"]
    assert templates.claim_names("vm1", refs) == ["vm1-gpu-0", "hold-a", "vm1-gpu-2", "ghost"]
    assert references.class_names(refs, claims) == ["l40s", "a10"]


# -- template claims --------------------------------------------------------------------------


def is_subdomain(name: str) -> bool:
    return len(name) <= 253 and SUBDOMAIN.fullmatch(name) is not None


def test_template_claim_name_of_a_short_vmi_is_readable() -> None:
    assert templates.template_claim_name("vm1", 0) == "vm1-gpu-0"
    assert templates.template_claim_name("web.prod", 15) == "web.prod-gpu-15"


@pytest.mark.parametrize(
    "vmi_name",
    [
        pytest.param("a" * 253, id="longest-label-run"),
        pytest.param("a" * 238, id="just-too-long"),
        pytest.param(("a" * 62 + ".") * 3 + "b" * 60, id="dotted-253"),
        pytest.param("a" * 225 + "-" * 10 + "b" * 18, id="cut-ends-in-dash"),
        pytest.param("a" * 226 + "." + "b" * 26, id="cut-ends-in-dot"),
    ],
)
def test_template_claim_name_of_a_long_vmi_is_valid_bounded_and_hashed(vmi_name: str) -> None:
    assert is_subdomain(vmi_name)
    names = [templates.template_claim_name(vmi_name, i) for i in range(16)]
    for i, name in enumerate(names):
        assert is_subdomain(name), name
        assert len(name) <= templates.MAX_TEMPLATE_CLAIM_NAME
        assert is_subdomain(f"gpuclaim-{name}")  # the usage record's name
        assert name.endswith(f"-gpu-{i}")
    assert len(set(names)) == 16
    assert names == [templates.template_claim_name(vmi_name, i) for i in range(16)]


def test_template_claim_name_is_stable_across_releases() -> None:
    # The template controller finds its claims by this name: the scheme must not change.
    name = templates.template_claim_name("v" * 240, 3)
    assert name == "v" * 227 + "-1dbaebb892-gpu-3"
    assert len(name) == 244


def test_template_claim_name_distinguishes_long_names_sharing_a_prefix() -> None:
    first = templates.template_claim_name("a" * 240 + "x", 0)
    second = templates.template_claim_name("a" * 240 + "y", 0)
    assert first != second


@pytest.mark.parametrize(
    ("vmi_name", "index"),
    [
        pytest.param("vm1", -1, id="negative"),
        pytest.param("vm1", 16, id="beyond-16"),
        pytest.param("", 0, id="no-name"),
    ],
)
def test_template_claim_name_refuses_impossible_inputs(vmi_name: str, index: int) -> None:
    with pytest.raises(ValueError, match=r"index|name"):
        templates.template_claim_name(vmi_name, index)


def _subdomain_names() -> st.SearchStrategy[str]:
    """Valid VMI names, often long (a run of ``z`` in front), cut to 253 characters."""
    label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
    tail = st.lists(label, min_size=1, max_size=4).map(".".join)
    return (
        st.tuples(st.integers(0, 253), tail)
        .map(lambda p: (f"{'z' * p[0]}.{p[1]}" if p[0] else p[1])[:253].rstrip("-."))
        .filter(is_subdomain)
    )


@settings(max_examples=300, deadline=None)
@given(_subdomain_names(), st.integers(0, 15))
def test_template_claim_name_is_always_a_bounded_subdomain(vmi_name: str, index: int) -> None:
    name = templates.template_claim_name(vmi_name, index)
    assert is_subdomain(name)
    assert len(name) <= templates.MAX_TEMPLATE_CLAIM_NAME
    assert name == templates.template_claim_name(vmi_name, index)


@settings(max_examples=100, deadline=None)
@given(st.sets(st.tuples(_subdomain_names(), st.integers(0, 15)), min_size=2, max_size=30))
def test_template_claim_name_is_injective_on_a_sample(pairs: set[tuple[str, int]]) -> None:
    produced = {templates.template_claim_name(n, i) for n, i in pairs}
    assert len(produced) == len(pairs)


def test_template_claim_is_marked_owned_by_its_vmi_and_created_protected() -> None:
    owner = vmi(uid="uid-1")
    assert templates.template_claim(owner, 2, TemplateRef("a10", 3)) == {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClaim",
        "metadata": {
            "name": "vm1-gpu-2",
            "namespace": NS,
            "labels": {"gpu.cozystack.io/template-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm1",
                    "uid": "uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["gpu.cozystack.io/claim-protection"],
        },
        "spec": {"className": "a10", "count": 3},
    }


def test_template_claim_needs_an_existing_vmi() -> None:
    with pytest.raises(ValueError, match="uid"):
        templates.template_claim(vmi(), 0, TemplateRef("a10", 1))


def test_template_claims_and_ownership() -> None:
    owner = vmi(uid="uid-1")
    refs: list[references.Reference] = [
        HeldRef("hold-a"),
        TemplateRef("a10", 1),
        TemplateRef("l40s", 1),
    ]
    made = templates.template_claims(owner, refs)
    assert [c["metadata"]["name"] for c in made] == ["vm1-gpu-1", "vm1-gpu-2"]
    assert all(templates.is_template_claim_of(c, owner) for c in made)
    assert not templates.is_template_claim_of(made[0], vmi(uid="uid-2"))  # a new VMI
    assert not templates.is_template_claim_of(claim("vm1-gpu-1"), owner)  # a tenant's claim
    unmarked = copy.deepcopy(made[0])
    del unmarked["metadata"]["labels"]
    assert not templates.is_template_claim_of(unmarked, owner)


# -- the VMI webhook's refusals ---------------------------------------------------------------


def refusals(
    refs: list[references.Reference],
    *,
    obj: Obj | None = None,
    claims: Sequence[Obj] = (),
    live: Sequence[Obj] = (),
    entitled: bool = False,
    permitted: frozenset[str] | None = None,
    switch: bool = True,
    largest: dict[str, int] | None = None,
) -> list[str]:
    return vmi_admission.vmi_refusals(
        obj if obj is not None else vmi(),
        refs,
        classes=CLASSES,
        claims={c["metadata"]["name"]: c for c in claims},
        live_vmis={v["metadata"]["name"]: v for v in live},
        namespace=namespace(entitled),
        permitted=permitted,
        gpu_for_vms=switch,
        largest_allocatable=largest if largest is not None else dict.fromkeys(CLASSES, 64),
    )


HOLD = claim("hold-a")
HOLD_V = claim("hold-v", "l40s")
OTHER_LIVE = vmi("other", uid="u-other")


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        pytest.param(
            {"refs": [HeldRef("hold-a")], "claims": [HOLD], "switch": False},
            [f"{ANNOTATION}: ", "switched off", "gpuForVMs", "allowed: a VM without the label"],
            id="switch-off",
        ),
        pytest.param(
            {
                "refs": [TemplateRef("a10", 1)],
                "obj": vmi(gpus=[{"name": "mine", "deviceName": A10_RES}]),
            },
            [
                "spec.domain.devices.gpus: 1 entry (mine)",
                "allowed: either gpus entries or claim references, not both",
            ],
            id="raw-gpus-and-references",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [HOLD],
                "obj": vmi(host_devices=[{"name": "extra", "deviceName": A10_RES}]),
            },
            [
                f"spec.domain.devices.hostDevices: 1 entry (extra ({A10_RES})) name a GPU "
                "resource next to claim references",
                "allowed: GPUs through claim references only",
            ],
            id="gpu-host-devices-and-references",
        ),
        pytest.param(
            {
                "refs": [TemplateRef("a10", 1)],
                "obj": vmi(
                    host_devices=[
                        {"name": "nic", "deviceName": "intel.com/sriov"},
                        {"name": "vgpu", "deviceName": L40S_RES},
                    ]
                ),
            },
            [f"spec.domain.devices.hostDevices: 1 entry (vgpu ({L40S_RES}))"],
            id="host-device-of-any-classes-resource",
        ),
        pytest.param(
            {"refs": [TemplateRef("nope", 1)]},
            [
                f"{ANNOTATION}: item 1: claimTemplate.className: class nope does not exist",
                "allowed: a class of the catalog (kubectl get gpuclasses lists them)",
            ],
            id="unknown-class",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10", 1), HeldRef("ghost")], "claims": [HOLD]},
            [
                f"{ANNOTATION}: item 2: claim ghost: no such GPUClaim in namespace {NS}",
                f"allowed: a claim ordered in this namespace (kubectl get gpuclaims -n {NS}",
            ],
            id="unknown-claim",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "other", "uid": "u-other"})],
                "live": [OTHER_LIVE],
            },
            [
                f"{ANNOTATION}: item 1: claim hold-a: the claim is in use by another VM instance",
                "a claim serves one VM at a time; allowed: a claim no other live VM uses",
                f"kubectl get gpuclaim hold-a -n {NS} shows the VM",
            ],
            id="attached-to-another-live-vmi",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "other"})],
                "live": [OTHER_LIVE],
            },
            ["item 1: claim hold-a: the claim is in use by another VM instance"],
            id="attached-uid-not-yet-recorded",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [HOLD],
                "live": [vmi("other", uid="u-other", refs='[{"claim":"hold-a"}]')],
            },
            ["item 1: claim hold-a: the claim is in use by another VM instance", "allowed"],
            id="named-by-another-live-vmi-before-attachment",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "other", "uid": "u"})],
                "live": [vmi("other", uid="u", deleting=True)],
            },
            [
                "item 1: claim hold-a: the claim is in use by another VM instance, which is "
                "being deleted and may still hold the GPU",
                "retry once it is gone",
            ],
            id="attached-to-a-vmi-being-deleted",
        ),
        pytest.param(
            {"refs": [HeldRef("vm0-gpu-0")], "claims": [claim("vm0-gpu-0", template=True)]},
            [
                f"{ANNOTATION}: item 1: claim vm0-gpu-0: the operator made this claim",
                "gpu.cozystack.io/template-claim=true",
                "allowed: a claim you ordered, or a claimTemplate",
            ],
            id="template-claim-named-directly",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10-max4", 5)]},
            [
                f"{ANNOTATION}: item 1: claimTemplate.count: class a10-max4 allows at most 4 GPUs",
                "5 were ordered",
            ],
            id="count-above-max-count",
        ),
        pytest.param(
            {"refs": [TemplateRef("l40s", 2)], "entitled": True},
            ["item 1: claimTemplate.count: class l40s allows at most 1 GPU per claim"],
            id="vgpu-default-max-count",
        ),
        pytest.param(
            {"refs": [TemplateRef("l40s", 1)]},
            [
                f"{ANNOTATION}: item 1: claimTemplate.className: class l40s is a vGPU class",
                f"namespace {NS} is not entitled",
                "not entitled to vGPU (label gpu.cozystack.io/vgpu-entitled=true)",
            ],
            id="vgpu-template-not-entitled",
        ),
        pytest.param(
            {"refs": [HeldRef("hold-v")], "claims": [HOLD_V]},
            [
                f"{ANNOTATION}: item 1: claim hold-v: class l40s is a vGPU class",
                "gpu.cozystack.io/vgpu-entitled=true",
            ],
            id="vgpu-held-claim-not-entitled",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10", 1)], "permitted": frozenset({L40S_RES})},
            [
                f"{ANNOTATION}: item 1: claimTemplate.className: class a10 uses {A10_RES}",
                "permittedHostDevices does not permit",
                "allowed: a class whose resource the hoster permits there",
            ],
            id="template-not-permitted",
        ),
        pytest.param(
            {"refs": [HeldRef("hold-a")], "claims": [HOLD], "permitted": frozenset()},
            [
                f"{ANNOTATION}: item 1: claim hold-a: class a10 uses {A10_RES}",
                "does not permit",
                "allowed",
            ],
            id="held-not-permitted-by-empty-table",
        ),
        pytest.param(
            {"refs": [HeldRef("hold-a")], "claims": [claim("hold-a", deleting=True)]},
            ["item 1: claim hold-a: the claim is being deleted", "allowed: a claim that is not"],
            id="held-claim-being-deleted",
        ),
        pytest.param(
            {"refs": [HeldRef("hold-a")], "claims": [claim("hold-a", "gone")]},
            ["item 1: claim hold-a: the claim's class no longer exists", "allowed"],
            id="held-claim-class-gone",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10", 9)], "largest": {"a10": 8}},
            [
                f"{ANNOTATION}: item 1: claimTemplate.count: 9 GPUs of class a10 could never "
                "fit on one node: the most one node serving class a10 has allocatable is 8",
                "allowed: a count of at most 8",
            ],
            id="template-count-above-every-nodes-allocatable",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10", 1)], "largest": {}},
            ["claimTemplate.count: 1 GPU of class a10 could never fit on one node: no node "],
            id="template-of-a-class-no-node-serves",
        ),
    ],
)
def test_vmi_refusals_name_the_field_and_what_is_allowed(
    kwargs: dict[str, Any], fragments: list[str]
) -> None:
    found = refusals(**kwargs)
    assert len(found) == 1, found
    for fragment in fragments:
        assert fragment in found[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"refs": []}, id="no-references"),
        pytest.param({"refs": [], "switch": False}, id="no-references-switch-off"),
        pytest.param(
            {"refs": [HeldRef("hold-a"), TemplateRef("a10", 8)], "claims": [HOLD]},
            id="held-and-template",
        ),
        pytest.param(
            {
                "refs": [TemplateRef("a10", 1)],
                "obj": vmi(gpus=[{"name": "gpuop-0", "deviceName": A10_RES}]),
            },
            id="own-entries-of-an-earlier-pass-are-not-raw",
        ),
        pytest.param(
            {
                "refs": [TemplateRef("a10", 1)],
                "obj": vmi(host_devices=[{"name": "nic", "deviceName": "intel.com/sriov"}]),
            },
            id="host-devices-that-are-no-gpu",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "gone"})],
            },
            id="attached-vmi-gone",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "other", "uid": "old"})],
                "live": [OTHER_LIVE],
            },
            id="attached-vmi-recreated-with-another-uid",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [claim("hold-a", attachment={"vmi": "vm1", "uid": "old"})],
            },
            id="attached-to-an-earlier-vmi-of-this-name",
        ),
        pytest.param(
            {
                "refs": [HeldRef("hold-a")],
                "claims": [HOLD],
                "live": [
                    vmi("broken", uid="u", refs="not json"),
                    vmi("unlabelled", uid="u2"),
                ],
            },
            id="other-vmis-without-this-claim",
        ),
        pytest.param(
            {
                "refs": [TemplateRef("l40s", 1), HeldRef("hold-v")],
                "claims": [HOLD_V],
                "entitled": True,
            },
            id="vgpu-entitled",
        ),
        pytest.param(
            {"refs": [TemplateRef("a10", 1)], "permitted": frozenset({A10_RES})},
            id="permitted",
        ),
        pytest.param({"refs": [TemplateRef("a10", 64)]}, id="passthrough-unlimited"),
        pytest.param(
            {"refs": [TemplateRef("a10", 8)], "largest": {"a10": 8}},
            id="template-as-large-as-the-largest-node",
        ),
        pytest.param(
            {"refs": [HeldRef("hold-a")], "claims": [HOLD], "obj": vmi(name="")},
            id="held-claims-with-a-generated-name",
        ),
    ],
)
def test_vmi_refusals_admit(kwargs: dict[str, Any]) -> None:
    assert refusals(**kwargs) == []


def test_vmi_refusals_return_every_refusal_in_reference_order() -> None:
    found = refusals(
        [HeldRef("ghost"), TemplateRef("l40s", 3), TemplateRef("nope", 1)],
        obj=vmi(gpus=[{"name": "mine", "deviceName": A10_RES}]),
        permitted=frozenset(),
    )
    assert [f.split(":")[0] if f.startswith("spec") else f.split(":")[1] for f in found] == [
        "spec.domain.devices.gpus",
        " item 1",
        " item 2",
        " item 2",
        " item 2",
        " item 3",
    ]


def test_vmi_refusals_with_the_switch_off_say_only_that() -> None:
    found = refusals([TemplateRef("nope", 1)], switch=False)
    assert len(found) == 1
    assert "gpuForVMs" in found[0]


# -- gpus entries and attachment --------------------------------------------------------------


def test_gpu_entries_one_per_unit_in_reference_order() -> None:
    claims = {"hold-v": claim("hold-v", "l40s"), "hold-a": claim("hold-a", "a10", count=2)}
    refs: list[references.Reference] = [
        HeldRef("hold-a"),
        TemplateRef("l40s", 1),
        HeldRef("hold-v"),
        TemplateRef("a10", 1),
    ]
    entries = vmi_admission.gpu_entries(refs, CLASSES, claims)
    assert entries == [
        {"name": "gpuop-0", "deviceName": A10_RES},
        {"name": "gpuop-1", "deviceName": A10_RES},
        {"name": "gpuop-2", "deviceName": L40S_RES},
        {"name": "gpuop-3", "deviceName": L40S_RES},
        {"name": "gpuop-4", "deviceName": A10_RES},
    ]
    assert all(DNS_LABEL.fullmatch(e["name"]) for e in entries)
    assert all(vmi_admission.is_operator_entry(e) for e in entries)


@pytest.mark.parametrize(
    "refs",
    [
        pytest.param([HeldRef("ghost")], id="unknown-claim"),
        pytest.param([TemplateRef("nope", 1)], id="unknown-class"),
    ],
)
def test_gpu_entries_need_known_claims_and_classes(refs: list[references.Reference]) -> None:
    with pytest.raises(ValueError, match="unknown"):
        vmi_admission.gpu_entries(refs, CLASSES, {})


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(vmi(), id="no-gpus"),
        pytest.param(vmi(gpus=[]), id="empty-gpus"),
        pytest.param(vmi(gpus=[{"name": "gpuop-0", "deviceName": "x/y"}]), id="stale-own"),
        pytest.param({"metadata": {"name": "vm1"}, "spec": {"domain": {}}}, id="no-devices"),
        pytest.param({"metadata": {"name": "vm1"}, "spec": {}}, id="no-domain"),
    ],
)
def test_gpus_patch_makes_the_list_exactly_the_entries_once(obj: Obj) -> None:
    entries = vmi_admission.gpu_entries([TemplateRef("a10", 2)], CLASSES, {})
    ops = vmi_admission.gpus_patch(obj, entries)
    assert ops
    patched = apply_json_patch(obj, ops)
    assert patched["spec"]["domain"]["devices"]["gpus"] == entries
    assert vmi_admission.gpus_patch(patched, entries) == []
    assert vmi_admission.raw_gpu_entries(patched) == []


def test_unadmitted_entries_are_any_but_exactly_what_the_webhook_writes() -> None:
    refs: list[references.Reference] = [HeldRef("hold-a"), TemplateRef("a10", 2)]
    claims = {"hold-a": HOLD}
    entries = vmi_admission.gpu_entries(refs, CLASSES, claims)
    names = templates.claim_names("vm1", refs)
    assert vmi_admission.unadmitted_entries(vmi(gpus=entries), refs, CLASSES, claims, names) is None
    for gpus in (None, [], entries[:2], [*entries, {"name": "mine", "deviceName": A10_RES}]):
        why = vmi_admission.unadmitted_entries(vmi(gpus=gpus), refs, CLASSES, claims, names)
        assert why is not None and why.startswith("spec.domain.devices.gpus: "), why
        assert "not the 3 entries the VMI webhook writes" in why
    # A template of 64 units judged for 2: the entries give it away.
    big: list[references.Reference] = [HeldRef("hold-a"), TemplateRef("a10", 64)]
    assert (
        vmi_admission.unadmitted_entries(
            vmi(gpus=entries), big, CLASSES, claims, templates.claim_names("vm1", big)
        )
        is not None
    )
    unknown = vmi_admission.unadmitted_entries(
        vmi(gpus=entries), [HeldRef("ghost")], CLASSES, {}, ["ghost"]
    )
    assert unknown is not None and "cannot be derived" in unknown


# -- the pod webhook --------------------------------------------------------------------------


LAUNCHER_LABELS = {"kubevirt.io": "virt-launcher", "gpu.cozystack.io/claims": "true"}


def pod(
    *,
    labels: Obj | None = None,
    annotations: Obj | None = None,
    gates: list[Obj] | None = None,
    tolerations: list[Obj] | None = None,
    affinity: Obj | None = None,
) -> Obj:
    spec: Obj = {}
    if gates is not None:
        spec["schedulingGates"] = gates
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    return objects.pod(
        "virt-launcher-vm1-abcde",
        rv=99,
        labels=dict(LAUNCHER_LABELS) if labels is None else labels,
        annotations=annotations,
        **spec,
    )


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        pytest.param(pod(), "launcher", id="launcher"),
        pytest.param(
            pod(annotations={"kubevirt.io/ephemeral-provisioning": "true"}),
            "ephemeral",
            id="wffc-temporary-pod",
        ),
        pytest.param(
            pod(labels={**LAUNCHER_LABELS, "kubevirt.io/migrationJobUID": "m-1"}),
            "migration-target",
            id="migration-target",
        ),
        pytest.param(
            pod(
                labels={**LAUNCHER_LABELS, "kubevirt.io/migrationJobUID": "m-1"},
                annotations={"kubevirt.io/ephemeral-provisioning": "true"},
            ),
            "migration-target",
            id="migration-target-wins",
        ),
        pytest.param(pod(labels={"kubevirt.io": "virt-launcher"}), "other", id="no-claims-label"),
        pytest.param(
            pod(labels={"kubevirt.io": "virt-launcher", "gpu.cozystack.io/claims": "false"}),
            "other",
            id="claims-label-false",
        ),
        pytest.param(pod(labels={"gpu.cozystack.io/claims": "true"}), "other", id="not-launcher"),
        pytest.param(
            pod(labels={"kubevirt.io": "virt-handler", "gpu.cozystack.io/claims": "true"}),
            "other",
            id="other-kubevirt-pod",
        ),
        pytest.param({}, "other", id="empty"),
    ],
)
def test_launcher_pod_kind(obj: Obj, kind: str) -> None:
    assert launcher_pods.launcher_pod_kind(obj) == kind


@pytest.mark.parametrize(
    ("obj", "expected_gates"),
    [
        pytest.param(pod(), [{"name": GATE}], id="no-gates"),
        pytest.param(pod(gates=[]), [{"name": GATE}], id="empty-gates"),
        pytest.param(
            pod(gates=[{"name": "other/gate"}]),
            [{"name": "other/gate"}, {"name": GATE}],
            id="other-gate-kept",
        ),
        pytest.param(
            pod(gates=[{"name": GATE}, {"name": "other/gate"}]),
            [{"name": GATE}, {"name": "other/gate"}],
            id="already-gated",
        ),
    ],
)
def test_gate_patch_adds_the_gate_once(obj: Obj, expected_gates: list[Obj]) -> None:
    patched = apply_json_patch(obj, launcher_pods.gate_patch(obj))
    assert patched["spec"]["schedulingGates"] == expected_gates
    assert launcher_pods.gate_patch(patched) == []
    assert launcher_pods.is_gated(patched)


def test_gate_patch_on_a_pod_without_spec() -> None:
    ops = launcher_pods.gate_patch({"metadata": {}})
    assert ops == [{"op": "add", "path": "/spec", "value": {"schedulingGates": [{"name": GATE}]}}]


def test_gate_patch_of_a_null_gates_list_writes_the_list() -> None:
    obj = pod()
    obj["spec"]["schedulingGates"] = None
    assert launcher_pods.gate_patch(obj) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]


GPU_TAINT = {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
ZONE = {"key": "zone", "operator": "Equal", "value": "a", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("existing", "class_tolerations", "expected"),
    [
        pytest.param(None, [[GPU_TAINT]], [GPU_TAINT], id="pod-without-tolerations"),
        pytest.param(
            [{"key": "x", "operator": "Exists"}],
            [[GPU_TAINT, ZONE]],
            [{"key": "x", "operator": "Exists"}, GPU_TAINT, ZONE],
            id="appended",
        ),
        pytest.param(
            [{**GPU_TAINT, "value": ""}],
            [[GPU_TAINT]],
            [{**GPU_TAINT, "value": ""}],
            id="already-present",
        ),
        pytest.param(
            [{"key": "zone", "value": "a", "effect": "NoExecute", "tolerationSeconds": 30}],
            [[ZONE]],
            [{"key": "zone", "value": "a", "effect": "NoExecute", "tolerationSeconds": 30}],
            id="present-with-default-operator",
        ),
        pytest.param(None, [[GPU_TAINT], [GPU_TAINT, ZONE]], [GPU_TAINT, ZONE], id="shared"),
        pytest.param(
            [],
            [[{"operator": "Exists"}, {"key": "k", "value": "v"}]],
            [{"operator": "Exists"}, {"key": "k", "operator": "Equal", "value": "v"}],
            id="tolerate-all-and-default-equal",
        ),
        pytest.param(None, [[]], None, id="no-class-tolerations"),
    ],
)
def test_tolerations_patch_adds_missing_tolerations_once(
    existing: list[Obj] | None,
    class_tolerations: list[list[Obj]],
    expected: list[Obj] | None,
) -> None:
    obj = pod(tolerations=existing)
    classes = [gpuclass(f"c{i}", tolerations=t) for i, t in enumerate(class_tolerations)]
    patched = apply_json_patch(obj, launcher_pods.tolerations_patch(obj, classes))
    assert patched["spec"].get("tolerations") == expected
    assert launcher_pods.tolerations_patch(patched, classes) == []


def test_pod_patches_combine_into_one_admission_patch() -> None:
    obj = pod(gates=[{"name": "other/gate"}], tolerations=[])
    ops = launcher_pods.gate_patch(obj) + launcher_pods.tolerations_patch(
        obj, [gpuclass("a10", tolerations=[GPU_TAINT])]
    )
    patched = apply_json_patch(obj, ops)
    assert patched["spec"]["schedulingGates"] == [{"name": "other/gate"}, {"name": GATE}]
    assert patched["spec"]["tolerations"] == [GPU_TAINT]
    assert all(op["path"].startswith("/spec/") for op in ops)


@pytest.mark.parametrize(
    ("parts", "pointer"),
    [
        pytest.param(("spec", "tolerations", "-"), "/spec/tolerations/-", id="plain"),
        pytest.param(
            ("metadata", "labels", "gpu.cozystack.io/claims"),
            "/metadata/labels/gpu.cozystack.io~1claims",
            id="slash",
        ),
        pytest.param(("a~b", "c/~d"), "/a~0b/c~1~0d", id="tilde-before-slash"),
    ],
)
def test_json_pointer_escapes(parts: tuple[str, ...], pointer: str) -> None:
    assert patches.json_pointer(*parts) == pointer
    assert pointer_tokens(pointer) == list(parts)


# -- the placement controller -----------------------------------------------------------------


def pinned(node: str) -> Obj:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def hostname_pinned(node: str) -> Obj:
    return {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}


ZONE_A = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
ZONE_B = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
BY_NAME = {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}


def required(*terms: Obj) -> Obj:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


@pytest.mark.parametrize(
    ("affinity", "expected_terms"),
    [
        pytest.param(None, [{"matchFields": [pinned("n1")]}], id="no-affinity"),
        pytest.param({}, [{"matchFields": [pinned("n1")]}], id="empty-affinity"),
        pytest.param(required(), [{"matchFields": [pinned("n1")]}], id="no-terms"),
        pytest.param(
            required({"matchExpressions": [ZONE_A]}),
            [{"matchExpressions": [ZONE_A], "matchFields": [pinned("n1")]}],
            id="one-term",
        ),
        pytest.param(
            required({"matchExpressions": [ZONE_A]}, {"matchExpressions": [ZONE_B]}),
            [
                {"matchExpressions": [ZONE_A], "matchFields": [pinned("n1")]},
                {"matchExpressions": [ZONE_B], "matchFields": [pinned("n1")]},
            ],
            id="anded-into-every-ored-term",
        ),
        pytest.param(
            required({"matchFields": [BY_NAME]}),
            [{"matchFields": [BY_NAME, pinned("n1")]}],
            id="fields-only-term",
        ),
        pytest.param(
            required({}, {"matchExpressions": [ZONE_A]}),
            [{}, {"matchExpressions": [ZONE_A], "matchFields": [pinned("n1")]}],
            id="empty-term-matches-nothing-and-stays",
        ),
        pytest.param(
            required({"matchExpressions": [ZONE_A], "matchFields": [pinned("n1")]}),
            [{"matchExpressions": [ZONE_A], "matchFields": [pinned("n1")]}],
            id="already-pinned",
        ),
    ],
)
def test_pin_and_ungate_ands_the_pin_into_every_term(
    affinity: Obj | None, expected_terms: list[Obj]
) -> None:
    obj = pod(gates=[{"name": GATE}], affinity=affinity)
    before = copy.deepcopy(obj)
    patch = launcher_pods.pin_and_ungate(obj, "n1")
    assert obj == before  # pure
    node_affinity = patch["spec"]["affinity"]["nodeAffinity"]
    terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == expected_terms
    assert patch["spec"]["schedulingGates"] == []
    assert patch["metadata"] == {"resourceVersion": "99"}
    updated = apply_merge_patch(obj, patch)
    assert launcher_pods.pin_and_ungate(updated, "n1")["spec"] == patch["spec"]  # idempotent
    if any(t for t in expected_terms):
        assert launcher_pods.pinned_node(updated) == "n1"


def test_pin_and_ungate_needs_a_node() -> None:
    with pytest.raises(ValueError, match="node"):
        launcher_pods.pin_and_ungate(pod(gates=[{"name": GATE}]), "")


def test_pin_and_ungate_keeps_other_gates_and_the_rest_of_the_affinity() -> None:
    preferred = [{"weight": 1, "preference": {"matchExpressions": [ZONE_B]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}
    affinity = required({"matchExpressions": [ZONE_A]})
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    affinity["podAntiAffinity"] = anti
    obj = pod(gates=[{"name": "a/first"}, {"name": GATE}, {"name": "b/last"}], affinity=affinity)
    updated = apply_merge_patch(obj, launcher_pods.pin_and_ungate(obj, "gpu-7"))
    spec = updated["spec"]
    assert spec["schedulingGates"] == [{"name": "a/first"}, {"name": "b/last"}]
    assert spec["affinity"]["podAntiAffinity"] == anti
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == (
        preferred
    )
    assert launcher_pods.pinned_node(updated) == "gpu-7"
    assert not launcher_pods.is_gated(updated)
    assert spec["containers"] == [{"name": "compute"}]


@pytest.mark.parametrize(
    "affinity",
    [
        pytest.param(None, id="none"),
        pytest.param(required({"matchExpressions": [ZONE_A]}), id="not-pinned"),
        pytest.param(
            required({"matchFields": [pinned("a")]}, {"matchFields": [pinned("b")]}),
            id="two-nodes",
        ),
        pytest.param(
            required({"matchFields": [pinned("a")]}, {"matchExpressions": [ZONE_A]}),
            id="one-term-unpinned",
        ),
        pytest.param(
            required({"matchExpressions": [pinned("a")]}),
            id="metadata-name-is-a-field-not-a-label",
        ),
    ],
)
def test_pinned_node_is_none_unless_every_term_pins_one_node(affinity: Obj | None) -> None:
    assert launcher_pods.pinned_node(pod(affinity=affinity)) is None


def test_the_pin_is_on_the_node_name_field_not_the_hostname_label() -> None:
    """The hostname label can differ from the node's name; the pin must name the node."""
    patch = launcher_pods.pin_and_ungate(pod(gates=[{"name": GATE}]), "n1")
    [term] = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}


def test_a_pod_pinned_on_the_hostname_label_by_an_earlier_version_is_still_read_as_pinned() -> None:
    affinity = required({"matchExpressions": [ZONE_A, hostname_pinned("n1")]})
    assert launcher_pods.pinned_node(pod(affinity=affinity)) == "n1"
