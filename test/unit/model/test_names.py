"""The shared names are the contract's (docs/design.md §4): a typo here breaks every component."""

from gpuoperator import names


def test_budget_keys() -> None:
    assert names.QUOTA_TOTAL_KEY == "gpuclass.cozystack.io/devices"
    assert names.quota_key("a10") == "a10.gpuclass.cozystack.io/devices"


def test_object_names_derived_from_a_class_or_claim() -> None:
    assert names.license_secret_name("l40s-24q") == "gpu-license-l40s-24q"
    assert names.workload_name("hold-a") == "gpuclaim-hold-a"


def test_labels_annotations_gates_and_finalizers() -> None:
    assert names.CLAIMS_LABEL == names.CLAIMS_ANNOTATION == "gpu.cozystack.io/claims"
    assert names.TEMPLATE_CLAIM_LABEL == "gpu.cozystack.io/template-claim"
    assert names.PLACEMENT_GATE == "gpu.cozystack.io/placement"
    assert names.CLAIM_PROTECTION_FINALIZER == "gpu.cozystack.io/claim-protection"
    assert names.CLASS_PROTECTION_FINALIZER == "gpu.cozystack.io/class-protection"
    assert names.VGPU_ENTITLED_LABEL == "gpu.cozystack.io/vgpu-entitled"
    assert names.LICENSE_OF_LABEL == "gpu.cozystack.io/license-of"
    assert names.SETTINGS_CONFIGMAP == "gpu-operator-settings"
    assert names.LEADER_LEASE == "gpu-operator"
    assert names.API_VERSION == "cozystack.io/v1alpha1"
