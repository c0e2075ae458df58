"""Every name gpuoperator shares with the cluster, in one place (docs/design.md §4).

Controllers, webhooks, manifests' tests and the CLI import these constants; nothing else
spells them.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "cozystack.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

#: The domain of the operator's labels, annotations, gates and finalizers.
DOMAIN: Final = "gpu.cozystack.io"

# Kinds and their plural resource names.
GPU_CLASS: Final = "GPUClass"
GPU_CLASSES: Final = "gpuclasses"
GPU_CLAIM: Final = "GPUClaim"
GPU_CLAIMS: Final = "gpuclaims"
GPU_NODE: Final = "GPUNode"
GPU_NODES: Final = "gpunodes"
WORKLOAD: Final = "Workload"
WORKLOADS: Final = "workloads"

#: VMI and launcher-pod label: this object carries claim references.
CLAIMS_LABEL: Final = f"{DOMAIN}/claims"
#: VMI annotation holding the references as a JSON list
#: (``[{"claim": "hold-a"}, {"claimTemplate": {"className": "a10", "count": 2}}]``).
CLAIMS_ANNOTATION: Final = f"{DOMAIN}/claims"
#: Label marking a GPUClaim the operator made from a VM's claim template.
TEMPLATE_CLAIM_LABEL: Final = f"{DOMAIN}/template-claim"
#: Scheduling gate held on launcher pods until their claims' node is pinned.
PLACEMENT_GATE: Final = f"{DOMAIN}/placement"
CLAIM_PROTECTION_FINALIZER: Final = f"{DOMAIN}/claim-protection"
CLASS_PROTECTION_FINALIZER: Final = f"{DOMAIN}/class-protection"
#: Namespace label that allows ordering vGPU classes.
VGPU_ENTITLED_LABEL: Final = f"{DOMAIN}/vgpu-entitled"
#: Label on license copies, naming the class they serve.
LICENSE_OF_LABEL: Final = f"{DOMAIN}/license-of"
LICENSE_SECRET_PREFIX: Final = "gpu-license-"  # noqa: S105 - a name, not a secret
#: Label a license source Secret must carry (``"true"``) for the copier to copy it.
LICENSE_SOURCE_LABEL: Final = f"{DOMAIN}/license-source"
#: The license namespace when the setting ``licenseNamespace`` is not given.
DEFAULT_LICENSE_NAMESPACE: Final = "gpu-licenses"

TRUE: Final = "true"

#: Budget keys in ResourceQuota spec.hard.
QUOTA_DOMAIN: Final = f"gpuclass.{GROUP}"
QUOTA_TOTAL_KEY: Final = f"{QUOTA_DOMAIN}/devices"

SETTINGS_CONFIGMAP: Final = "gpu-operator-settings"
#: The admission policies' parameter (operator namespace): the classes' resource names and
#: the settings the policies read, kept current by the operator.
POLICY_PARAMS_CONFIGMAP: Final = "gpu-operator-policy-params"
LEADER_LEASE: Final = "gpu-operator"

# The deployment's objects the operator itself reads or writes (config/ ships them).
#: The webhooks' Service; the serving certificate names it (``<svc>.<ns>.svc`` and kin).
WEBHOOK_SERVICE: Final = "gpu-operator-webhook"
#: The Secret holding the webhooks' CA and serving certificate (tls.crt, tls.key, ca.crt).
WEBHOOK_CERT_SECRET: Final = "gpu-operator-webhook-cert"  # noqa: S105 - a name, not a secret
#: Where the cert-manager component mounts that Secret (``--certificates=mounted``).
WEBHOOK_CERT_DIR: Final = "/etc/gpu-operator/webhook-certs"
VALIDATING_WEBHOOK_CONFIGURATION: Final = "gpu-operator-validating"
MUTATING_WEBHOOK_CONFIGURATION: Final = "gpu-operator-mutating"

#: Usage records are named after their claim.
WORKLOAD_PREFIX: Final = "gpuclaim-"


def quota_key(class_name: str) -> str:
    """The per-class budget key: ``<class>.gpuclass.cozystack.io/devices``."""
    return f"{class_name}.{QUOTA_TOTAL_KEY}"


def license_secret_name(class_name: str) -> str:
    """The name of a class's license copy in a tenant namespace."""
    return f"{LICENSE_SECRET_PREFIX}{class_name}"


def workload_name(claim_name: str) -> str:
    """The name of a bound claim's usage record."""
    return f"{WORKLOAD_PREFIX}{claim_name}"


# ---- KubeVirt's names (its API, read by the operator; spelt here and nowhere else) ----------

KUBEVIRT_GROUP: Final = "kubevirt.io"
KUBEVIRT_API_VERSION: Final = f"{KUBEVIRT_GROUP}/v1"
VMI_KIND: Final = "VirtualMachineInstance"
VMIS: Final = "virtualmachineinstances"
VM_KIND: Final = "VirtualMachine"
VMS: Final = "virtualmachines"
#: KubeVirt's own configuration object (its CR lists the permitted host devices).
KUBEVIRT_KIND: Final = "KubeVirt"
KUBEVIRTS: Final = "kubevirts"
#: Label and value KubeVirt sets on the pods it renders for a VMI.
KUBEVIRT_LABEL: Final = "kubevirt.io"
VIRT_LAUNCHER: Final = "virt-launcher"
#: Label on migration target pods: the UID of their VirtualMachineInstanceMigration.
MIGRATION_LABEL: Final = "kubevirt.io/migrationJobUID"
#: KubeVirt's live migration object (``spec.vmiName``; ``status.phase``).
VMIM_KIND: Final = "VirtualMachineInstanceMigration"
VMIMS: Final = "virtualmachineinstancemigrations"
#: A VMI's (or, where it sets none, the KubeVirt CR's ``spec.configuration``) eviction
#: strategy that live-migrates the VM off a drained node.
EVICTION_STRATEGY_LIVE_MIGRATE: Final = "LiveMigrate"
#: Phases after which a migration is over.
VMIM_SUCCEEDED: Final = "Succeeded"
VMIM_FAILED: Final = "Failed"
#: The label (Kubernetes' recommended one) and value naming the operator as the creator of
#: the migrations the drain starts, and the annotation naming the node they drain.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
OPERATOR_NAME: Final = "gpu-operator"
DRAINED_NODE_ANNOTATION: Final = f"{DOMAIN}/drained-node"
#: Labels KubeVirt sets on a launcher pod naming its VM and (by UID) its VMI.
VM_NAME_LABEL: Final = "vm.kubevirt.io/name"
CREATED_BY_LABEL: Final = "kubevirt.io/created-by"
#: Annotation on KubeVirt's temporary pod for WaitForFirstConsumer volumes.
EPHEMERAL_ANNOTATION: Final = "kubevirt.io/ephemeral-provisioning"
#: VMI phases in which its launcher pod runs on the node (Scheduled, then Running).
VMI_SCHEDULED: Final = "Scheduled"
VMI_RUNNING: Final = "Running"
#: VMI phases after which the VMI never runs again.
VMI_SUCCEEDED: Final = "Succeeded"
VMI_FAILED: Final = "Failed"
#: The finalizer the API server sets on an object deleted with foreground propagation: the
#: garbage collector deletes its blocking dependents first (Kubernetes' name).
FOREGROUND_DELETION_FINALIZER: Final = "foregroundDeletion"

# Dynamic Resource Allocation (resource.k8s.io, GA in Kubernetes 1.34): what DRA classes
# read (docs/design.md §5 "DRA classes").
DRA_API_VERSION: Final = "resource.k8s.io/v1"
RESOURCE_SLICE_KIND: Final = "ResourceSlice"
RESOURCE_SLICES: Final = "resourceslices"
DEVICE_CLASS_KIND: Final = "DeviceClass"
DEVICE_CLASSES: Final = "deviceclasses"
#: DeviceTaintRules: beta in Kubernetes 1.36, behind the gate DRADeviceTaintRules and the
#: API version resource.k8s.io/v1beta2, both off by default.
DEVICE_TAINT_RULE_API_VERSION: Final = "resource.k8s.io/v1beta2"
DEVICE_TAINT_RULE_KIND: Final = "DeviceTaintRule"
DEVICE_TAINT_RULES: Final = "devicetaintrules"
RESOURCE_CLAIM_KIND: Final = "ResourceClaim"
RESOURCE_CLAIMS: Final = "resourceclaims"
#: Label (``"true"``) on the ResourceClaims the binder creates to hold a DRA claim's devices
#: (each is also controlled by its GPUClaim; the label alone proves nothing).
DRA_HOLD_LABEL: Final = f"{DOMAIN}/hold"
