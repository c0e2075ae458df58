"""Setting the scene of a chaos test: tenants with budgets, GPU pods no claim accounts
for, classes published, and cluster snapshots read through API server restarts."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pykube

from chaos import load, oracle
from chaos.history import ClaimHistory
from gpuoperator import names
from gpuoperator.kinds import DeviceClass, GPUClass, GPUNode
from harness import dra_driver
from harness.fleet import Fleet
from harness.waiting import WaitTimeoutError, wait_for
from localcluster import profile

CONVERGE = 120.0
Obj = dict[str, Any]


def tenant(api: pykube.HTTPClient, name: str, entitled: bool, hard: dict[str, str]) -> str:
    labels = {names.VGPU_ENTITLED_LABEL: "true"} if entitled else {}
    pykube.Namespace(api, {"metadata": {"name": name, "labels": labels}}).create()
    if hard:
        pykube.ResourceQuota(
            api, {"metadata": {"name": "gpus", "namespace": name}, "spec": {"hard": hard}}
        ).create()
    return name


#: The test cluster's exempt hoster namespace (config/overlays/dev's exemptNamespaces): the
#: admission policies admit plain GPU pods only there.
HOSTER_NAMESPACE = "gpu-hoster"


def other_pod(api: pykube.HTTPClient, node: str, resource: str, units: int) -> None:
    """A plain GPU pod that no claim accounts for, placed on ``node`` by name: a hoster's
    job, in the exempt hoster namespace (made if missing)."""
    if pykube.Namespace.objects(api).get_or_none(name=HOSTER_NAMESPACE) is None:
        pykube.Namespace(api, {"metadata": {"name": HOSTER_NAMESPACE}}).create()
    wait_for(
        "the hoster namespace's default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=HOSTER_NAMESPACE).get_or_none(
            name="default"
        ),
    )
    pykube.Pod(
        api,
        {
            "metadata": {"name": f"other-{node}", "namespace": HOSTER_NAMESPACE},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "c",
                        "image": "example.com/gpu-job",
                        "resources": {
                            "requests": {resource: str(units)},
                            "limits": {resource: str(units)},
                        },
                    }
                ],
            },
        },
    ).create()


@dataclass
class DraFleet:
    """Simulated nodes whose GPUs a DRA driver of their own publishes, and the DeviceClass
    selecting every device of that driver (the one selector form the oracle reads)."""

    driver: dra_driver.DraDriver
    device_class: str
    #: What the oracle and the record count a DRA class's units in.
    resource: str
    devices: int
    nodes: list[str] = field(default_factory=list)


def dra_fleet(
    api: pykube.HTTPClient, driver_client: pykube.HTTPClient, nodes: int, devices: int
) -> DraFleet:
    """``nodes`` nodes of ``devices`` GPUs each over two PCIe roots, published as one pool
    per node by a driver named after a fresh tag, acting as the driver's ServiceAccount."""
    tag = uuid.uuid4().hex[:6]
    driver = dra_driver.DraDriver(driver_client, driver=f"gpu-{tag}.example.com")
    device_class = f"gpus-{tag}.example.com"
    DeviceClass(
        api, dra_driver.device_class(device_class, f'device.driver == "{driver.driver}"')
    ).create()
    fleet = DraFleet(driver, device_class, oracle.DRA_PREFIX + device_class, devices)
    gpus = [dra_driver.GpuGroup(model="A10", count=devices, pcieRoots=2)]
    for i in range(nodes):
        name = f"dra-{tag}-{i}"
        pykube.Node(api, profile.node_manifest(name, profile.NodeGroup(name=name))).create()
        driver.publish(name, dra_driver.gpus_of(name, gpus))
        fleet.nodes.append(name)
    return fleet


def dra_class(api: pykube.HTTPClient, fleet: DraFleet, history: ClaimHistory, **spec: Any) -> str:
    """A DRA class of the fleet's devices (PCIe roots as its topology), registered with the
    record: its holds count against each node's devices."""
    name = f"c-{fleet.device_class.split('.')[0]}"
    source = {"dra": {"deviceClassName": fleet.device_class, "topologyAttribute": "pcieRoot"}}
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLASS,
        "metadata": {"name": name},
        "spec": {"vendor": "example", "model": "A10", "mode": "passthrough", "source": source}
        | spec,
    }
    GPUClass(api, body).create()
    history.classes[name] = fleet.resource
    for node in fleet.nodes:
        history.capacity[(node, fleet.resource)] = fleet.devices
    return name


def control_plane_caught_up(api: pykube.HTTPClient) -> float:
    """Seconds until the control plane's own components have caught up with the API server
    after its restarts: a node made now is Ready (kwok's node watch, then the node lifecycle
    controller's taints) and a pod asking for that node by its hostname label is scheduled
    there (kube-scheduler's node cache). Their client-go informers come back from a restart
    only after their reflector's backoff (capped at 30 s, jittered up to twice that), so a
    test that follows the faults would otherwise judge the operator on a scheduler and
    kubelets still blind to new nodes."""
    started = time.monotonic()
    node = Fleet(api).node(1, ready_within=CONVERGE)
    name = f"probe-{node}"
    pod = pykube.Pod(
        api,
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "example.com/probe"}],
            },
        },
    )
    pod.create()
    wait_for(
        f"probe pod {name} scheduled on {node}",
        lambda: pykube.Pod.objects(api, namespace="default").get(name=name).obj["spec"],
        until=lambda spec: spec.get("nodeName") == node,
        timeout=CONVERGE,
    )
    pod.delete()
    return time.monotonic() - started


def published(api: pykube.HTTPClient, cls: str, nodes: int) -> None:
    wait_for(
        f"class {cls} published with {nodes} nodes",
        lambda: GPUClass.objects(api).get(name=cls).obj.get("status") or {},
        until=lambda s: s.get("nodes") == nodes,
        timeout=CONVERGE,
    )


def operator_counts(api: pykube.HTTPClient, node: str, resource: str, allocated: int) -> None:
    """Wait until the operator's inventory (the node's GPUNode) shows ``allocated`` units of
    ``resource`` in use: it has seen the pods placed there."""

    def figures() -> Obj:
        found = GPUNode.objects(api).get_or_none(name=node)
        devices = ((found.obj.get("status") or {}) if found else {}).get("devices") or []
        return next((dict(d) for d in devices if d.get("resourceName") == resource), {})

    wait_for(
        f"the operator to count {allocated} units of {resource} in use on {node}",
        figures,
        until=lambda d: d.get("allocated") == allocated,
        timeout=CONVERGE,
    )


def snapshot(api: pykube.HTTPClient, tally: load.Tally) -> oracle.Snapshot:
    return load.retrying(tally, "a snapshot", lambda: oracle.snapshot(api))


@dataclass
class Verdict:
    """The end-of-run checks on a converged cluster (see ``oracle`` and ``history``)."""

    final: oracle.Snapshot
    stuck: list[str]
    overallocated: list[str]
    overbudget: list[str]
    overheld: list[str]
    changes: dict[str, list[str]]
    gaps: int
    #: A device in two allocations at a recorded revision (``allocations``).
    twice: list[str]
    #: Bound DRA claims whose hold does not match their status (``oracle.dra_mismatches``).
    dra: list[str]
    #: Every end of a hold while its claim was not being deleted (``history.releases``).
    ended: dict[str, list[str]]

    def problems(self, history: ClaimHistory) -> list[str]:
        out = [f"stuck: {s}" for s in self.stuck[:10]]
        out += [f"over-allocated: {o}" for o in self.overallocated[:10]]
        out += [f"over budget: {o}" for o in self.overbudget[:10]]
        out += [f"over-held: {o}" for o in self.overheld[:10]]
        out += [f"device allocated twice: {o}" for o in self.twice[:10]]
        out += [f"DRA hold: {o}" for o in self.dra[:10]]
        out += [f"guaranteed hold taken back: {e}" for e in self.ended["guaranteed"][:10]]
        out += [f"hold ended unexplained: {e}" for e in self.ended["unexplained"][:10]]
        for change in self.changes["unexplained"][:5]:
            claim = change.split(":")[0]
            out.append(f"node changed without Lost: {change}; {history.transitions(claim)}")
        if self.gaps:
            out.append(f"the claim record from etcd has {self.gaps} gaps")
        return out


def settle(api: pykube.HTTPClient, history: ClaimHistory, tally: load.Tally) -> Verdict:
    """Give the operator ``CONVERGE`` seconds to settle every claim, then judge."""

    def stuck() -> list[str]:
        snap = snapshot(api, tally)
        return oracle.stuck_claims(snap) + oracle.dra_mismatches(snap)

    with contextlib.suppress(WaitTimeoutError):  # what is still stuck is reported
        wait_for("no stuck claim", stuck, until=lambda s: not s, timeout=CONVERGE)
    final = snapshot(api, tally)
    return Verdict(
        final=final,
        stuck=oracle.stuck_claims(final),
        overallocated=oracle.overallocations(final),
        overbudget=oracle.overbudgets(final),
        overheld=list(history.overholds),
        changes=history.node_changes(),
        gaps=history.watch.gaps if history.watch is not None else 1,
        twice=[
            *history.allocations.twice,
            *(f"unreadable: {u}" for u in history.allocations.unreadable),
        ],
        dra=oracle.dra_mismatches(final),
        ended=history.releases(),
    )
