"""The metrics endpoint authorises each scrape as kube-rbac-proxy does: TokenReview, then
SubjectAccessReview on the non-resource path."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator.runtime.client import Client, load_config
from harness.operator import Deployed, OperatorProcess

pytestmark = pytest.mark.operator_process  # it starts its own replicas


@pytest.fixture
def operator(deployed: Deployed, tmp_path: Path) -> Iterator[OperatorProcess]:
    p = OperatorProcess(deployed, "metrics-replica", tmp_path)
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()


def token_for(api: pykube.HTTPClient, kubeconfig: Path, namespace: str, sa: str) -> str:
    pykube.ServiceAccount(api, {"metadata": {"name": sa, "namespace": namespace}}).create()
    client = Client(lambda: load_config(str(kubeconfig)))
    review = client.create_subresource(
        pykube.ServiceAccount,
        sa,
        namespace,
        "token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    return str(review["status"]["token"])


def scrape(port: int, token: str | None) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the test replica serves a self-signed certificate
    req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_scrape_without_a_token_is_401(operator: OperatorProcess) -> None:
    code, body = scrape(operator.metrics_port, None)
    assert code == 401, body


def test_a_scrape_with_a_token_the_api_server_rejects_is_401(operator: OperatorProcess) -> None:
    code, body = scrape(operator.metrics_port, "not-a-real-token")
    assert code == 401, body


def test_a_scrape_by_a_service_account_without_rbac_is_403(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, operator: OperatorProcess
) -> None:
    token = token_for(api, kubeconfig, namespace, "nobody")
    code, body = scrape(operator.metrics_port, token)
    assert code == 403, body
    assert f"system:serviceaccount:{namespace}:nobody" in body


def test_a_scrape_allowed_by_rbac_gets_the_metrics(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, operator: OperatorProcess
) -> None:
    token = token_for(api, kubeconfig, namespace, "scraper")
    role = pykube.ClusterRole(
        api,
        {
            "metadata": {"name": f"{namespace}-metrics"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        },
    )
    binding = pykube.ClusterRoleBinding(
        api,
        {
            "metadata": {"name": f"{namespace}-metrics"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{namespace}-metrics",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
        },
    )
    role.create()
    binding.create()
    try:
        code, body = scrape(operator.metrics_port, token)
        assert code == 200, body
        assert "gpuoperator_informer_synced" in body
        assert "gpuoperator_rest_client_requests_total" in body
    finally:
        binding.delete()
        role.delete()
