"""A tenant as the product's users are: the built-in ``edit`` role in her namespace and
nothing else, acting through the real API server's authorization.

The client impersonates a user of its own (the admin's kubeconfig with ``Impersonate-User``;
the API server adds ``system:authenticated``), bound to the ``edit`` ClusterRole in one
namespace by a RoleBinding. What she may do is exactly what RBAC (with the roles aggregated
to ``edit``, such as the operator's GPUClaim editor) and admission allow her.
"""

from __future__ import annotations

from pathlib import Path

import pykube

from harness import kube
from harness.waiting import wait_for


def tenant_user(namespace: str) -> str:
    return f"tenant:{namespace}"


def as_tenant(admin_kubeconfig: Path, api: pykube.HTTPClient, namespace: str) -> pykube.HTTPClient:
    """A client acting as the tenant of ``namespace`` (holding ``edit`` there only)."""
    user = tenant_user(namespace)
    pykube.RoleBinding(
        api,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ).create()
    client = kube.client(admin_kubeconfig)
    client.session.headers["Impersonate-User"] = user

    def may_list_secrets() -> bool:
        try:
            pykube.Secret.objects(client, namespace=namespace).get_or_none(name="probe")
        except pykube.exceptions.HTTPError:
            return False
        return True

    # The binding takes effect once the API server's RBAC cache has it.
    wait_for(f"{user} to hold edit in {namespace}", may_list_secrets, timeout=30)
    return client
