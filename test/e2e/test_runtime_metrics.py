"""The metrics endpoint authorises each scrape as kube-rbac-proxy does: TokenReview, then
SubjectAccessReview on the non-resource path. A scraper holding the shipped metrics-reader
role sees the leader's claim figures."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.kubeconfig import load_config
from harness.fleet import Fleet
from harness.operator import Deployed, OperatorProcess
from harness.waiting import wait_for

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


def test_a_scrape_with_a_token_the_api_server_rejects_is_401_and_echoes_nothing(
    operator: OperatorProcess,
) -> None:
    code, body = scrape(operator.metrics_port, "not-a-real-token")
    assert code == 401, body
    # The caller has not proven who they are: the reviewer's own words stay in the log.
    assert body == "unauthorized: a valid bearer token is required\n"


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


def claim_status(api: pykube.HTTPClient, ns: str, name: str) -> dict[str, object]:
    found = GPUClaim.objects(api, namespace=ns).get(name=name).obj.get("status") or {}
    return dict(found)


def bound_reason(status: dict[str, object]) -> str:
    conditions = status.get("conditions") or []
    assert isinstance(conditions, list)
    return str(next((c["reason"] for c in conditions if c.get("type") == "Bound"), ""))


def samples(body: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of ``metric`` in an exposition, by their sorted labels."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == metric
    }


def test_a_scrape_shows_a_pending_claim_with_its_reason(
    api: pykube.HTTPClient,
    deployed: Deployed,
    kubeconfig: Path,
    namespace: str,
    fleet: Fleet,
    operator: OperatorProcess,
) -> None:
    """The scraper is bound to the rendered metrics-reader ClusterRole; the replica leads
    (it is the only one), so it exports the claims of the class: one bound, one that cannot
    fit on the class's only node and waits with reason NoCapacity."""
    reader = deployed.rendered.one("ClusterRole", "gpu-operator-metrics-reader")
    token = token_for(api, kubeconfig, namespace, "prometheus")
    binding = pykube.ClusterRoleBinding(
        api,
        {
            "metadata": {"name": f"{namespace}-metrics-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": reader["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        },
    )
    binding.create()
    try:
        cls = fleet.gpu_class()
        fleet.node(2)
        for name, count in (("fits", 1), ("too-big", 4)):
            GPUClaim(
                api,
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.GPU_CLAIM,
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"className": cls, "count": count},
                },
            ).create()
        wait_for(
            "one claim Bound, the other Pending with reason NoCapacity",
            lambda: (
                claim_status(api, namespace, "fits"),
                claim_status(api, namespace, "too-big"),
            ),
            until=lambda s: (
                (s[0].get("phase"), bound_reason(s[0])) == ("Bound", "Bound")
                and (s[1].get("phase"), bound_reason(s[1])) == ("Pending", "NoCapacity")
            ),
            timeout=30,
        )

        def claim_samples() -> dict[tuple[tuple[str, str], ...], float]:
            code, body = scrape(operator.metrics_port, token)
            assert code == 200, body
            return samples(body, "gpuoperator_claims")

        pending = (("gpuclass", cls), ("phase", "Pending"), ("reason", "NoCapacity"))
        bound = (("gpuclass", cls), ("phase", "Bound"), ("reason", "Bound"))
        seen = wait_for(
            f"the scrape to count the claims of class {cls}",
            claim_samples,
            until=lambda found: found.get(pending) == 1 and found.get(bound) == 1,
            timeout=30,
        )
        assert {k: v for k, v in seen.items() if ("gpuclass", cls) in k} == {
            pending: 1,
            bound: 1,
        }
        code, body = scrape(operator.metrics_port, token)
        assert code == 200, body
        oldest = samples(body, "gpuoperator_claim_oldest_pending_seconds")
        assert oldest[(("gpuclass", cls),)] >= 0
    finally:
        binding.delete()
