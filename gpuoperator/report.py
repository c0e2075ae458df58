"""``gpuoperator status``: a readable report of the catalog and the nodes, from a kubeconfig.

It lists nodes, pods, classes, claims and the KubeVirt CR once, feeds them to the same
Ledger the operator runs on, and prints what the operator would publish, plus why each
node is not eligible for a class. Read-only.

``gpuoperator status --node N`` tells what holds node N (before a drain): each claim bound
there with what a drain does with it (``model.draining``): an idle hold and the nodes with
room for it now, or that it fits nowhere else; a claim serving a running vGPU VM that
live-migrates (evictionStrategy ``LiveMigrate``), which the drain migrates; a claim serving
any other VM, which blocks the drain, with the tenant and the VM; and which tenants to ask.
The live migrations in flight on the node, as source or target, are listed with their VM,
claims, source → target and since when (docs/design.md §5 "Live migration"). The
node's devices of each DRA class are counted (as its GPUNode's ``draDevices``), and the DRA
holds there whose devices are tainted or gone are listed with what device health does
with them (``model.dra_health``): an idle one moves, one serving a VM stays.

Where preemptible classes exist, ``gpuoperator status`` also tells, for each guaranteed class
whose oldest waiting order fits nowhere as things are, what it would take back and where
(``model.preemption``, running VMs allowed, as the preemption controller decides).

``gpuoperator status`` lists, beside the device-plugin resources, each node's devices of
each DRA class (``GPUNode.status.draDevices``), from the ResourceSlices, DeviceClasses and
ResourceClaims it reads too.
"""

from __future__ import annotations

import pykube

from gpuoperator.kinds import (
    DeviceClass,
    DeviceTaintRule,
    GPUClaim,
    GPUClass,
    KubeVirt,
    ResourceClaim,
    ResourceSlice,
    VirtualMachineInstance,
    VirtualMachineInstanceMigration,
)
from gpuoperator.ledger import Ledger
from gpuoperator.model import binding, dra_health, draining, preemption, slimming
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model.draining import Role
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Kind, Obj
from gpuoperator.runtime.clock import SYSTEM, Clock


def collect(client: Client) -> tuple[Ledger, dict[str, Obj]]:
    """The ledger of the cluster now, and its classes by name."""
    ledger = Ledger()
    nodes, _ = client.list(pykube.Node)
    pods, _ = client.list(pykube.Pod)
    classes, _ = client.list(GPUClass)
    claims, _ = client.list(GPUClaim)
    kubevirt = collect_kubevirt(client)
    ledger.load(
        nodes=[slimming.slim_node(n) for n in nodes],
        pods=[slimming.slim_pod(p) for p in pods],
        classes=classes,
        claims=claims,
        kubevirt=kubevirt,
        resource_slices=_listed(client, ResourceSlice),
        device_classes=_listed(client, DeviceClass),
        resource_claims=_listed(client, ResourceClaim),
        device_taint_rules=_listed(client, DeviceTaintRule),
    )
    return ledger, {c["metadata"]["name"]: c for c in classes}


def _listed(client: Client, kind: Kind) -> list[Obj]:
    """Every object of a DRA kind (none where the cluster does not serve it:
    ``resource.k8s.io/v1``, or DeviceTaintRules' ``v1beta2``)."""
    try:
        found, _ = client.list(kind)
    except errors.NotFoundError:
        return []
    return found


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def catalog(
    ledger: Ledger,
    classes: dict[str, Obj],
    vmis: dict[tuple[str, str], Obj] | None = None,
    *,
    policy: binding.Policy = "binpack",
    clock: Clock = SYSTEM,
) -> str:
    """The classes with their figures, and the nodes with GPU resources with why each is not
    eligible for a class: what ``gpuoperator status`` prints; where preemptible classes
    exist, what each guaranteed class's oldest waiting order would take back (``vmis``: the
    VM instances by ``(namespace, name)``, to tell running spot VMs from idle holds)."""
    out = ["CLASSES"]
    rows = [["NAME", "MODE", "RESOURCE", "FREE", "MAX FREE/NODE", "ELIGIBLE NODES"]]
    for name in ledger.class_names():
        cls = classes[name]
        f = ledger.class_figures(name)
        rows.append(
            [
                name,
                gpuclasses.mode(cls),
                gpuclasses.backend(cls),
                str(f.free),
                str(f.max_free_per_node),
                str(f.nodes),
            ]
        )
    out.append(_table(rows) if len(rows) > 1 else "(no GPUClass)")
    out.append("")
    out.append("NODES")
    rows = [["NODE", "RESOURCE", "ALLOCATABLE", "ALLOCATED", "FREE", "NOT ELIGIBLE FOR"]]
    for node_name in ledger.node_names():
        view = ledger.node(node_name)
        if view is None:
            continue
        for device in view.devices:
            resource = device["resourceName"]
            why = []
            for class_name in ledger.class_names():
                if gpuclasses.resource_name(classes[class_name]) != resource:
                    continue
                reasons = ledger.eligibility(node_name, class_name)
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
    dra = _dra_rows(ledger)
    if len(dra) > 1:
        out.append("")
        out.append("DRA DEVICES")
        out.append(_table(dra))
    taking = _take_back_rows(ledger, classes, vmis or {}, policy, clock)
    if len(taking) > 1:
        out.append("")
        out.append("TAKE-BACKS (guaranteed orders that fit only on preemptible units)")
        out.append(_table(taking))
    return "\n".join(out)


def _take_back_rows(
    ledger: Ledger,
    classes: dict[str, Obj],
    vmis: dict[tuple[str, str], Obj],
    policy: binding.Policy,
    clock: Clock,
) -> list[list[str]]:
    """For each guaranteed class beside preemptible ones whose oldest waiting order fits
    nowhere as things are: what it would take back, on which node (``model.preemption``,
    running VMs allowed, as the preemption controller decides), or that nothing would do."""
    rows = [["CLASS", "ORDER", "NODE", "TAKES BACK", "UNITS", "VMS STOPPED"]]
    now = clock.now()
    for name in ledger.class_names():
        cls = classes[name]
        if not preemption.spot_classes(cls, classes.values()):
            continue
        order = ledger.unplaced_order(cls, now)
        if order is None:
            continue
        order_name = "/".join(gpuclaims.key(order))
        found = ledger.take_back(
            order, cls, ledger.spot_claims(cls), vmis, policy, now, running=True
        )
        if found is None:
            rows.append([name, order_name, "-", "nothing would make it fit", "-", "-"])
            continue
        taken = ", ".join(
            f"{'/'.join(h.key)} ({'VM running' if h.running else 'idle'})" for h in found.holds
        )
        rows.append([name, order_name, found.node, taken, str(found.units), str(found.running)])
    return rows


def _dra_rows(ledger: Ledger) -> list[list[str]]:
    """Per node and DRA class: its devices, allocated, tainted, free (``GPUNode.status.
    draDevices``), and why the node is not eligible for the class."""
    rows = [
        ["NODE", "CLASS", "DEVICECLASS", "DEVICES", "ALLOCATED", "TAINTED", "FREE", "NOT ELIGIBLE"]
    ]
    for node_name in ledger.node_names():
        view = ledger.node(node_name)
        for entry in view.dra if view is not None else []:
            reasons = ledger.eligibility(node_name, entry["name"])
            rows.append(
                [
                    node_name,
                    entry["name"],
                    entry["deviceClassName"],
                    str(entry["count"]),
                    str(entry["allocated"]),
                    str(entry["tainted"]),
                    str(entry["free"]),
                    "; ".join(reasons) or "-",
                ]
            )
    return rows


def collect_vmis(client: Client) -> dict[tuple[str, str], Obj]:
    """The VM instances by ``(namespace, name)`` (none when KubeVirt is not installed)."""
    try:
        vmis, _ = client.list(VirtualMachineInstance)
    except errors.NotFoundError:
        return {}
    return {(v["metadata"]["namespace"], v["metadata"]["name"]): v for v in vmis}


def collect_kubevirt(client: Client) -> Obj | None:
    """The KubeVirt CR (``None`` when KubeVirt is not installed)."""
    try:
        kubevirts, _ = client.list(KubeVirt)
    except errors.NotFoundError:
        return None
    return kubevirts[0] if kubevirts else None


def collect_migrations(client: Client) -> list[Obj]:
    """Every VirtualMachineInstanceMigration (none when KubeVirt is not installed)."""
    return _listed(client, VirtualMachineInstanceMigration)


def node(
    ledger: Ledger,
    classes: dict[str, Obj],
    node_name: str,
    claims: list[Obj],
    vmis: dict[tuple[str, str], Obj],
    *,
    migrations: list[Obj] | None = None,
    kubevirt: Obj | None = None,
    clock: Clock = SYSTEM,
) -> str:
    """What holds ``node_name``: ``claims`` are the claims bound there (or more: others are
    skipped), ``vmis`` the VM instances by ``(namespace, name)``, ``migrations`` the
    cluster's VirtualMachineInstanceMigrations, ``kubevirt`` the KubeVirt CR."""
    found = next((n for n in _nodes(ledger, node_name)), None)
    if found is None:
        return f"node {node_name}: not found, or it has no GPU resource"
    cordoned = draining.draining(found)
    out = [f"NODE {node_name}: {'cordoned' if cordoned else 'not cordoned'}"]
    known = {
        gpuclaims.key(c): c for name in ledger.class_names() for c in ledger.claims_of_class(name)
    }
    known.update((gpuclaims.key(c), c) for c in claims)
    migrating = draining.migrating_vmis(node_name, claims, vmis, kubevirt, known.get, classes)
    holds = draining.holds_on(node_name, claims, vmis, migrating)
    by_key = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
    rows = [["NAMESPACE", "CLAIM", "CLASS", "UNITS", "VM", "DRAIN"]]
    for h in holds:
        rows.append(
            [
                h.key[0],
                h.key[1],
                h.class_name,
                str(h.count),
                h.vmi or "-",
                _drain(h, by_key, ledger, classes, clock),
            ]
        )
    out.append(_table(rows) if len(rows) > 1 else "(no claim bound to this node)")
    blocking = sorted({f"{h.key[0]}/{h.vmi}" for h in holds if h.role is Role.BLOCKING})
    out.append("")
    if blocking:
        tenants = sorted({h.key[0] for h in holds if h.role is Role.BLOCKING})
        out.append(f"BLOCKING THE DRAIN: {len(blocking)} VM(s) of tenant(s) {', '.join(tenants)}: ")
        out[-1] += ", ".join(blocking)
    else:
        out.append("BLOCKING THE DRAIN: no VM")
    flying = draining.in_flight(node_name, migrations or [], vmis, list(known.values()))
    out.append("")
    if flying:
        out.append("MIGRATIONS IN FLIGHT")
        rows = [["NAMESPACE", "MIGRATION", "VM", "CLAIMS", "SOURCE -> TARGET", "SINCE"]]
        for f in flying:
            rows.append(
                [
                    f.key[0],
                    f.key[1],
                    f.vmi[1],
                    ",".join(f.claims) or "-",
                    f"{f.source or '?'} -> {f.target or '(not chosen yet)'}",
                    f.since or "-",
                ]
            )
        out.append(_table(rows))
    else:
        out.append("MIGRATIONS IN FLIGHT: none")
    view = ledger.node(node_name)
    dra = [
        [
            e["name"],
            e["deviceClassName"],
            str(e["count"]),
            str(e["allocated"]),
            str(e["tainted"]),
            str(e["free"]),
        ]
        for e in (view.dra if view is not None else [])
    ]
    if dra:
        out.append("")
        out.append("DRA DEVICES")
        out.append(
            _table([["CLASS", "DEVICECLASS", "DEVICES", "ALLOCATED", "TAINTED", "FREE"], *dra])
        )
    sick = _unhealthy_rows(ledger, classes, node_name, claims, vmis)
    if len(sick) > 1:
        out.append("")
        out.append("HOLDS ON UNHEALTHY DEVICES")
        out.append(_table(sick))
    return "\n".join(out)


def _unhealthy_rows(
    ledger: Ledger,
    classes: dict[str, Obj],
    node_name: str,
    claims: list[Obj],
    vmis: dict[tuple[str, str], Obj],
) -> list[list[str]]:
    """The DRA holds on the node whose devices are tainted or gone (``model.dra_health``),
    with what device health does with each."""
    rows = [["NAMESPACE", "CLAIM", "CLASS", "DEVICES", "CAUSE", "HEALTH"]]
    on_node = [c for c in claims if (c.get("status") or {}).get("nodeName") == node_name]
    for class_name in sorted(classes):
        inventory = ledger.dra_inventory(class_name)
        if inventory is None:
            continue
        mine = [c for c in on_node if (c.get("spec") or {}).get("className") == class_name]
        for s in dra_health.sick_holds(mine, inventory, vmis):
            if s.role is Role.BLOCKING:
                state = "running" if s.running else "not running"
                what = f"STAYS: serves VM {s.key[0]}/{s.vmi} ({state})"
            elif s.role is Role.RELEASING:
                what = "released (being deleted)"
            else:
                what = "idle: moves to healthy devices when some are free"
            devices = ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r, _ in s.bad)
            rows.append([s.key[0], s.key[1], class_name, devices, s.cause, what])
    return rows


def _nodes(ledger: Ledger, name: str) -> list[Obj]:
    view = ledger.node(name)
    if view is not None:
        return [view.node]
    return []


def _drain(
    h: draining.Hold,
    claims: dict[tuple[str, str], Obj],
    ledger: Ledger,
    classes: dict[str, Obj],
    clock: Clock,
) -> str:
    if h.role is Role.RELEASING:
        return "released (being deleted)"
    if h.role is Role.BLOCKING:
        return f"BLOCKS: VM {'running' if h.running else 'not running'}"
    if h.role is Role.MIGRATING:
        return "LIVE-MIGRATES: VM running, evictionStrategy LiveMigrate"
    cls = classes.get(h.class_name)
    if cls is None:
        return f"idle hold; class {h.class_name} not found"
    room = [n for n, _ in ledger.candidates(claims[h.key], cls, clock.now())]
    if not room:
        return "idle hold; fits on no other eligible node now"
    return f"idle hold; room on {', '.join(room)}"
