"""Benchmark: cache sync time and memory of one operator replica on a large cluster.

Starts a local control plane named ``bench`` with 1,000 simulated GPU nodes
(``hack/profiles/scale-1000.yaml``), creates ``--pods`` pods bound to them (kwok turns them
Running), then starts ``gpuoperator run`` and reports how long its caches take to sync and
its resident memory after sync. Prints the figures; asserts nothing.

    PYTHONPATH=hack .venv/bin/python hack/bench/runtime_scale.py [--pods 10000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pykube

from localcluster.cluster import REPO, LocalCluster, free_ports
from localcluster.processes import Process, wait_until

NAMESPACE = "bench"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def create_pods(kubeconfig: Path, nodes: list[str], total: int, threads: int = 8) -> float:
    start = time.monotonic()
    counter = iter(range(total))
    lock = threading.Lock()

    def worker() -> None:
        api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(kubeconfig)), timeout=60)
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            node = nodes[i % len(nodes)]
            gpu = "nvidia.com/GA102GL_A10" if node.startswith("a10") else "nvidia.com/L40S-24Q"
            resources = (
                {"requests": {"cpu": "100m", gpu: "1"}, "limits": {gpu: "1"}}
                if i % 10 == 0
                else {"requests": {"cpu": "100m"}}
            )
            pod = {
                "metadata": {
                    "name": f"p-{i}",
                    "namespace": NAMESPACE,
                    "labels": {"app": f"bench-{i % 50}"},
                    "annotations": {"bench.example/note": "x" * 64},
                },
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": False,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "bench",
                            "resources": resources,
                            "env": [{"name": "A", "value": "1"}],
                        }
                    ],
                },
            }
            pykube.Pod(api, pod).create()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster running")
    args = parser.parse_args()

    cluster = LocalCluster("bench")
    took = cluster.up(
        REPO / "hack" / "profiles" / "scale-1000.yaml",
        crds=[REPO / "config" / "crd"],
        log=lambda m: print(m, flush=True),
    )
    print(f"control plane with 1000 nodes up in {took:.1f}s", flush=True)
    try:
        api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig)))
        if not pykube.Namespace.objects(api).get_or_none(name=NAMESPACE):
            pykube.Namespace(api, {"metadata": {"name": NAMESPACE}}).create()
        existing = len(pykube.Pod.objects(api, namespace=NAMESPACE))
        nodes = [n.name for n in pykube.Node.objects(api)]
        if existing < args.pods:
            print(f"creating {args.pods - existing} pods...", flush=True)
            secs = create_pods(cluster.kubeconfig, nodes, args.pods - existing)
            print(f"created in {secs:.1f}s", flush=True)
        total_pods = len(pykube.Pod.objects(api).filter(namespace=pykube.all))
        print(f"cluster: {len(nodes)} nodes, {total_pods} pods", flush=True)

        health, webhooks = free_ports(2)
        proc = Process("bench-operator", cluster.dir)
        t0 = time.monotonic()
        pid = proc.start(
            [
                sys.executable,
                "-m",
                "gpuoperator.cli",
                "run",
                f"--kubeconfig={cluster.kubeconfig}",
                "--namespace=default",
                f"--health-address=127.0.0.1:{health}",
                "--metrics-address=",
                f"--webhook-address=127.0.0.1:{webhooks}",
                "--log-format=json",
            ],
            cwd=REPO,
        )

        def ready() -> bool:
            url = f"http://127.0.0.1:{health}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)

        wait_until("the operator's caches to sync", ready, 600, proc, interval=0.05)
        sync = time.monotonic() - t0
        synced_rss = rss_mib(pid)
        reported = None
        for line in proc.log.read_text().splitlines():
            if '"caches synced"' in line:
                reported = json.loads(line).get("seconds")
        settle_until = time.monotonic() + 10
        peak = synced_rss
        while time.monotonic() < settle_until:
            peak = max(peak, rss_mib(pid))
            time.sleep(0.5)  # sampling memory over a fixed window
        print(
            f"operator: caches synced {sync:.2f}s after start "
            f"(the manager reports {reported}s from its first list)"
        )
        print(
            f"operator: RSS {synced_rss:.0f} MiB at sync, peak {peak:.0f} MiB over 10 s "
            f"({len(nodes)} nodes, {total_pods} pods)"
        )
        proc.stop()
    finally:
        if not args.keep:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
