"""What each replica knew when a chaos test's wait ran out: whether it was ready (and what
its ``/readyz`` said), what each of its informers knew (phase, resourceVersion, seconds
stale, seconds since the server last spoke: the ``gpuoperator_informer_*`` metrics, scraped
as a Prometheus holding the metrics role would), and its last log lines of interest.

Scraping needs a token the replicas' authorizer accepts: :func:`scraper_token` creates a
ServiceAccount with a ClusterRole allowing ``GET /metrics`` (once per cluster) and asks for
a token of it.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections import defaultdict

import pykube
from prometheus_client.parser import text_string_to_metric_families

from chaos.replicas import Replicas

SCRAPER = "chaos-scraper"
#: The informer metrics reported, by the short name the report gives them.
INFORMER_METRICS = {
    "gpuoperator_informer_stale_seconds": "stale_s",
    "gpuoperator_informer_last_heard_seconds": "heard_s_ago",
    "gpuoperator_informer_watch_open": "watching",
    "gpuoperator_informer_resource_version": "rv",
    "gpuoperator_informer_objects": "objects",
}


def scraper_token(api: pykube.HTTPClient, namespace: str) -> str:
    """A token of a ServiceAccount allowed to scrape ``/metrics`` (created on first use)."""
    objects: list[pykube.objects.APIObject] = [
        pykube.ServiceAccount(api, {"metadata": {"name": SCRAPER, "namespace": namespace}}),
        pykube.ClusterRole(
            api,
            {
                "metadata": {"name": SCRAPER},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
            },
        ),
        pykube.ClusterRoleBinding(
            api,
            {
                "metadata": {"name": SCRAPER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": SCRAPER,
                },
                "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": namespace}],
            },
        ),
    ]
    for obj in objects:
        if not obj.exists():
            obj.create()
    response = api.post(
        url=f"namespaces/{namespace}/serviceaccounts/{SCRAPER}/token",
        version="v1",
        data=json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600},
            }
        ),
    )
    response.raise_for_status()
    return str(response.json()["status"]["token"])


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a replica's metrics certificate is self-signed
    request = urllib.request.Request(url)  # noqa: S310 - a loopback http(s) URL built here
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:  # noqa: S310
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def informers(body: str) -> dict[str, dict[str, float]]:
    """The informer figures of one scrape, by informer."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(body):
        short = INFORMER_METRICS.get(family.name)
        if short is None:
            continue
        for sample in family.samples:
            out[sample.labels["informer"]][short] = sample.value
    return dict(out)


def report(
    api: pykube.HTTPClient, replicas: Replicas, log_needles: tuple[str, ...] = (), lines: int = 8
) -> str:
    """One block per live replica: readiness, informer figures, matching log lines."""
    try:
        token: str | None = scraper_token(api, replicas.namespace)
        token_problem = ""
    except Exception as exc:  # the report must not hide the failure it explains
        token, token_problem = None, f"{type(exc).__name__}: {exc}"
    blocks = []
    for identity, op in replicas.live.items():
        ports = op.ports(timeout=1)
        ready_code, ready_body = _get(f"http://127.0.0.1:{ports['health']}/readyz")
        out = [f"--- {identity}: /readyz {ready_code} {ready_body.strip()[:300]}"]
        if replicas.webhooks is not None:
            routed = identity in replicas.webhooks.ready_backends()
            out.append(f"    the failover proxy routes to it: {routed}")
        if token is None:
            out.append(f"    no scrape: {token_problem}")
        else:
            code, body = _get(f"https://127.0.0.1:{ports['metrics']}/metrics", token)
            if code != 200:
                out.append(f"    scrape: {code} {body[:200]}")
            else:
                for name, figures in sorted(informers(body).items()):
                    shown = " ".join(f"{k}={v:g}" for k, v in sorted(figures.items()))
                    out.append(f"    informer {name}: {shown}")
        text = op.log_text().splitlines()
        for needle in log_needles:
            found = [line for line in text if needle in line][-lines:]
            out.append(f"    last {len(found)} log lines with {needle!r}:")
            out += [f"      {line[:400]}" for line in found]
        blocks.append("\n".join(out))
    return "\n".join(blocks)
