"""Every variant under config/ renders, installs what docs/design.md §9 lists under the fixed names,
and keeps the namespaces consistent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from unit.config.manifests import (
    CONFIG,
    DEPLOYMENT,
    METRICS_SERVICE,
    NAMESPACE,
    PDB,
    SERVICE_ACCOUNT,
    VARIANTS,
    find,
    kustomize,
    render,
)

from gpuoperator import names

#: Every test here renders the manifests with the pinned kubectl.
pytestmark = pytest.mark.needs_tools

CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}

#: The policies that enforce holds at admission (config/policy), each with its binding; all
#: read the policy parameters ConfigMap.
HOLD_POLICIES = (
    "gpu-operator-gpu-pods",
    "gpu-operator-launcher-pods",
    "gpu-operator-vmi-gpus",
    "gpu-operator-claim-finalizer",
    "gpu-operator-dra-holds",
    "gpu-operator-dra-claims",
    "gpu-operator-dra-claim-templates",
)

#: What `kubectl apply -k config/default` installs: (kind, namespace, name).
DEFAULT_OBJECTS = {
    ("Namespace", "", NAMESPACE),
    ("CustomResourceDefinition", "", f"{names.GPU_CLAIMS}.{names.GROUP}"),
    ("CustomResourceDefinition", "", f"{names.GPU_CLASSES}.{names.GROUP}"),
    ("CustomResourceDefinition", "", f"{names.GPU_NODES}.{names.GROUP}"),
    ("CustomResourceDefinition", "", f"{names.WORKLOADS}.{names.GROUP}"),
    ("ServiceAccount", NAMESPACE, SERVICE_ACCOUNT),
    ("ClusterRole", "", "gpu-operator"),
    ("ClusterRoleBinding", "", "gpu-operator"),
    ("Role", NAMESPACE, "gpu-operator"),
    ("RoleBinding", NAMESPACE, "gpu-operator"),
    ("Role", NAMESPACE, "gpu-operator-leader-election"),
    ("RoleBinding", NAMESPACE, "gpu-operator-leader-election"),
    ("Role", NAMESPACE, "gpu-operator-certificates"),
    ("RoleBinding", NAMESPACE, "gpu-operator-certificates"),
    ("ClusterRole", "", "gpu-operator-webhook-ca"),
    ("ClusterRoleBinding", "", "gpu-operator-webhook-ca"),
    ("ClusterRole", "", "gpu-operator-metrics-auth"),
    ("ClusterRoleBinding", "", "gpu-operator-metrics-auth"),
    ("ClusterRole", "", "gpu-operator-metrics-reader"),
    ("ClusterRole", "", "gpu-operator-gpuclaim-editor"),
    ("ClusterRole", "", "gpu-operator-gpuclaim-viewer"),
    ("ClusterRole", "", "gpu-operator-gpuclass-editor"),
    ("ClusterRole", "", "gpu-operator-gpuclass-viewer"),
    ("ConfigMap", NAMESPACE, names.SETTINGS_CONFIGMAP),
    ("ConfigMap", NAMESPACE, names.POLICY_PARAMS_CONFIGMAP),
    ("Secret", NAMESPACE, names.WEBHOOK_CERT_SECRET),
    ("Service", NAMESPACE, names.WEBHOOK_SERVICE),
    ("Service", NAMESPACE, METRICS_SERVICE),
    ("Deployment", NAMESPACE, DEPLOYMENT),
    ("PodDisruptionBudget", NAMESPACE, PDB),
    ("ValidatingAdmissionPolicy", "", "gpu-operator-template-claim-mark"),
    ("ValidatingAdmissionPolicyBinding", "", "gpu-operator-template-claim-mark"),
    ("ValidatingAdmissionPolicy", "", "gpu-operator-secret-writes"),
    ("ValidatingAdmissionPolicyBinding", "", "gpu-operator-secret-writes"),
    *(
        (kind, "", policy)
        for policy in HOLD_POLICIES
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    ),
    ("MutatingAdmissionPolicy", "", "gpu-operator-claim-protection"),
    ("MutatingAdmissionPolicyBinding", "", "gpu-operator-claim-protection"),
    ("ValidatingWebhookConfiguration", "", names.VALIDATING_WEBHOOK_CONFIGURATION),
    ("MutatingWebhookConfiguration", "", names.MUTATING_WEBHOOK_CONFIGURATION),
}


def _ids(variant: str) -> set[tuple[str, str, str]]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in render(variant)
    }


def test_default_installs_exactly_the_product() -> None:
    assert _ids("default") == DEFAULT_OBJECTS


def test_dev_and_kind_install_the_same_objects_as_default() -> None:
    assert _ids("overlays/dev") == DEFAULT_OBJECTS
    assert _ids("overlays/kind") == DEFAULT_OBJECTS


def test_production_swaps_self_managed_certificates_for_cert_manager_and_adds_monitoring() -> None:
    self_managed = {
        ("Secret", NAMESPACE, names.WEBHOOK_CERT_SECRET),
        ("Role", NAMESPACE, "gpu-operator-certificates"),
        ("RoleBinding", NAMESPACE, "gpu-operator-certificates"),
        ("ClusterRole", "", "gpu-operator-webhook-ca"),
        ("ClusterRoleBinding", "", "gpu-operator-webhook-ca"),
    }
    added = {
        ("Issuer", NAMESPACE, "gpu-operator-selfsigned"),
        ("Certificate", NAMESPACE, "gpu-operator-webhook"),
        ("ServiceMonitor", NAMESPACE, "gpu-operator"),
        ("PrometheusRule", NAMESPACE, "gpu-operator"),
        ("NetworkPolicy", NAMESPACE, "gpu-operator"),
        ("ConfigMap", NAMESPACE, "gpu-operator-dashboard"),
    }
    assert _ids("overlays/production") == (DEFAULT_OBJECTS - self_managed) | added


@pytest.mark.parametrize("variant", VARIANTS)
def test_namespaced_objects_live_in_the_operator_namespace_and_cluster_scoped_in_none(
    variant: str,
) -> None:
    for obj in render(variant):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert ns is None, f"{obj['kind']} {obj['metadata']['name']} is cluster-scoped"
        else:
            assert ns == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']} in {ns}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_binding_names_the_operator_service_account_in_its_namespace(variant: str) -> None:
    for b in render(variant):
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert b["subjects"] == [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
            ]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_tamper_policy_reads_the_settings_that_name_the_operator(variant: str) -> None:
    objs = render(variant)
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "gpu-operator-template-claim-mark")
    assert binding["spec"]["paramRef"]["name"] == names.SETTINGS_CONFIGMAP
    assert binding["spec"]["paramRef"]["namespace"] == NAMESPACE
    settings = find(objs, "ConfigMap", names.SETTINGS_CONFIGMAP)
    assert (
        settings["data"]["operatorServiceAccount"]
        == f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    )


def test_crds_are_shipped_as_they_are() -> None:
    for crd in (o for o in render("default") if o["kind"] == "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_changing_the_namespace_of_default_carries_it_everywhere(tmp_path: Path) -> None:
    """config/default says: change `namespace` there and everything follows."""
    copy = tmp_path / "config"
    shutil.copytree(CONFIG, copy)
    default = copy / "default" / "kustomization.yaml"
    text = default.read_text()
    assert f"\nnamespace: {NAMESPACE}\n" in text
    default.write_text(text.replace(f"\nnamespace: {NAMESPACE}\n", "\nnamespace: gpus\n"))
    objs = kustomize(copy / "default")
    rendered = yaml.safe_dump_all(objs)
    assert NAMESPACE not in rendered
    user = f"system:serviceaccount:gpus:{SERVICE_ACCOUNT}"
    assert (
        find(objs, "ConfigMap", names.SETTINGS_CONFIGMAP)["data"]["operatorServiceAccount"] == user
    )
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "gpu-operator-template-claim-mark")
    assert binding["spec"]["paramRef"]["namespace"] == "gpus"
    policy = find(objs, "ValidatingAdmissionPolicy", "gpu-operator-secret-writes")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["operatorUser"] == f"'{user}'"
    params = find(objs, "ConfigMap", names.POLICY_PARAMS_CONFIGMAP)
    assert params["metadata"]["namespace"] == "gpus"
    assert params["data"]["operatorServiceAccount"] == user
    for policy_name in HOLD_POLICIES:
        binding = find(objs, "ValidatingAdmissionPolicyBinding", policy_name)
        assert binding["spec"]["paramRef"] == {
            "name": names.POLICY_PARAMS_CONFIGMAP,
            "namespace": "gpus",
            "parameterNotFoundAction": "Deny",
        }, policy_name


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_hold_policies_read_the_policy_params_beside_the_operator(variant: str) -> None:
    """Every policy that enforces holds takes the policy parameters ConfigMap of the
    operator's namespace, fails closed, and is bound with Deny; the shipped parameter names
    the operator's ServiceAccount and KubeVirt's controller, and no resource yet."""
    objs = render(variant)
    for policy_name in HOLD_POLICIES:
        policy = find(objs, "ValidatingAdmissionPolicy", policy_name)
        assert policy["spec"]["failurePolicy"] == "Fail", policy_name
        assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
        assert policy["spec"]["matchConditions"], f"{policy_name} must narrow what it sees"
        binding = find(objs, "ValidatingAdmissionPolicyBinding", policy_name)
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert binding["spec"]["paramRef"] == {
            "name": names.POLICY_PARAMS_CONFIGMAP,
            "namespace": NAMESPACE,
            "parameterNotFoundAction": "Deny",
        }, policy_name
        for validation in policy["spec"]["validations"]:
            assert validation["reason"] == "Forbidden"
            assert validation["messageExpression"]
    data = find(objs, "ConfigMap", names.POLICY_PARAMS_CONFIGMAP)["data"]
    assert data["operatorServiceAccount"] == f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    assert data["kubevirtServiceAccount"] == "system:serviceaccount:kubevirt:kubevirt-controller"
    assert data["resourceNames"] == ""


def test_the_secret_writes_policy_compares_the_operator_username() -> None:
    objs = render("default")
    policy = find(objs, "ValidatingAdmissionPolicy", "gpu-operator-secret-writes")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    user = find(objs, "ConfigMap", names.SETTINGS_CONFIGMAP)["data"]["operatorServiceAccount"]
    assert variables["operatorUser"] == f"'{user}'"
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "gpu-operator-secret-writes")
    assert binding["spec"] == {
        "policyName": "gpu-operator-secret-writes",
        "validationActions": ["Deny"],
    }


def test_the_hoster_guide_overlay_for_clusters_before_1_36_drops_only_the_mutating_policy(
    tmp_path: Path,
) -> None:
    """The guide's patch for clusters without MutatingAdmissionPolicy v1 renders config/default
    without the policy and its binding, and nothing else changes."""
    guide = (CONFIG.parent / "docs" / "hoster-guide.md").read_text()
    block = guide.split("drop the policy and its binding in your overlay", 1)[1]
    patches = block.split("```yaml\n", 1)[1].split("```", 1)[0]
    shutil.copytree(CONFIG, tmp_path / "config")
    overlay = tmp_path / "config" / "overlays" / "older"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text("resources:\n- ../../default\n" + patches)
    dropped = {("MutatingAdmissionPolicy", "", "gpu-operator-claim-protection")} | {
        ("MutatingAdmissionPolicyBinding", "", "gpu-operator-claim-protection")
    }
    rendered = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in kustomize(overlay)
    }
    assert rendered == DEFAULT_OBJECTS - dropped


#: The placeholder the production overlay's NetworkPolicy admits to the webhook port.
PLACEHOLDER_CIDR = "192.0.2.0/24"


def _webhook_and_metrics_rules(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    return {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}


def test_production_admits_the_webhook_port_only_from_the_placeholder_control_plane() -> None:
    policy = find(render("overlays/production"), "NetworkPolicy", "gpu-operator")
    assert _webhook_and_metrics_rules(policy) == {
        9443: [{"ipBlock": {"cidr": PLACEHOLDER_CIDR}}],
        8443: [{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}],
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # config/default ships none, and says why.
    assert not [o for o in render("default") if o["kind"] == "NetworkPolicy"]
    assert "No NetworkPolicy here" in (CONFIG / "default" / "kustomization.yaml").read_text()


def test_the_hoster_guide_patch_sets_the_control_plane_addresses_and_nothing_else(
    tmp_path: Path,
) -> None:
    guide = (CONFIG.parent / "docs" / "hoster-guide.md").read_text()
    block = guide.split("### Webhook callers", 1)[1]
    overlay_text = block.split("```yaml\n", 1)[1].split("```", 1)[0]
    shutil.copytree(CONFIG, tmp_path / "config")
    overlay = tmp_path / "config" / "overlays" / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(overlay_text)
    mine = kustomize(overlay)
    policy = find(mine, "NetworkPolicy", "gpu-operator")
    assert _webhook_and_metrics_rules(policy)[9443] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    production = render("overlays/production")
    others = [o for o in production if o["kind"] != "NetworkPolicy"]
    assert [o for o in mine if o["kind"] != "NetworkPolicy"] == others
