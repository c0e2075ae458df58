"""The kinds pykube-ng has no class for, declared once for the whole operator."""

from __future__ import annotations

from pykube.objects import APIObject, NamespacedAPIObject

from gpuoperator import names


class GPUClass(APIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_CLASSES
    kind = names.GPU_CLASS


class GPUClaim(NamespacedAPIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_CLAIMS
    kind = names.GPU_CLAIM


class GPUNode(APIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_NODES
    kind = names.GPU_NODE


class Workload(NamespacedAPIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.WORKLOADS
    kind = names.WORKLOAD


class Lease(NamespacedAPIObject):  # type: ignore[misc]
    version = "coordination.k8s.io/v1"
    endpoint = "leases"
    kind = "Lease"


class VirtualMachineInstance(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.VMIS
    kind = names.VMI_KIND


class KubeVirt(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.KUBEVIRTS
    kind = names.KUBEVIRT_KIND


class ValidatingAdmissionPolicy(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "validatingadmissionpolicies"
    kind = "ValidatingAdmissionPolicy"


class TokenReview(APIObject):  # type: ignore[misc]
    version = "authentication.k8s.io/v1"
    endpoint = "tokenreviews"
    kind = "TokenReview"


class SubjectAccessReview(APIObject):  # type: ignore[misc]
    version = "authorization.k8s.io/v1"
    endpoint = "subjectaccessreviews"
    kind = "SubjectAccessReview"


class ValidatingWebhookConfiguration(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "validatingwebhookconfigurations"
    kind = "ValidatingWebhookConfiguration"


class MutatingWebhookConfiguration(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "mutatingwebhookconfigurations"
    kind = "MutatingWebhookConfiguration"
