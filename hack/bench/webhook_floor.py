"""P3 against the floor: order creates through the order webhook, through a null webhook,
and through none, in alternating rounds.

The null webhook (``hack/bench/nullwebhook``, Go, standard library only) allows every
AdmissionReview at once, over TLS on loopback with an ECDSA P-256 certificate as ours. It
is registered for GPUClaim creates exactly as ours is: a copy of our webhook's registration
(rules, failurePolicy, timeoutSeconds, matchPolicy, sideEffects, admissionReviewVersions)
with only its name, clientConfig and namespaceSelector changed. The three setups exist at
once, each selecting its own namespace by a label, so the rounds switch between them
without waiting for the API server to see a configuration change:

* ``ours``: a namespace only our webhook selects;
* ``null``: a namespace only the null webhook selects;
* ``none``: a namespace neither selects.

Everything else (the finalizer admission policy, the CRD's CEL, the client) is the same for
all three. The same client creates the same number of orders in each setup per round, and
the order of the setups turns each round so none always runs first.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuoperator import pki
from localcluster.cluster import REPO, LocalCluster, free_ports
from localcluster.processes import ClusterError, Process, wait_until

SETUPS = ("ours", "null", "none")
#: The namespace label the three setups' webhooks select by.
LABEL = "bench.gpuoperator.local/p3"
NULL_NAME = "null.bench.gpuoperator.local"
NULL_CONFIG = "bench-null-webhook"
#: What a copy of our registration keeps: how the API server calls a webhook.
CALL_FIELDS = (
    "admissionReviewVersions",
    "sideEffects",
    "failurePolicy",
    "timeoutSeconds",
    "matchPolicy",
    "rules",
    "objectSelector",
    "matchConditions",
)


def namespace(setup: str) -> str:
    return f"bench-p3-{setup}"


def selector_for(setup: str) -> dict[str, Any]:
    """The namespaceSelector of a setup's webhook: ``ours`` selects every namespace but the
    two others' (so orders elsewhere still meet it), ``null`` only its own."""
    if setup == "ours":
        return {
            "matchExpressions": [{"key": LABEL, "operator": "NotIn", "values": ["null", "none"]}]
        }
    return {"matchExpressions": [{"key": LABEL, "operator": "In", "values": [setup]}]}


def null_configuration(ours: dict[str, Any], url: str, ca_pem: bytes) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration for the null webhook: our webhook's call fields,
    its own name, URL, CA and namespaceSelector."""
    webhook = {k: copy.deepcopy(ours[k]) for k in CALL_FIELDS if k in ours}
    webhook["name"] = NULL_NAME
    webhook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    webhook["namespaceSelector"] = selector_for("null")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NULL_CONFIG},
        "webhooks": [webhook],
    }


def round_order(round_index: int) -> list[str]:
    """The setups in the order a round runs them: turned by one each round."""
    k = round_index % len(SETUPS)
    return [*SETUPS[k:], *SETUPS[:k]]


def quantile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Floor:
    """Create latencies (seconds) per setup, and what the null webhook counted."""

    latencies: dict[str, list[float]]
    null_reviews: int
    rounds: int

    def p(self, setup: str, q: float) -> float:
        return quantile(self.latencies[setup], q)


def build_null_webhook(repo: Path, log: Callable[[str], None]) -> Path:
    """Build (or find cached) the null webhook with ``hack/build-tools.sh``; its progress
    goes to stderr."""
    log("P3: the null webhook (hack/build-tools.sh nullwebhook; a cold build takes ~20 s)")
    out = subprocess.run(
        [str(repo / "hack" / "build-tools.sh"), "nullwebhook"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def write_pair(directory: Path) -> tuple[Path, Path, bytes]:
    """A CA and a serving certificate for 127.0.0.1, as files; returns (cert, key, CA PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.new_ca(now, datetime.timedelta(days=1))
    pair = pki.issue_serving(ca, ["127.0.0.1"], now, datetime.timedelta(days=1))
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "null-webhook.crt", directory / "null-webhook.key"
    cert.write_bytes(pair.cert_pem)
    key.touch(mode=0o600)
    key.write_bytes(pair.key_pem)
    return cert, key, ca.cert_pem


def count_reviews(port: int, ca_pem: bytes) -> int:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/count", timeout=5, context=context) as r:
        return int(r.read().decode().strip())


def selector_patch(setup_selector: dict[str, Any]) -> str:
    """A JSON patch that sets the first webhook's namespaceSelector."""
    return json.dumps(
        [{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": setup_selector}]
    )


def measure(
    create: Callable[[str, str], None],
    rounds: int,
    per_round: int,
    log: Callable[[str], None],
) -> dict[str, list[float]]:
    """``rounds`` rounds of ``per_round`` creates in each setup's namespace, one at a time
    through ``create(namespace, name)``; returns each setup's latencies (seconds)."""
    out: dict[str, list[float]] = {s: [] for s in SETUPS}
    for r in range(rounds):
        for setup in round_order(r):
            ns = namespace(setup)
            for i in range(per_round):
                start = time.perf_counter()
                create(ns, f"r{r:02d}-{i:04d}")
                out[setup].append(time.perf_counter() - start)
        log(
            f"P3 round {r + 1}/{rounds}: p50 "
            + ", ".join(f"{s} {quantile(out[s], 0.5) * 1e3:.2f} ms" for s in SETUPS)
        )
    return out


def run(
    cluster: LocalCluster,
    our_config: str,
    *,
    rounds: int,
    per_round: int,
    create: Callable[[str, str], None],
    refused: Callable[[str], bool],
    ensure_namespace: Callable[[str], None],
    delete_namespace: Callable[[str], None],
    log: Callable[[str], None],
) -> Floor:
    """Start the null webhook, register it beside ours, run the rounds, put everything back.

    ``create(namespace, name)`` creates one order; ``refused(namespace)`` tells whether a
    dry-run order of a class that does not exist is refused there (only our webhook
    refuses it)."""
    binary = build_null_webhook(REPO, log)
    cert, key, ca_pem = write_pair(cluster.dir / "null-webhook")
    (port,) = free_ports(1)
    proc = Process("bench-null-webhook", cluster.dir)
    proc.start([str(binary), f"--address=127.0.0.1:{port}", f"--cert={cert}", f"--key={key}"])
    live = json.loads(
        cluster.kubectl("get", "validatingwebhookconfiguration", our_config, "-o", "json")
    )
    ours = live["webhooks"][0]
    try:
        wait_until("the null webhook to serve", lambda: count_reviews(port, ca_pem) >= 0, 30, proc)
        for setup in SETUPS:
            ensure_namespace(namespace(setup))
            cluster.kubectl(
                "label", "namespace", namespace(setup), f"{LABEL}={setup}", "--overwrite"
            )
        cluster.kubectl(
            "patch",
            "validatingwebhookconfiguration",
            our_config,
            "--type=json",
            "-p",
            selector_patch(selector_for("ours")),
        )
        url = f"https://127.0.0.1:{port}/validate-gpuclaim"
        cluster.kubectl(
            "create", "-f", "-", stdin=json.dumps(null_configuration(ours, url, ca_pem))
        )

        def in_effect() -> bool:
            before = count_reviews(port, ca_pem)
            if refused(namespace("none")) or not refused(namespace("ours")):
                return False
            if count_reviews(port, ca_pem) != before:
                return False  # the null webhook still sees "none" or "ours"
            return not refused(namespace("null")) and count_reviews(port, ca_pem) == before + 1

        took = wait_until("the three setups to be in effect", in_effect, 60, proc)
        log(f"P3: ours, null and none in effect after {took:.1f}s; null webhook on :{port}")
        for setup in SETUPS:
            for i in range(20):  # connections and caches warm before any round is timed
                create(namespace(setup), f"warm-{i:02d}")
        before = count_reviews(port, ca_pem)
        latencies = measure(create, rounds, per_round, log)
        reviews = count_reviews(port, ca_pem) - before
    finally:
        with contextlib.suppress(ClusterError):
            cluster.kubectl(
                "delete", "validatingwebhookconfiguration", NULL_CONFIG, "--ignore-not-found"
            )
        cluster.kubectl(
            "patch",
            "validatingwebhookconfiguration",
            our_config,
            "--type=json",
            "-p",
            selector_patch(ours.get("namespaceSelector", {})),
        )
        proc.stop()
    for setup in SETUPS:
        delete_namespace(namespace(setup))
    return Floor(latencies, reviews, rounds)


def buckets(text: str, name: str, labels: dict[str, str]) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts (``le`` to count) for the series
    whose labels include ``labels``, summed over the others."""
    out: dict[float, float] = {}
    prefix = f"{name}_bucket{{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        body = line[len(prefix) : line.index("}")]
        got = dict(part.split("=", 1) for part in body.split(","))
        got = {k: v.strip('"') for k, v in got.items()}
        if any(got.get(k) != v for k, v in labels.items()):
            continue
        le = float("inf") if got["le"] == "+Inf" else float(got["le"])
        out[le] = out.get(le, 0.0) + float(line.split()[-1])
    return out


def delta_quantiles(
    before: str, after: str, name: str, labels: dict[str, str]
) -> tuple[float, float, float]:
    """What a histogram observed between two scrapes: (count, p50 bound, p99 bound); the
    bounds are bucket upper bounds (NaN when nothing was observed)."""
    b, a = buckets(before, name, labels), buckets(after, name, labels)
    delta = {le: a[le] - b.get(le, 0.0) for le in a}
    total = delta.get(float("inf"), 0.0)
    if not total:
        return 0.0, float("nan"), float("nan")

    def at(q: float) -> float:
        return next(le for le, n in sorted(delta.items()) if n >= q * total)

    return total, at(0.5), at(0.99)
