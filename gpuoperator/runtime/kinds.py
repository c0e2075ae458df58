"""The Kubernetes kinds pykube-ng has no class for that the runtime itself uses (leases,
reviews, admission configuration), declared once. The product's own kinds (and KubeVirt's)
are in :mod:`gpuoperator.kinds`: the runtime knows no product names."""

from __future__ import annotations

from pykube.objects import APIObject, NamespacedAPIObject


class Lease(NamespacedAPIObject):  # type: ignore[misc]
    version = "coordination.k8s.io/v1"
    endpoint = "leases"
    kind = "Lease"


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
