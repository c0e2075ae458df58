"""The webhook configurations the API server needs to call gpuoperator's webhooks.

``configurations(base_url, ca_bundle)`` builds them with ``clientConfig.url`` — for local
control planes and tests, where the operator listens on loopback and there is no Service.
The kustomize deployment under ``config/`` declares the same webhooks with a Service
reference and cert-manager's CA injection. Fail closed everywhere.
"""

from __future__ import annotations

import base64
from typing import Any

from admission import orders
from gpuoperator import names

Obj = dict[str, Any]
VALIDATING_NAME = "gpu-operator-validating"


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
                    "namespaceSelector": selector,
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
        }
    ]
