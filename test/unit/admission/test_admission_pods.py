"""The pod webhook (docs/design.md §5 "VMs"): a launcher pod, or KubeVirt's temporary pod, of a VM
with claim references gets the placement gate once and the tolerations of its claims'
classes once, however often it is admitted; so does a migration target of a VM whose claims
are not all of DRA classes (docs/design.md §5 "Live migration"); other targets and other
pods are admitted untouched. Its registration (config/webhook) is checked with the shipped manifests
(test/unit/config/test_config_webhooks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from admission import pods
from gpuoperator import settings
from gpuoperator.runtime import admitting
from harness import objects
from harness.offline import apply_json_patch, store_caches

Obj = dict[str, Any]
NS = "tenant-a"
GATE = {"name": "gpu.cozystack.io/placement"}
GPU_TAINT = {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
A10_TAINT = {"key": "gpu.example.com/model", "value": "a10", "effect": "NoSchedule"}
L40S_TAINT = {"key": "gpu.example.com/model", "value": "l40s", "effect": "NoSchedule"}
KUBEVIRT = "system:serviceaccount:kubevirt:kubevirt-controller"
VMI_OWNER = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "name": "vm1",
    "uid": "u-vmi",
    "controller": True,
    "blockOwnerDeletion": True,
}


# -- fakes and objects ------------------------------------------------------------------------


def gpuclass(name: str, tolerations: list[Obj]) -> Obj:
    return objects.gpuclass(name, resource=f"nvidia.com/{name}", tolerations=tolerations)


CLASSES = [
    gpuclass("a10", [GPU_TAINT, A10_TAINT]),
    gpuclass("l40s", [GPU_TAINT, L40S_TAINT]),
    gpuclass("plain", []),
    objects.gpuclass("a10-dra", source={"dra": {"deviceClassName": "a10.example.com"}}),
]


CLAIMS = [
    objects.claim("hold-l", class_name="l40s", rv=3),
    objects.claim("hold-a", class_name="a10", rv=3),
    objects.claim("hold-d", class_name="a10-dra", rv=3),
    objects.claim("elsewhere", class_name="plain", namespace="other", rv=3),
]


def pod(
    refs: str | None = '[{"claim":"hold-l"}]',
    *,
    launcher: bool = True,
    labelled: bool = True,
    migration: bool = False,
    ephemeral: bool = False,
    tolerations: list[Obj] | None = None,
    gates: list[Obj] | None = None,
    owners: list[Obj] | None = None,
) -> Obj:
    labels: Obj = {"vm.kubevirt.io/name": "vm1", "kubevirt.io/created-by": "u-vmi"}
    if launcher:
        labels["kubevirt.io"] = "virt-launcher"
    if labelled:
        labels["gpu.cozystack.io/claims"] = "true"
    if migration:
        labels["kubevirt.io/migrationJobUID"] = "u-mig"
    annotations: Obj = {"kubevirt.io/domain": "vm1"}
    if refs is not None:
        annotations["gpu.cozystack.io/claims"] = refs
    if ephemeral:
        annotations["kubevirt.io/ephemeral-provisioning"] = "true"
    spec: Obj = {
        "containers": [{"name": "compute", "image": "virt-launcher"}],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ],
    }
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if gates is not None:
        spec["schedulingGates"] = gates
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "virt-launcher-vm1-",
            "ownerReferences": [VMI_OWNER] if owners is None else owners,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def request(
    obj: Obj, operation: str = "CREATE", user: str = KUBEVIRT
) -> admitting.AdmissionRequest:
    """A review as the API server sends it when KubeVirt's controller creates ``obj``."""
    return objects.admission_request(obj, kind="Pod", operation=operation, user=user)


@pytest.fixture
def webhook() -> pods.PodWebhook:
    return pods.PodWebhook(store_caches(CLASSES, CLAIMS), settings.load(None, {}, {}))


def admitted(webhook: pods.PodWebhook, obj: Obj) -> Obj:
    """The pod after admission (which must allow it)."""
    admission = webhook(request(obj))
    assert admission.allowed, admission.message
    return apply_json_patch(obj, admission.patch)


def toleration_keys(obj: Obj) -> list[tuple[Any, ...]]:
    return [
        (t.get("key"), t.get("operator", "Equal"), t.get("value"), t.get("effect"))
        for t in obj["spec"].get("tolerations", [])
    ]


# -- launcher and temporary pods --------------------------------------------------------------


def test_a_launcher_pod_gets_the_gate_and_its_class_tolerations(webhook: pods.PodWebhook) -> None:
    obj = pod()
    admission = webhook(request(obj))
    assert admission.allowed
    assert admission.patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]},
        {
            "op": "add",
            "path": "/spec/tolerations/-",
            "value": {
                "key": "gpu.example.com/dedicated",
                "operator": "Exists",
                "effect": "NoSchedule",
            },
        },
        {
            "op": "add",
            "path": "/spec/tolerations/-",
            "value": {
                "key": "gpu.example.com/model",
                "operator": "Equal",
                "value": "l40s",
                "effect": "NoSchedule",
            },
        },
    ]
    out = apply_json_patch(obj, admission.patch)
    assert out["spec"]["schedulingGates"] == [GATE]
    assert toleration_keys(out)[0] == ("node.kubernetes.io/not-ready", "Exists", None, "NoExecute")


def test_the_temporary_volume_pod_is_gated_like_the_launcher(webhook: pods.PodWebhook) -> None:
    out = admitted(webhook, pod(ephemeral=True))
    assert out["spec"]["schedulingGates"] == [GATE]
    assert ("gpu.example.com/model", "Equal", "l40s", "NoSchedule") in toleration_keys(out)


def test_tolerations_of_held_and_template_classes_are_added_once_each(
    webhook: pods.PodWebhook,
) -> None:
    refs = (
        '[{"claim":"hold-a"},{"claimTemplate":{"className":"l40s","count":1}},'
        '{"claimTemplate":{"className":"a10","count":2}},{"claimTemplate":'
        '{"className":"plain","count":1}}]'
    )
    out = admitted(webhook, pod(refs))
    assert toleration_keys(out) == [
        ("node.kubernetes.io/not-ready", "Exists", None, "NoExecute"),
        ("gpu.example.com/dedicated", "Exists", None, "NoSchedule"),
        ("gpu.example.com/model", "Equal", "a10", "NoSchedule"),
        ("gpu.example.com/model", "Equal", "l40s", "NoSchedule"),
    ]


def test_tolerations_the_pod_already_carries_are_not_added_again(
    webhook: pods.PodWebhook,
) -> None:
    carried = [{**GPU_TAINT}, {**L40S_TAINT, "operator": "Equal"}]
    admission = webhook(request(pod(tolerations=carried)))
    assert admission.allowed
    assert admission.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


def test_a_pod_without_tolerations_gets_the_whole_list(webhook: pods.PodWebhook) -> None:
    obj = pod()
    del obj["spec"]["tolerations"]
    admission = webhook(request(obj))
    assert admission.patch[1] == {
        "op": "add",
        "path": "/spec/tolerations",
        "value": [
            {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "gpu.example.com/model",
                "operator": "Equal",
                "value": "l40s",
                "effect": "NoSchedule",
            },
        ],
    }


def test_other_gates_are_kept_and_ours_appended(webhook: pods.PodWebhook) -> None:
    out = admitted(webhook, pod(gates=[{"name": "example.com/other"}]))
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/other"}, GATE]


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(), id="launcher"),
        pytest.param(pod(ephemeral=True), id="ephemeral"),
        pytest.param(pod(gates=[{"name": "example.com/other"}]), id="other-gates"),
        pytest.param(
            pod('[{"claim":"hold-a"},{"claimTemplate":{"className":"l40s","count":1}}]'),
            id="two-classes",
        ),
    ],
)
def test_repeated_admission_adds_the_gate_once_and_tolerations_once(
    webhook: pods.PodWebhook, obj: Obj
) -> None:
    once = admitted(webhook, obj)
    again = webhook(request(once))
    assert again.allowed
    assert again.patch == []
    assert once["spec"]["schedulingGates"].count(GATE) == 1
    keys = toleration_keys(once)
    assert len(keys) == len(set(keys))


def test_a_pod_already_gated_is_not_gated_twice(webhook: pods.PodWebhook) -> None:
    out = admitted(webhook, pod(gates=[GATE]))
    assert out["spec"]["schedulingGates"] == [GATE]


def test_a_pod_without_spec_gets_one_spec_with_both(webhook: pods.PodWebhook) -> None:
    obj = pod()
    del obj["spec"]
    admission = webhook(request(obj))
    assert admission.allowed
    assert admission.patch[0] == {"op": "add", "path": "/spec", "value": {}}
    out = apply_json_patch(obj, admission.patch)
    assert out["spec"]["schedulingGates"] == [GATE]
    assert len(out["spec"]["tolerations"]) == 2


def test_unknown_claims_and_classes_add_no_toleration_but_the_gate(
    webhook: pods.PodWebhook,
) -> None:
    refs = (
        '[{"claim":"ghost"},{"claim":"elsewhere"},{"claimTemplate":{"className":"gone","count":1}}]'
    )
    admission = webhook(request(pod(refs)))
    assert admission.allowed
    assert admission.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


@pytest.mark.parametrize(
    "refs", [pytest.param(None, id="missing"), pytest.param("{oops", id="not-json")]
)
def test_a_launcher_pod_with_a_bad_annotation_is_refused(
    webhook: pods.PodWebhook, refs: str | None
) -> None:
    admission = webhook(request(pod(refs)))
    assert not admission.allowed
    assert admission.code == 403
    assert admission.message.startswith(
        f"Pod {NS}/virt-launcher-vm1-: annotation gpu.cozystack.io/claims: "
    )


# -- migration targets --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "refs",
    [
        pytest.param('[{"claim":"hold-l"}]', id="held-vgpu-claim"),
        pytest.param('[{"claimTemplate":{"className":"l40s","count":1}}]', id="template"),
        pytest.param('[{"claim":"hold-l"},{"claim":"hold-d"}]', id="beside-a-dra-claim"),
        pytest.param('[{"claim":"ghost"}]', id="unknown-claim-fails-closed"),
        pytest.param('[{"claimTemplate":{"className":"gone","count":1}}]', id="unknown-class"),
    ],
)
def test_a_migration_target_is_gated_like_the_launcher_pod(
    webhook: pods.PodWebhook, refs: str
) -> None:
    """The target gets what the launcher pod of the same references gets: the gate once and
    the classes' tolerations, so placement pins it to the transient holds' node."""
    launcher = webhook(request(pod(refs)))
    target = webhook(request(pod(refs, migration=True)))
    assert target.allowed, target.message
    assert target.patch == launcher.patch
    out = apply_json_patch(pod(refs, migration=True), target.patch)
    assert out["spec"]["schedulingGates"] == [GATE]
    assert webhook(request(out)).patch == []  # re-invocation adds nothing


def test_a_migration_target_made_by_anyone_but_kubevirt_is_refused(
    webhook: pods.PodWebhook,
) -> None:
    admission = webhook(request(pod(migration=True), user="system:serviceaccount:t:me"))
    assert not admission.allowed
    assert "system:serviceaccount:t:me may not" in admission.message


def test_a_migration_target_with_a_bad_annotation_is_refused(webhook: pods.PodWebhook) -> None:
    admission = webhook(request(pod("{oops", migration=True)))
    assert not admission.allowed
    assert "annotation gpu.cozystack.io/claims" in admission.message


# -- pods left alone --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(None, labelled=False, migration=True), id="target-of-a-vm-without-claims"),
        pytest.param(pod('[{"claim":"hold-d"}]', migration=True), id="migration-target-dra"),
        pytest.param(
            pod('[{"claimTemplate":{"className":"a10-dra","count":1}}]', migration=True),
            id="migration-target-dra-template",
        ),
        pytest.param(pod(launcher=False), id="not-a-launcher"),
        pytest.param(pod(labelled=False), id="launcher-without-claims-label"),
    ],
)
def test_other_migration_targets_and_other_pods_are_admitted_untouched(
    webhook: pods.PodWebhook, obj: Obj
) -> None:
    assert webhook(request(obj)) == admitting.Admission.allow()


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(webhook: pods.PodWebhook, operation: str) -> None:
    assert webhook(request(pod(), operation)) == admitting.Admission.allow()


# -- who may create launcher pods ---------------------------------------------------------------


@pytest.mark.parametrize("ephemeral", [False, True])
def test_a_launcher_pod_made_by_anyone_but_kubevirt_is_refused(
    webhook: pods.PodWebhook, ephemeral: bool
) -> None:
    """A tenant who dresses her own pod as a launcher pod gets no tolerations and no gate:
    she is refused, with who may create such pods and who asked."""
    admission = webhook(request(pod(ephemeral=ephemeral), user="system:serviceaccount:t:me"))
    assert not admission.allowed
    assert admission.code == 403
    for fragment in (
        "tenant-a/virt-launcher-vm1-",
        "kubevirt.io=virt-launcher",
        "gpu.cozystack.io/claims=true",
        KUBEVIRT,
        "system:serviceaccount:t:me may not",
    ):
        assert fragment in admission.message, admission.message
    assert admission.patch == []


def test_a_launcher_pod_kubevirt_makes_without_a_vmi_owner_is_refused(
    webhook: pods.PodWebhook,
) -> None:
    not_controller = {**VMI_OWNER, "controller": False}
    other_kind = {**VMI_OWNER, "kind": "VirtualMachine"}
    for owners in ([], [not_controller], [other_kind]):
        admission = webhook(request(pod(owners=owners)))
        assert not admission.allowed, owners
        assert "metadata.ownerReferences" in admission.message
        assert "VirtualMachineInstance" in admission.message


def test_the_kubevirt_username_is_the_setting() -> None:
    hook = pods.PodWebhook(
        store_caches(CLASSES, CLAIMS),
        settings.load({"kubevirtServiceAccount": "system:serviceaccount:virt:controller"}, {}, {}),
    )
    assert not hook(request(pod())).allowed
    assert hook(request(pod(), user="system:serviceaccount:virt:controller")).allowed


def test_other_pods_are_admitted_whoever_creates_them(webhook: pods.PodWebhook) -> None:
    """The creator is checked only for the pods the webhook would dress (not a pod without
    both labels): the admission policy judges the rest."""
    for obj in (pod(launcher=False), pod(labelled=False)):
        admission = webhook(request(obj, user="tenant"))
        assert admission.allowed
        assert admission.patch == []
