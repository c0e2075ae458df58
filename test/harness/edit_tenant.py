"""A tenant as the product meets one: a ServiceAccount holding only the built-in ``edit``
ClusterRole in its namespace (through a RoleBinding), and a client that authenticates with a
short-lived token of it. What ``edit`` allows on GPUClaims comes from the shipped aggregated
roles (``config/rbac/tenant_roles.yaml``), so a test acting through this client exercises
what a real tenant may do, no more. ``vmis=True`` adds the rights KubeVirt's own
``kubevirt.io:edit`` role gives on VirtualMachineInstances (not installed here: the test
cluster has KubeVirt's CRDs, not KubeVirt)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pykube

from harness import accounts


@dataclass(frozen=True)
class EditTenant:
    namespace: str
    user: str  # system:serviceaccount:<namespace>:<name>
    api: pykube.HTTPClient


#: What KubeVirt's ``kubevirt.io:edit`` ClusterRole grants on VMIs.
VMI_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


def _vmi_rights(admin: pykube.HTTPClient, namespace: str, name: str) -> None:
    rules = [
        {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": VMI_VERBS}
    ]
    role = f"{name}-vmis"
    pykube.Role(
        admin, {"metadata": {"name": role, "namespace": namespace}, "rules": rules}
    ).create()
    pykube.RoleBinding(
        admin,
        {
            "metadata": {"name": role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ).create()


def edit_tenant(
    admin: pykube.HTTPClient,
    kubeconfig: Path,
    namespace: str,
    name: str = "tenant",
    *,
    vmis: bool = False,
) -> EditTenant:
    """Make ServiceAccount ``name`` in ``namespace`` with the ``edit`` ClusterRole there
    (and KubeVirt's VMI rights with ``vmis``), and return a client acting as it."""
    pykube.ServiceAccount(admin, {"metadata": {"name": name, "namespace": namespace}}).create()
    pykube.RoleBinding(
        admin,
        {
            "metadata": {"name": f"{name}-edit", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ).create()
    if vmis:
        _vmi_rights(admin, namespace, name)
    user = f"system:serviceaccount:{namespace}:{name}"
    return EditTenant(namespace, user, accounts.client(admin, namespace, name))


def tenant_client(api: pykube.HTTPClient, admin_kubeconfig: Path, ns: str) -> pykube.HTTPClient:
    """A client of the tenant of ``ns`` (``edit`` there, and KubeVirt's VMI rights)."""
    return edit_tenant(api, admin_kubeconfig, ns, vmis=True).api
