"""Trace of VM start through the placement gate: where the time goes, step by step.

Starts a local control plane (``--cluster``, 20 nodes x 8 units), the operator with its
webhooks (``--log-level`` passed on, debug by default) and the KubeVirt stand-in in this
process, then creates ``--vms`` VMIs with held claims and as many with raw ``gpus`` entries,
``--threads`` at a time, while one watch per kind stamps each step on this process's
monotonic clock:

    create sent → create answered → launcher pod created (ADDED) → gate removed →
    nodeName set (scheduler) → pod Running (kwok) → VMI Scheduled (stand-in)

It prints the median and p99 of each step's gap for either path, and the placement work
queue's figures scraped from the operator's metrics. Prints figures; asserts nothing.

    PYTHONPATH=hack:test .venv/bin/python hack/bench/vm_trace.py [--vms 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import threading
import time
import urllib.request
from typing import Any

import pykube
from vm_start import gated_vmi, namespace, order_holds, quantile, raw_vmi

from gpuoperator.kinds import VirtualMachineInstance
from harness.kubevirt import KubeVirtSimulator, controller_client
from localcluster.cluster import REPO, LocalCluster

STEPS = ("answered", "pod", "ungated", "bound", "running", "scheduled")


class Stamps:
    """First time (monotonic) each VMI reached each step, keyed by (namespace, VMI name)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[tuple[str, str], dict[str, float]] = {}

    def mark(self, key: tuple[str, str], step: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.at.setdefault(key, {}).setdefault(step, now)


def watch_pods(api: pykube.HTTPClient, stamps: Stamps, stop: threading.Event) -> None:
    client = pykube.HTTPClient(api.config, timeout=3600)
    query = pykube.Pod.objects(client, namespace=pykube.all).filter(
        selector={"kubevirt.io": "virt-launcher"}
    )
    for event in query.watch(params={"timeoutSeconds": 3000}):
        if stop.is_set():
            return
        pod = event.object.obj
        meta = pod["metadata"]
        vmi = (meta.get("labels") or {}).get("vm.kubevirt.io/name")
        if not vmi:
            continue
        key = (meta["namespace"], vmi)
        stamps.mark(key, "pod")
        spec = pod.get("spec") or {}
        if not spec.get("schedulingGates"):
            stamps.mark(key, "ungated")
        if spec.get("nodeName"):
            stamps.mark(key, "bound")
        if (pod.get("status") or {}).get("phase") == "Running":
            stamps.mark(key, "running")


def watch_vmis(api: pykube.HTTPClient, stamps: Stamps, stop: threading.Event) -> None:
    client = pykube.HTTPClient(api.config, timeout=3600)
    query = VirtualMachineInstance.objects(client, namespace=pykube.all)
    for event in query.watch(params={"timeoutSeconds": 3000}):
        if stop.is_set():
            return
        vmi = event.object.obj
        if (vmi.get("status") or {}).get("phase") == "Scheduled":
            stamps.mark((vmi["metadata"]["namespace"], vmi["metadata"]["name"]), "scheduled")


def create_all(
    api: pykube.HTTPClient, bodies: list[dict[str, Any]], stamps: Stamps, threads: int
) -> None:
    lock = threading.Lock()
    todo = iter(bodies)

    def worker() -> None:
        client = pykube.HTTPClient(api.config)
        while True:
            with lock:
                body = next(todo, None)
            if body is None:
                return
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            stamps.mark(key, "sent")
            VirtualMachineInstance(client, body).create()
            stamps.mark(key, "answered")

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def wait_scheduled(stamps: Stamps, keys: list[tuple[str, str]], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stamps.lock:
            if all("scheduled" in stamps.at.get(k, {}) for k in keys):
                return
        time.sleep(0.1)  # polling the outcome of a benchmark run


def report(label: str, stamps: Stamps, keys: list[tuple[str, str]]) -> None:
    print(f"{label}: {len(keys)} VMs (ms: p50 / p99 of the gap from the previous step)")
    previous = "sent"
    for step in STEPS:
        gaps = []
        for k in keys:
            at = stamps.at.get(k, {})
            if step in at and previous in at:
                gaps.append((at[step] - at[previous]) * 1000)
        if gaps:
            print(
                f"  {previous:>9} -> {step:<9} {quantile(gaps, 0.5):8.1f} / "
                f"{quantile(gaps, 0.99):8.1f}   (n={len(gaps)})"
            )
        previous = step
    total = [
        (stamps.at[k]["scheduled"] - stamps.at[k]["sent"]) * 1000
        for k in keys
        if "scheduled" in stamps.at.get(k, {})
    ]
    if total:
        print(f"  total               {quantile(total, 0.5):8.1f} / {quantile(total, 0.99):8.1f}")


#: Seconds the stand-in spent per call, by what it did ("sync" of one VMI key, "create pod",
#: "status" write).
SPENT: dict[str, list[float]] = {"sync": [], "create pod": [], "status": []}


def instrument(simulator: KubeVirtSimulator) -> None:
    """Time the stand-in's syncs, pod creates and status writes."""
    create, sync, write = (
        KubeVirtSimulator._create_pod,
        simulator._sync,
        KubeVirtSimulator._write_status,
    )

    def timed(what: str, call: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                SPENT[what].append(time.monotonic() - start)

        return wrapper

    simulator._create_pod = timed("create pod", create)  # type: ignore[method-assign]
    simulator._sync = timed("sync", sync)  # type: ignore[method-assign]
    simulator._write_status = timed("status", write)  # type: ignore[method-assign]


WANTED = ("queue_duration_seconds_sum", "queue_duration_seconds_count", "adds_total")


def queue_wait(simulator: KubeVirtSimulator) -> None:
    """The stand-in's work queue: how long keys waited in it, and how many were added."""
    for metric in simulator.registry.collect():
        for sample in metric.samples:
            if sample.name.endswith(WANTED):
                print(f"  stand-in queue {sample.name} {sample.value:.3f}")


def spent() -> None:
    for what, values in SPENT.items():
        if values:
            print(
                f"  stand-in {what}: {len(values)} calls, p50 {quantile(values, 0.5) * 1e3:.1f} "
                f"ms, p99 {quantile(values, 0.99) * 1e3:.1f} ms, sum {sum(values):.2f} s"
            )
        values.clear()


def metrics(port: int, prefix: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith(prefix) and "placement" in line and "_bucket" not in line
    ]


def webhooks(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith(
            ("gpuoperator_webhook_duration_seconds_", "gpuoperator_rest_client_requests_total")
        )
        and "_created" not in line
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vms", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cluster", default="bench-lat-trace")
    parser.add_argument("--log-level", default="debug")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    cluster = LocalCluster(args.cluster)
    cluster.up(
        REPO / "hack" / "profiles" / "vms-20.yaml",
        crds=[REPO / "config" / "crd", REPO / "test" / "harness" / "crds"],
        manifests=[REPO / "config" / "samples"],
        log=lambda m: print(m, flush=True),
    )
    cluster.run_operator(
        log=lambda m: print(m, flush=True),
        extra=(f"--log-level={args.log_level}", "--metrics-insecure"),
    )
    argv = cluster.operator.argv()
    port = int(next(a for a in argv if a.startswith("--metrics-address=")).rsplit(":", 1)[1])
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig)), timeout=60)
    stamps = Stamps()
    stop = threading.Event()
    for target in (watch_pods, watch_vmis):
        threading.Thread(target=target, args=(api, stamps, stop), daemon=True).start()
    simulator = KubeVirtSimulator(controller_client(api))
    instrument(simulator)
    simulator.start()
    try:
        namespace(api, "vms-claims")
        order_holds(api, "vms-claims", args.vms)
        namespace(api, "vms-raw")
        gated = [("vms-claims", f"vm-{i}") for i in range(args.vms)]
        raw = [("vms-raw", f"vm-{i}") for i in range(args.vms)]
        create_all(
            api,
            [gated_vmi(ns, name, f"hold-{i}") for i, (ns, name) in enumerate(gated)],
            stamps,
            args.threads,
        )
        wait_scheduled(stamps, gated)
        print("through the gate:")
        spent()
        create_all(api, [raw_vmi(ns, name) for ns, name in raw], stamps, args.threads)
        wait_scheduled(stamps, raw)
        print("raw gpus entries:")
        spent()
        report("through the gate", stamps, gated)
        report("raw gpus entries", stamps, raw)
        print("stand-in work queue (both halves):")
        queue_wait(simulator)
        for line in [
            *metrics(port, "gpuoperator_workqueue"),
            *metrics(port, "gpuoperator_reconcile"),
            *webhooks(port),
        ]:
            print(" ", line)
        print(f"operator log: {cluster.operator.log}")
    finally:
        stop.set()
        simulator.stop()
        if not args.keep:
            cluster.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
