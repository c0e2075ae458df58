"""Benchmark: VM start to Running through the placement gate, beside raw ``gpus`` entries.

Starts a local control plane named ``bench-vms`` (20 nodes x 8 units), the operator with
its webhooks registered, and the KubeVirt stand-in of the test harness. Then, in one run:

1. ``--vms`` VMIs each referencing a held one-unit claim (bound beforehand): the VMI webhook
   writes the gpus entries, the pod webhook gates the launcher pod, the placement controller
   pins and ungates it, the scheduler binds it, kwok runs it;
2. the same number of VMIs with raw ``gpus`` entries and the class tolerations, in the
   hoster namespace the admission policies exempt (``RAW_NS``: elsewhere a class's GPUs
   are given only through claim references), which the webhooks do not see (no
   references, no gate).

It reports VMI create to ``Scheduled`` (the stand-in's mirror of a Running launcher pod),
p50/p99 for each. Prints figures; asserts nothing.

    PYTHONPATH=hack:test .venv/bin/python hack/bench/vm_start.py [--vms 100]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import pykube

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from harness.claims import vmi_metadata
from harness.kubevirt import KubeVirtSimulator, controller_client
from harness.waiting import wait_for
from localcluster.cluster import REPO, LocalCluster

#: The dev overlay's hoster namespace, exempt from the policies that enforce holds.
RAW_NS = "gpu-hoster"

A10 = "nvidia.com/GA102GL_A10"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def namespace(api: pykube.HTTPClient, name: str) -> None:
    if pykube.Namespace.objects(api).get_or_none(name=name) is None:
        pykube.Namespace(api, {"metadata": {"name": name}}).create()
    deadline = time.monotonic() + 60
    while pykube.ServiceAccount.objects(api, namespace=name).get_or_none(name="default") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name}")
        time.sleep(0.1)


def run(api: pykube.HTTPClient, ns: str, bodies: list[dict[str, Any]]) -> list[float]:
    """Create the VMIs from 8 threads; return each one's create-to-Scheduled seconds."""
    created: dict[str, float] = {}
    lock = threading.Lock()
    todo = iter(bodies)
    failures: list[BaseException] = []

    def create() -> None:
        client = pykube.HTTPClient(api.config)
        while not failures:
            with lock:
                body = next(todo, None)
            if body is None:
                return
            start = time.monotonic()
            try:
                VirtualMachineInstance(client, body).create()
            except BaseException as exc:  # surfaced below, instead of a wait for nothing
                failures.append(exc)
                return
            with lock:
                created[body["metadata"]["name"]] = start

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    scheduled: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while len(scheduled) < len(bodies) and time.monotonic() < deadline:
        for v in VirtualMachineInstance.objects(api, namespace=ns):
            if (v.obj.get("status") or {}).get("phase") == "Scheduled":
                scheduled.setdefault(v.name, time.monotonic())
        time.sleep(0.05)  # polling the outcome of a benchmark run
    return [scheduled[n] - created[n] for n in scheduled if n in created]


def order_holds(api: pykube.HTTPClient, ns: str, vms: int) -> None:
    """Order ``hold-<i>`` (one a10 unit each) for ``vms`` VMs in ``ns`` and wait until every
    one is Bound (before the measured part)."""
    for i in range(vms):
        GPUClaim(
            api,
            {
                "apiVersion": names.API_VERSION,
                "kind": names.GPU_CLAIM,
                "metadata": {"name": f"hold-{i}", "namespace": ns},
                "spec": {"className": "a10", "count": 1},
            },
        ).create()
    wait_for(
        f"{vms} holds Bound",
        lambda: sum(
            (c.obj.get("status") or {}).get("phase") == "Bound"
            for c in GPUClaim.objects(api, namespace=ns)
        ),
        until=lambda bound: bound >= vms,
        timeout=300,
        interval=0.2,
    )


def gated_vmi(ns: str, name: str, hold: str) -> dict[str, Any]:
    """A VMI on the held claim ``hold``: through the placement gate."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": vmi_metadata(ns, name, [{"claim": hold}]),
        "spec": {"domain": {"devices": {}}},
    }


def raw_vmi(ns: str, name: str) -> dict[str, Any]:
    """A VMI with a raw ``gpus`` entry: the path without the operator."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "tolerations": [TOLERATION],
            "domain": {"devices": {"gpus": [{"name": "gpu0", "deviceName": A10}]}},
        },
    }


def measure(api: pykube.HTTPClient, vms: int) -> tuple[list[float], list[float]]:
    """VM create to Running, through the gate with held claims and with raw ``gpus``
    entries, on a cluster with the operator leading and the KubeVirt stand-in running;
    returns the seconds of each VM (claims, raw). Leaves the namespaces it used."""
    namespace(api, "vms-claims")
    order_holds(api, "vms-claims", vms)
    with_claims = run(
        api, "vms-claims", [gated_vmi("vms-claims", f"vm-{i}", f"hold-{i}") for i in range(vms)]
    )
    for v in VirtualMachineInstance.objects(api, namespace="vms-claims"):
        v.delete()
    for c in GPUClaim.objects(api, namespace="vms-claims"):
        c.delete()
    namespace(api, RAW_NS)
    raw = run(api, RAW_NS, [raw_vmi(RAW_NS, f"vm-{i}") for i in range(vms)])
    return with_claims, raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vms", type=int, default=100)
    args = parser.parse_args()
    cluster = LocalCluster("bench-vms")
    cluster.up(
        REPO / "hack" / "profiles" / "vms-20.yaml",
        crds=[REPO / "config" / "crd", REPO / "test" / "harness" / "crds"],
        manifests=[REPO / "config" / "samples"],
        log=lambda m: print(m, flush=True),
    )
    cluster.run_operator(log=lambda m: print(m, flush=True))
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig)), timeout=60)
    simulator = KubeVirtSimulator(controller_client(api))
    simulator.start()
    try:
        with_claims, raw = measure(api, args.vms)
        for label, values in (
            ("through the gate (held claims)", with_claims),
            ("raw gpus entries, no webhooks", raw),
        ):
            print(
                f"{label}: {len(values)} VMs, create to Running p50 "
                f"{quantile(values, 0.5) * 1000:.0f} ms, p99 {quantile(values, 0.99) * 1000:.0f} ms"
            )
    finally:
        simulator.stop()
        cluster.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
