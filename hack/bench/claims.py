"""Benchmark: ordering and binding 1,000 claims on 200 nodes x 8 units.

Starts a local control plane named ``bench-claims`` (``hack/profiles/claims-200.yaml``),
runs the operator with its webhooks registered (as ``make up`` does), applies the sample
classes, then creates ``--claims`` one-unit claims of class ``a10`` from ``--threads``
threads and reports:

* claims bound per second (first create to last Bound) and create-to-Bound latency p50/p99,
  taken from a watch on the claims;
* order latency p50/p99 as the tenant sees it (the API call, the webhook included) and the
  webhook's own decision time p50/p99 (from the operator's histogram).

Prints figures; asserts nothing.

    PYTHONPATH=hack .venv/bin/python hack/bench/claims.py [--claims 1000] [--threads 16]
"""

from __future__ import annotations

import argparse
import threading
import time
import urllib.request
from typing import Any

import pykube

from gpuoperator.kinds import GPUClaim
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.kubeconfig import load_config
from localcluster.cluster import REPO, LocalCluster

NAMESPACE = "bench-tenant"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram_quantiles(text: str, name: str) -> tuple[float, float]:
    """p50/p99 upper bounds from a Prometheus histogram's cumulative buckets."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and 'allowed="true"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return float("nan"), float("nan")

    def at(q: float) -> float:
        return next(le for le, count in sorted(buckets.items()) if count >= q * total)

    return at(0.5), at(0.99)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    cluster = LocalCluster("bench-claims")
    cluster.up(
        REPO / "hack" / "profiles" / "claims-200.yaml",
        crds=[REPO / "config" / "crd"],
        manifests=[REPO / "config" / "samples"],
        log=lambda m: print(m, flush=True),
    )
    cluster.run_operator(log=lambda m: print(m, flush=True), extra=("--metrics-insecure",))
    try:
        kubeconfig = cluster.kubeconfig
        api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(kubeconfig)))
        pykube.Namespace(api, {"metadata": {"name": NAMESPACE}}).create()
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        done = threading.Event()
        client = Client(lambda: load_config(str(kubeconfig)), qps=10_000, burst=10_000)

        def watch() -> None:
            _, rv = client.list(GPUClaim, NAMESPACE)
            while not done.is_set():
                for _t, obj in client.watch(
                    GPUClaim, NAMESPACE, resource_version=rv, timeout_seconds=60, stop=done
                ):
                    rv = obj["metadata"]["resourceVersion"]
                    if (obj.get("status") or {}).get("phase") == "Bound":
                        bound.setdefault(obj["metadata"]["name"], time.monotonic())
                    if len(bound) >= args.claims:
                        done.set()
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        order_latency: list[float] = []
        lock = threading.Lock()
        names = iter(range(args.claims))

        def order() -> None:
            c = Client(lambda: load_config(str(kubeconfig)), qps=10_000, burst=10_000)
            while True:
                with lock:
                    i = next(names, None)
                if i is None:
                    return
                name = f"order-{i:04d}"
                body: dict[str, Any] = {
                    "apiVersion": "cozystack.io/v1alpha1",
                    "kind": "GPUClaim",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"className": "a10", "count": 1},
                }
                start = time.monotonic()
                c.create(GPUClaim, body)
                end = time.monotonic()
                with lock:
                    created[name] = start
                    order_latency.append(end - start)

        t0 = time.monotonic()
        workers = [threading.Thread(target=order) for _ in range(args.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        t_created = time.monotonic() - t0
        if not done.wait(600):
            print(f"only {len(bound)} of {args.claims} bound within 600 s")
        t_bound = max(bound.values()) - t0 if bound else float("nan")
        latency = [bound[n] - created[n] for n in bound if n in created]
        print(
            f"{args.claims} orders created in {t_created:.1f}s from {args.threads} threads; "
            f"all bound {t_bound:.1f}s after the first"
        )
        print(
            f"binding: {len(bound) / t_bound:.0f} claims bound per second; create-to-Bound "
            f"p50 {quantile(latency, 0.5) * 1000:.0f} ms, "
            f"p99 {quantile(latency, 0.99) * 1000:.0f} ms"
        )
        print(
            f"order (API call incl. webhook): p50 {quantile(order_latency, 0.5) * 1000:.1f} ms, "
            f"p99 {quantile(order_latency, 0.99) * 1000:.1f} ms"
        )
        metrics_port = _metrics_port(cluster.operator.argv())
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        p50, p99 = histogram_quantiles(text, "gpuoperator_webhook_duration_seconds")
        print(
            f"order webhook decision (server side, histogram bucket bounds): p50 <= "
            f"{p50 * 1000:.1f} ms, p99 <= {p99 * 1000:.1f} ms"
        )
    finally:
        if not args.keep:
            cluster.down()
    return 0


def _metrics_port(argv: list[str]) -> int:
    flag = next(a for a in argv if a.startswith("--metrics-address="))
    return int(flag.rsplit(":", 1)[1])


if __name__ == "__main__":
    raise SystemExit(main())
