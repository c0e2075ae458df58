"""The product as deployed (docs/design.md §9): config/overlays/dev, rendered by the pinned
kubectl's kustomize, is what the e2e session applied; the real API server accepted every object, and
the suite's replicas run the rendered Deployment's container under its ServiceAccount."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.operator import Deployed, ForbiddenRequests, OperatorProcess
from harness.waiting import wait_for
from localcluster import deployment
from localcluster.cluster import apply_docs, kubectl, kubectl_binary

#: The kinds a deployment of the product consists of; the rendering must hold each at least once.
EXPECTED_KINDS = {
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}


def live(deployed: Deployed, docs: list[deployment.Obj]) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of each of ``docs`` as the API server returns it."""
    out = kubectl(
        deployed.admin_kubeconfig, "get", "-f", "-", "-o", "json", stdin=yaml.safe_dump_all(docs)
    )
    body = json.loads(out)
    items = body.get("items", [body])
    return {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items}


def identity(docs: list[deployment.Obj]) -> set[tuple[str, str, str]]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs}


def test_the_rendering_holds_every_kind_of_the_product(deployed: Deployed) -> None:
    kinds = {o["kind"] for o in deployed.rendered.objects}
    assert kinds >= EXPECTED_KINDS, f"missing: {sorted(EXPECTED_KINDS - kinds)}"


def test_the_api_server_holds_every_rendered_object_but_the_webhook_configurations(
    deployed: Deployed,
) -> None:
    rest = [*deployed.rendered.crds, *deployed.rendered.rest()]
    assert live(deployed, rest) == identity(rest)


def test_the_api_server_accepts_the_rendered_webhook_configurations(deployed: Deployed) -> None:
    """Applied as a server-side dry run: validated and admitted, but not stored (they fail
    closed, so they are registered only while a replica serves them)."""
    apply_docs(
        deployed.admin_kubeconfig, deployed.rendered.webhook_configurations, "--dry-run=server"
    )


@pytest.mark.operator_process
def test_a_replica_runs_the_deployments_args_as_its_service_account(
    deployed: Deployed, tmp_path: Path
) -> None:
    container = deployed.rendered.container
    op = OperatorProcess(deployed, "args-replica", tmp_path)
    try:
        op.wait_ready()
        assert set(op.ports()) == {"health", "metrics", "webhooks"}
        for arg in container["args"]:
            flag = arg.partition("=")[0]
            if flag in deployment.ADDRESS_FLAGS:
                # Moved to loopback; each server binds a port the kernel picks.
                assert f"{flag}=127.0.0.1:0" in op.argv
            else:
                assert arg in op.argv
    finally:
        op.stop()
    whoami = json.loads(kubectl(deployed.kubeconfig, "auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"]["username"] == deployed.username
    # Not the cluster admin: the token holds only what the shipped RBAC grants.
    for verb, resource in (("*", "*"), ("create", "clusterrolebindings"), ("get", "nodes/proxy")):
        answer = subprocess.run(
            [
                kubectl_binary(),
                f"--kubeconfig={deployed.kubeconfig}",
                "auth",
                "can-i",
                verb,
                resource,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert answer.stdout.strip() == "no", (verb, resource, answer.stdout, answer.stderr)


def test_the_downward_api_fills_pod_namespace_as_the_kubelet_would(deployed: Deployed) -> None:
    env = deployment.container_env(deployed.rendered, "gpu-operator-abc")
    declared = {v["name"]: v for v in deployed.rendered.container.get("env") or []}
    assert declared["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAMESPACE"] == deployed.rendered.deployment["metadata"]["namespace"]


@pytest.fixture
def stray(deployed: Deployed, tmp_path: Path) -> Iterator[OperatorProcess]:
    """A replica pointed at a namespace the shipped RBAC does not cover."""
    op = OperatorProcess(deployed, "stray-replica", tmp_path, "--namespace=default")
    yield op
    op.stop()


@pytest.mark.operator_process
@pytest.mark.skipif(
    bool(os.environ.get("E2E_KUBECONFIG")),
    reason="reads the local control plane's audit log; E2E_KUBECONFIG names another cluster",
)
def test_a_request_the_shipped_rbac_refuses_is_caught_from_the_audit_log(
    deployed: Deployed, stray: OperatorProcess, forbidden_requests: ForbiddenRequests
) -> None:
    """The check every e2e test ends with works: a replica whose namespace the RBAC does not
    cover (its Lease, settings and certificate Secret would be in ``default``) is refused,
    and the API server's audit log shows it."""
    seen: list[str] = []

    def refused_so_far() -> list[str]:
        seen.extend(forbidden_requests.take())
        return seen

    wait_for(
        "a 403 in the audit log",
        refused_so_far,
        until=lambda found: any("/namespaces/default/" in r for r in found),
        timeout=30,
    )
    assert any("leases" in r or "secrets" in r or "configmaps" in r for r in seen), seen
    # Stop it and take what it did meanwhile: this test's 403s are on purpose.
    stray.signal(signal.SIGKILL)
    stray.wait_exit(10)
    forbidden_requests.take()
