"""Benchmark: time per pod event for the class-status update, at 100 and at 5,000 nodes.

A pod event goes through the same path as in the operator: ``Ledger.apply_pod`` /
``delete_pod`` update the ledger for the pod's node and re-derive that node's contribution
to the classes using its resources; the class-status controller then only copies
``class_figures``. For contrast it also times a from-scratch recomputation of the affected
classes (what a non-incremental controller would do per event). Prints figures; asserts
nothing.

    .venv/bin/python hack/bench/class_status.py [--events 20000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpuoperator.ledger import Ledger
from gpuoperator.model import capacity

Obj = dict[str, Any]
A10, L40S = "nvidia.com/GA102GL_A10", "nvidia.com/L40S-24Q"


def build(nodes: int) -> tuple[Ledger, list[str]]:
    inv = Ledger()
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for name, resource in (("a10", A10), ("a10-spot", A10), ("l40s", L40S), ("l40s-b", L40S)):
        inv.apply_class(
            {
                "metadata": {"name": name},
                "spec": {
                    "mode": "passthrough",
                    "tolerations": tol,
                    "source": {"devicePlugin": {"resourceName": resource}},
                },
            }
        )
    names = []
    for i in range(nodes):
        resource = A10 if i % 5 else L40S
        units = "8" if resource == A10 else "4"
        name = f"node-{i}"
        names.append(name)
        inv.apply_node(
            {
                "metadata": {"name": name},
                "spec": {"taints": taint},
                "status": {
                    "allocatable": {resource: units},
                    "capacity": {resource: units},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return inv, names


def pod(i: int, node: str) -> Obj:
    resource = L40S if int(node.split("-")[1]) % 5 == 0 else A10
    return {
        "metadata": {"name": f"p{i}", "namespace": "bench"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {resource: "1"}}}],
        },
        "status": {"phase": "Running"},
    }


def per_event(nodes: int, events: int) -> tuple[float, float]:
    inv, names = build(nodes)
    pods = [pod(i, names[(i * 7919) % len(names)]) for i in range(events // 2)]
    start = time.perf_counter()
    for p in pods:
        inv.apply_pod(p)
    for p in pods:
        inv.delete_pod(p)
    incremental = (time.perf_counter() - start) / (2 * len(pods))
    # The same events answered by recomputing the affected classes from scratch.
    ledger = capacity.Ledger()
    node_objs = {n: inv._nodes[n] for n in names}
    for n in node_objs.values():
        ledger.set_node(n)
    classes = list(inv._classes.values())
    sample = pods[: max(20, min(len(pods), 2000 // max(1, nodes // 100)))]
    start = time.perf_counter()
    for p in sample:
        ledger.set_pod(p)
        for cls in classes:
            capacity.class_figures(ledger, cls, node_objs.values())
    scratch = (time.perf_counter() - start) / len(sample)
    return incremental, scratch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    results = {n: per_event(n, args.events) for n in (100, 5000)}
    for n, (inc, scratch) in results.items():
        print(
            f"{n:>5} nodes: {inc * 1e6:8.1f} µs per pod event (incremental); "
            f"{scratch * 1e6:10.1f} µs if recomputed from scratch"
        )
    ratio = results[5000][0] / results[100][0]
    print(
        f"ratio 5000/100 nodes: {ratio:.2f}x incremental "
        f"(from scratch: {results[5000][1] / results[100][1]:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
