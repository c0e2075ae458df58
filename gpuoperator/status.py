"""``gpuoperator status``: a readable report of the catalog and the nodes, from a kubeconfig.

It lists nodes, pods, classes, claims and the KubeVirt CR once, feeds them to the same
Inventory the operator runs on, and prints what the operator would publish, plus why each
node is not eligible for a class. Read-only.
"""

from __future__ import annotations

import pykube

from gpuoperator.inventory import Inventory
from gpuoperator.kinds import GPUClaim, GPUClass, KubeVirt
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import slimming
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Obj


def collect(client: Client) -> tuple[Inventory, dict[str, Obj]]:
    """The inventory of the cluster now, and its classes by name."""
    inventory = Inventory()
    nodes, _ = client.list(pykube.Node)
    pods, _ = client.list(pykube.Pod)
    classes, _ = client.list(GPUClass)
    claims, _ = client.list(GPUClaim)
    try:
        kubevirts, _ = client.list(KubeVirt)
    except errors.NotFoundError:
        kubevirts = []
    inventory.load(
        nodes=[slimming.slim_node(n) for n in nodes],
        pods=[slimming.slim_pod(p) for p in pods],
        classes=classes,
        claims=claims,
        kubevirt=kubevirts[0] if kubevirts else None,
    )
    return inventory, {c["metadata"]["name"]: c for c in classes}


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def report(inventory: Inventory, classes: dict[str, Obj]) -> str:
    out = ["CLASSES"]
    rows = [["NAME", "MODE", "RESOURCE", "FREE", "MAX FREE/NODE", "ELIGIBLE NODES"]]
    for name in inventory.class_names():
        cls = classes[name]
        f = inventory.class_figures(name)
        rows.append(
            [
                name,
                gpuclasses.mode(cls),
                gpuclasses.resource_name(cls),
                str(f.free),
                str(f.max_free_per_node),
                str(f.nodes),
            ]
        )
    out.append(_table(rows) if len(rows) > 1 else "(no GPUClass)")
    out.append("")
    out.append("NODES")
    rows = [["NODE", "RESOURCE", "ALLOCATABLE", "ALLOCATED", "FREE", "NOT ELIGIBLE FOR"]]
    for node_name in inventory.node_names():
        view = inventory.node(node_name)
        if view is None:
            continue
        for device in view.devices:
            resource = device["resourceName"]
            why = []
            for class_name in inventory.class_names():
                if gpuclasses.resource_name(classes[class_name]) != resource:
                    continue
                reasons = inventory.eligibility(node_name, class_name)
                if reasons:
                    why.append(f"{class_name} ({'; '.join(reasons)})")
            if view.overcommitted.get(resource):
                why.append(
                    "OVERCOMMITTED by "
                    + ", ".join("/".join(k) for k in view.overcommitted[resource])
                )
            rows.append(
                [
                    node_name,
                    resource,
                    str(device["allocatable"]),
                    str(device["allocated"]),
                    str(device["free"]),
                    "; ".join(why) or "-",
                ]
            )
    out.append(_table(rows) if len(rows) > 1 else "(no node with GPU resources)")
    return "\n".join(out)
