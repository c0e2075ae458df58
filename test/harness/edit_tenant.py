"""A tenant as a multi-tenant cloud makes one: a ServiceAccount holding only the built-in
``edit`` ClusterRole in her namespace (which the product's tenant roles aggregate into) plus
the rights KubeVirt's own ``kubevirt.io:edit`` role gives on VirtualMachineInstances, and a
client that authenticates with a token of it. Whatever the tests do through that client, the
API server authorises as it would for a real tenant."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pykube
import yaml

from harness.kube import Obj
from localcluster.cluster import kubectl_binary

#: What KubeVirt's ``kubevirt.io:edit`` ClusterRole grants on VMIs (not installed here:
#: the test cluster has KubeVirt's CRDs, not KubeVirt).
VMI_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
USER = "tenant"


def _rbac(api: pykube.HTTPClient, obj: Obj) -> None:
    kind = pykube.object_factory(api, "rbac.authorization.k8s.io/v1", obj["kind"])
    kind(api, obj).create()


def tenant_client(api: pykube.HTTPClient, admin_kubeconfig: Path, ns: str) -> pykube.HTTPClient:
    """A client of the tenant of ``ns`` (``edit`` there, and KubeVirt's VMI rights)."""
    pykube.ServiceAccount(api, {"metadata": {"name": USER, "namespace": ns}}).create()
    subject = [{"kind": "ServiceAccount", "name": USER, "namespace": ns}]
    _rbac(
        api,
        {
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": subject,
        },
    )
    _rbac(
        api,
        {
            "kind": "Role",
            "metadata": {"name": "tenant-vmis", "namespace": ns},
            "rules": [
                {
                    "apiGroups": ["kubevirt.io"],
                    "resources": ["virtualmachineinstances"],
                    "verbs": VMI_VERBS,
                }
            ],
        },
    )
    _rbac(
        api,
        {
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-vmis", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "tenant-vmis",
            },
            "subjects": subject,
        },
    )
    token = subprocess.run(
        [
            kubectl_binary(),
            f"--kubeconfig={admin_kubeconfig}",
            "create",
            "token",
            USER,
            f"--namespace={ns}",
            "--duration=3600s",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": USER, "user": {"token": token}}],
        "contexts": [
            {"name": USER, "context": {"cluster": cluster["name"], "user": USER, "namespace": ns}}
        ],
        "current-context": USER,
    }
    return pykube.HTTPClient(pykube.KubeConfig(config), timeout=30)
