"""Acting as a ServiceAccount: a short-lived token of it (TokenRequest) and a client of the
same cluster that authenticates with that token, so the API server authorises every request
as it would the account's (RBAC, admission policies, audit)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pykube


def token(api: pykube.HTTPClient, namespace: str, account: str, seconds: int = 3600) -> str:
    """A token of ServiceAccount ``namespace/account``, valid for ``seconds``."""
    response = api.post(
        url=f"serviceaccounts/{account}/token",
        namespace=namespace,
        data=json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            }
        ),
    )
    api.raise_for_status(response)
    return str(response.json()["status"]["token"])


def token_client(api: pykube.HTTPClient, bearer: str) -> pykube.HTTPClient:
    """A client of ``api``'s cluster (its server and CA) that authenticates with ``bearer``."""
    cluster: dict[str, Any] = {"server": api.config.cluster["server"]}
    ca = api.config.cluster.get("certificate-authority")
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca.bytes()).decode()
    if api.config.cluster.get("insecure-skip-tls-verify"):
        cluster["insecure-skip-tls-verify"] = True
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": bearer}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    return pykube.HTTPClient(pykube.KubeConfig(doc), timeout=api.timeout)


def client(
    api: pykube.HTTPClient, namespace: str, account: str, seconds: int = 3600
) -> pykube.HTTPClient:
    """A client acting as ServiceAccount ``namespace/account``."""
    return token_client(api, token(api, namespace, account, seconds))
