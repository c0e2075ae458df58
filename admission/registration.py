"""The webhook configurations the API server needs to call gpuoperator's webhooks.

``configurations(base_url, ca_bundle)`` builds them with ``clientConfig.url`` — for local
control planes and tests, where the operator listens on loopback and there is no Service.
The kustomize deployment under ``config/`` declares the same webhooks with a Service
reference and cert-manager's CA injection. Fail closed everywhere.

Two configurations:

* ``gpu-operator-validating``: the order webhook (GPUClaim CREATE);
* ``gpu-operator-mutating``: the VMI webhook (VirtualMachineInstance CREATE, only VMIs with
  the claims label; ``sideEffects: NoneOnDryRun`` because it records claim attachments except
  on dry run; never re-invoked, its patch is final) and the pod webhook (Pod CREATE, only
  virt-launcher pods with the claims label, which includes KubeVirt's temporary
  WaitForFirstConsumer pod and migration targets; no side effects; re-invoked if a later
  webhook changes the pod, which it survives because its patches are idempotent).

Every webhook honours ``namespace_selector`` (the e2e suite confines it to its namespaces).
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from admission import orders, pods, vmis
from gpuoperator import names
from gpuoperator.model import references
from gpuoperator.runtime.kinds import VirtualMachineInstance

Obj = dict[str, Any]
VALIDATING_NAME = "gpu-operator-validating"
_VMI_GROUP, _VMI_VERSION = str(VirtualMachineInstance.version).split("/")
MUTATING_NAME = "gpu-operator-mutating"


def configurations(
    base_url: str, ca_pem: bytes, *, namespace_selector: Obj | None = None
) -> list[Obj]:
    ca = base64.b64encode(ca_pem).decode()
    selector = namespace_selector or {}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_NAME},
            "webhooks": [
                {
                    "name": f"orders.{names.DOMAIN}",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "namespaceSelector": copy.deepcopy(selector),
                    "clientConfig": {"url": f"{base_url}{orders.PATH}", "caBundle": ca},
                    "rules": [
                        {
                            "apiGroups": [names.GROUP],
                            "apiVersions": [names.VERSION],
                            "operations": ["CREATE"],
                            "resources": [names.GPU_CLAIMS],
                            "scope": "Namespaced",
                        }
                    ],
                }
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_NAME},
            "webhooks": [
                {
                    "name": f"vmis.{names.DOMAIN}",
                    "admissionReviewVersions": ["v1"],
                    # The attachment write is skipped on dry run.
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "timeoutSeconds": 10,
                    "namespaceSelector": copy.deepcopy(selector),
                    "objectSelector": {"matchLabels": {names.CLAIMS_LABEL: names.TRUE}},
                    "clientConfig": {"url": f"{base_url}{vmis.PATH}", "caBundle": ca},
                    "rules": [
                        {
                            "apiGroups": [_VMI_GROUP],
                            "apiVersions": [_VMI_VERSION],
                            "operations": ["CREATE"],
                            "resources": [VirtualMachineInstance.endpoint],
                            "scope": "Namespaced",
                        }
                    ],
                },
                {
                    "name": f"launcher-pods.{names.DOMAIN}",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "IfNeeded",
                    "timeoutSeconds": 10,
                    "namespaceSelector": copy.deepcopy(selector),
                    "objectSelector": {
                        "matchExpressions": [
                            {
                                "key": references.KUBEVIRT_LABEL,
                                "operator": "In",
                                "values": [references.VIRT_LAUNCHER],
                            },
                            {"key": names.CLAIMS_LABEL, "operator": "In", "values": [names.TRUE]},
                        ]
                    },
                    "clientConfig": {"url": f"{base_url}{pods.PATH}", "caBundle": ca},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                },
            ],
        },
    ]
