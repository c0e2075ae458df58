"""A tenant as the product meets one: a ServiceAccount holding only the built-in ``edit``
ClusterRole in its namespace (through a RoleBinding), and a client that authenticates with a
short-lived token of it. What ``edit`` allows on GPUClaims comes from the shipped aggregated
roles (``config/rbac/tenant_roles.yaml``), so a test acting through this client exercises
what a real tenant may do, no more. ``vmis=True`` adds the rights KubeVirt's own
``kubevirt.io:edit`` role gives on VirtualMachineInstances (not installed here: the test
cluster has KubeVirt's CRDs, not KubeVirt)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pykube
import yaml


@dataclass(frozen=True)
class EditTenant:
    namespace: str
    user: str  # system:serviceaccount:<namespace>:<name>
    api: pykube.HTTPClient


def _token(admin: pykube.HTTPClient, namespace: str, name: str) -> str:
    r = admin.post(
        url=f"serviceaccounts/{name}/token",
        namespace=namespace,
        data=json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            }
        ),
    )
    admin.raise_for_status(r)
    return str(r.json()["status"]["token"])


def _client(kubeconfig: Path, token: str) -> pykube.HTTPClient:
    """A client for the admin kubeconfig's cluster that authenticates with ``token``."""
    admin = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    entry = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    cluster = dict(entry["cluster"])
    if "certificate-authority" in cluster:  # a relative path is relative to the kubeconfig
        cluster["certificate-authority"] = str(
            (kubeconfig.parent / cluster["certificate-authority"]).resolve()
        )
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    return pykube.HTTPClient(pykube.KubeConfig(doc), timeout=30)


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
    return EditTenant(namespace, user, _client(kubeconfig, _token(admin, namespace, name)))


def tenant_client(api: pykube.HTTPClient, admin_kubeconfig: Path, ns: str) -> pykube.HTTPClient:
    """A client of the tenant of ``ns`` (``edit`` there, and KubeVirt's VMI rights)."""
    return edit_tenant(api, admin_kubeconfig, ns, vmis=True).api
