"""The chaos suite's checks on one consistent snapshot of the cluster, written from
docs/design.md §5 with their own plain arithmetic (none of the product's model is used).

A snapshot is read at one etcd revision: claims are listed first, then pods, nodes,
classes and the rest with ``resourceVersion=<that revision>&resourceVersionMatch=Exact``,
so all of them describe the same instant.

* **Over-allocation**: for every node and resource, the units of Bound claims plus the units
  other pods request there are at most the node's allocatable. A pod's units follow
  kube-scheduler's rule (max of the regular containers plus restartable init sidecars, and
  of each init container, plus overhead); pods that terminated (Succeeded, Failed) or are
  not on a node use nothing. A virt-launcher pod controlled by a VMI is accounted by that
  VMI's claims bound on the pod's node (attached held claims, owned template claims), up to
  the units they hold; anything beyond counts like any pod's.
* **DRA devices** (classes with ``spec.source.dra``; see "DRA classes" below): a DRA
  class's units on a node are the devices its DeviceClass selects in the ResourceSlices
  published for that node; its Bound claims count against them as above. Besides, no device
  is in two ResourceClaims' allocations or named by two Bound claims, and no allocation
  takes a device published on another node than the allocation's; once converged, every
  Bound claim of a DRA class holds exactly its devices through the ResourceClaim its status
  names, controlled by it and allocated on its node, and no allocated hold is left without
  its claim (``dra_mismatches``). ResourceClaims, ResourceSlices and DeviceClasses are read
  at the same revision as the rest.
* **Over-budget**: for every ResourceQuota and each of its GPU keys, the units of the
  namespace's Bound claims it charges (a claim being deleted included, until it is gone) are
  at most its hard limit.
* **Stuck claims**, once the load is over and the operator had time to converge: a Bound
  claim on a node that no longer exists; a claim still Lost; a waiting claim (Pending or
  no status) that fits — an eligible node (Ready, not cordoned, no NoSchedule/NoExecute
  taint the class does not tolerate) has free units for it and is not among its unexpired
  refusedNodes, and its budgets hold (the claims bound or ordered before it plus itself
  stay within every ResourceQuota key) — unless the only nodes it fits on are the one the
  oldest waiting claim of its class that fits nowhere nominated (FIFO with backfill: the
  eligible, not refused node with allocatable for it and the fewest units missing, ties by
  name; a claim that fits on no such node nominates nothing); a waiting claim without a
  reason (a ``Bound`` condition with status False and a reason).
"""

from __future__ import annotations

import datetime
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pykube

from chaos import allocations
from gpuoperator import names
from harness import ledger

Obj = dict[str, Any]
Spot = tuple[str, str]
BOUND, PENDING, LOST = "Bound", "Pending", "Lost"


@dataclass
class Snapshot:
    revision: str
    claims: list[Obj]
    pods: list[Obj]
    nodes: list[Obj]
    classes: list[Obj]
    quotas: list[Obj]
    resource_claims: list[Obj] = field(default_factory=list)
    resource_slices: list[Obj] = field(default_factory=list)
    device_classes: list[Obj] = field(default_factory=list)


def _list(
    api: pykube.HTTPClient, version: str, plural: str, rv: str | None
) -> tuple[str, list[Obj]]:
    params = {"resourceVersion": rv, "resourceVersionMatch": "Exact"} if rv else {}
    response = api.get(url=plural, version=version, params=params)
    api.raise_for_status(response)
    body = response.json()
    return str(body["metadata"]["resourceVersion"]), list(body.get("items") or [])


def snapshot(api: pykube.HTTPClient) -> Snapshot:
    rv, claims = _list(api, names.API_VERSION, names.GPU_CLAIMS, None)
    _, pods = _list(api, "v1", "pods", rv)
    _, nodes = _list(api, "v1", "nodes", rv)
    _, classes = _list(api, names.API_VERSION, names.GPU_CLASSES, rv)
    _, quotas = _list(api, "v1", "resourcequotas", rv)
    _, held = _list(api, names.DRA_API_VERSION, names.RESOURCE_CLAIMS, rv)
    _, slices = _list(api, names.DRA_API_VERSION, names.RESOURCE_SLICES, rv)
    _, device_classes = _list(api, names.DRA_API_VERSION, names.DEVICE_CLASSES, rv)
    return Snapshot(rv, claims, pods, nodes, classes, quotas, held, slices, device_classes)


# ---- quantities and pods ---------------------------------------------------------------


def units(value: Any) -> int:
    """A whole-unit quantity ("3"); extended resources are integers."""
    return int(str(value or "0"))


def _requests(container: Obj) -> dict[str, int]:
    requests = dict((container.get("resources") or {}).get("limits") or {})
    requests.update((container.get("resources") or {}).get("requests") or {})
    out: dict[str, int] = {}
    for name, qty in requests.items():
        if "/" in name:  # extended resources only: GPUs are whole units
            out[name] = units(qty)
    return out


def pod_units(pod: Obj) -> dict[str, int]:
    """Extended-resource units a pod takes on its node, by kube-scheduler's rule."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed") or not spec.get("nodeName"):
        return {}
    total: dict[str, int] = defaultdict(int)
    for c in spec.get("containers") or []:
        for name, n in _requests(c).items():
            total[name] += n
    init_peak: dict[str, int] = defaultdict(int)
    sidecars: dict[str, int] = defaultdict(int)
    for c in spec.get("initContainers") or []:
        reqs = _requests(c)
        for name, n in reqs.items():
            # An init container runs beside the sidecars started before it.
            init_peak[name] = max(init_peak[name], n + sidecars[name])
        if c.get("restartPolicy") == "Always":
            for name, n in reqs.items():
                sidecars[name] += n
                total[name] += n
    overhead = {n: units(q) for n, q in (spec.get("overhead") or {}).items() if "/" in n}
    out = {}
    for name in set(total) | set(init_peak) | set(overhead):
        n = max(total.get(name, 0), init_peak.get(name, 0)) + overhead.get(name, 0)
        if n > 0:
            out[name] = n
    return out


def _controller_uid(obj: Obj, kind: str) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("uid") or "")
    return ""


def _owner_uids(obj: Obj) -> set[str]:
    return {str(r.get("uid")) for r in (obj.get("metadata") or {}).get("ownerReferences") or []}


# ---- claims ------------------------------------------------------------------------------


def _status(claim: Obj) -> Obj:
    return dict(claim.get("status") or {})


def phase(claim: Obj) -> str:
    return str(_status(claim).get("phase") or "")


def holds(claim: Obj) -> bool:
    return phase(claim) == BOUND and bool(_status(claim).get("nodeName"))


def key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resource_of(cls: Obj) -> str:
    """The resource a class's units are counted in: a device-plugin class's extended
    resource, ``dra:<deviceClassName>`` for a DRA class (its devices, see below)."""
    source = (cls.get("spec") or {}).get("source") or {}
    if source.get("dra"):
        return DRA_PREFIX + str(source["dra"].get("deviceClassName") or "")
    return str((source.get("devicePlugin") or {}).get("resourceName") or "")


def bound_condition(claim: Obj) -> Obj:
    for c in _status(claim).get("conditions") or []:
        if c.get("type") == BOUND:
            return dict(c)
    return {}


def _accounts_for(claim: Obj, vmi_uid: str, vmi_name: str, namespace: str) -> bool:
    """The claim is one of the VMI's: attached to it, or a template claim it owns."""
    if (claim.get("metadata") or {}).get("namespace") != namespace:
        return False
    if vmi_uid in _owner_uids(claim):
        return True
    attachment = _status(claim).get("attachment") or {}
    if attachment.get("uid"):
        return str(attachment["uid"]) == vmi_uid
    return bool(vmi_name) and attachment.get("vmi") == vmi_name


def used_units(snap: Snapshot) -> dict[Spot, int]:
    """Units in use per (node, resource): Bound claims plus pods no claim accounts for."""
    resources = {c["metadata"]["name"]: resource_of(c) for c in snap.classes}
    used: dict[Spot, int] = defaultdict(int)
    bound = [c for c in snap.claims if holds(c)]
    for claim in bound:
        res = resources.get(str(claim["spec"]["className"]))
        if res:
            used[(claim["status"]["nodeName"], res)] += int(claim["spec"]["count"])
    for pod in snap.pods:
        node = str(pod["spec"].get("nodeName") or "")
        taken = pod_units(pod)
        vmi_uid = _controller_uid(pod, "VirtualMachineInstance")
        if vmi_uid and (pod["metadata"].get("labels") or {}).get("kubevirt.io") == "virt-launcher":
            owner = next(
                r["name"] for r in pod["metadata"]["ownerReferences"] if r.get("uid") == vmi_uid
            )
            ns = pod["metadata"]["namespace"]
            for claim in bound:
                if claim["status"]["nodeName"] == node and _accounts_for(claim, vmi_uid, owner, ns):
                    res = resources.get(str(claim["spec"]["className"]), "")
                    if res in taken:
                        taken[res] = max(0, taken[res] - int(claim["spec"]["count"]))
        for res, n in taken.items():
            used[(node, res)] += n
    return used


def allocatable(node: Obj, resource: str) -> int:
    return units(((node.get("status") or {}).get("allocatable") or {}).get(resource))


def capacity(snap: Snapshot) -> dict[Spot, int]:
    """Units per (node, resource): extended resources' allocatable, and for each DRA
    class's DeviceClass the devices published on the node (``dra_capacity``)."""
    out: dict[Spot, int] = {}
    for node in snap.nodes:
        for res in (node.get("status") or {}).get("allocatable") or {}:
            if "/" in res:
                out[(node["metadata"]["name"], res)] = allocatable(node, res)
    out.update(dra_capacity(snap))
    return out


def overallocations(snap: Snapshot) -> list[str]:
    """Units used beyond capacity per node, and every DRA device sold twice
    (``dra_double_allocations``)."""
    nodes = {n["metadata"]["name"] for n in snap.nodes}
    cap = capacity(snap)
    judged = dra_drivers(snap)
    out = []
    for (node, res), n in sorted(used_units(snap).items()):
        if res.startswith(DRA_PREFIX) and res not in judged:
            continue  # a DeviceClass the oracle does not read (see "DRA classes")
        if node in nodes and n > cap.get((node, res), 0):
            out.append(f"{node} {res}: {n} used of {cap.get((node, res), 0)}")
    return out + dra_double_allocations(snap)


# ---- DRA classes -------------------------------------------------------------------------
#
# A DRA class's units are the devices its DeviceClass selects in the drivers' ResourceSlices
# (docs/design.md §5 "DRA classes"). The oracle evaluates no CEL: it reads the one selector
# form the chaos suite writes, ``device.driver == "<driver>"`` (every device of that
# driver); a class whose DeviceClass says anything else is not judged on devices. A pool
# counts at its newest generation; a device is used when an allocation (not admin access)
# takes it or a Bound claim's ``status.devices`` names it, and free when unused and without
# a NoSchedule or NoExecute device taint.

DRA_PREFIX = "dra:"
_DRIVER_SELECTOR = re.compile(r'device\.driver == "([^"]+)"')
Device = tuple[str, str, str]


def driver_of(device_class: Obj) -> str:
    """The driver a DeviceClass selects every device of, or "" (see above)."""
    selectors = (device_class.get("spec") or {}).get("selectors") or []
    if len(selectors) != 1:
        return ""
    found = _DRIVER_SELECTOR.fullmatch(str((selectors[0].get("cel") or {}).get("expression")))
    return found.group(1) if found else ""


def dra_drivers(snap: Snapshot) -> dict[str, str]:
    """DRA resource (``dra:<deviceClassName>``) -> the driver it counts."""
    by_name = {d["metadata"]["name"]: driver_of(d) for d in snap.device_classes}
    out = {}
    for cls in snap.classes:
        res = resource_of(cls)
        if res.startswith(DRA_PREFIX) and by_name.get(res.removeprefix(DRA_PREFIX)):
            out[res] = by_name[res.removeprefix(DRA_PREFIX)]
    return out


def published_devices(snap: Snapshot) -> dict[Device, tuple[str, bool]]:
    """Every device of a node-local slice at its pool's newest generation, with its node and
    whether a NoSchedule or NoExecute taint is on it."""

    def pool_of(spec: Obj) -> tuple[str, str, int]:
        pool = spec.get("pool") or {}
        return str(spec.get("driver")), str(pool.get("name")), int(pool.get("generation") or 0)

    newest: dict[tuple[str, str], int] = {}
    for sl in snap.resource_slices:
        driver, pool, gen = pool_of(sl.get("spec") or {})
        newest[(driver, pool)] = max(newest.get((driver, pool), gen), gen)
    out: dict[Device, tuple[str, bool]] = {}
    for sl in snap.resource_slices:
        spec = sl.get("spec") or {}
        driver, pool, gen = pool_of(spec)
        if not spec.get("nodeName") or gen != newest[(driver, pool)]:
            continue
        for d in spec.get("devices") or []:
            tainted = any(
                t.get("effect") in ("NoSchedule", "NoExecute") for t in d.get("taints") or []
            )
            out[(driver, pool, str(d.get("name")))] = (str(spec["nodeName"]), tainted)
    return out


def dra_capacity(snap: Snapshot) -> dict[Spot, int]:
    drivers = dra_drivers(snap)
    out: dict[Spot, int] = defaultdict(int)
    for (driver, _pool, _device), (node, _tainted) in published_devices(snap).items():
        for res, of in drivers.items():
            if of == driver:
                out[(node, res)] += 1
    return dict(out)


def allocated_devices(snap: Snapshot) -> dict[Device, list[str]]:
    """Each device in an allocation of a ResourceClaim, with those allocations."""
    out: dict[Device, list[str]] = defaultdict(list)
    for rc in snap.resource_claims:
        for device in allocations.devices_of(rc):
            out[device].append(key(rc))
    return dict(out)


def named_devices(snap: Snapshot) -> dict[Device, list[str]]:
    """Each device a Bound claim's ``status.devices`` names, with those claims."""
    out: dict[Device, list[str]] = defaultdict(list)
    for claim in snap.claims:
        if holds(claim):
            for d in _status(claim).get("devices") or []:
                out[(str(d.get("driver")), str(d.get("pool")), str(d.get("device")))].append(
                    key(claim)
                )
    return dict(out)


def dra_free(snap: Snapshot) -> dict[Spot, int]:
    drivers = dra_drivers(snap)
    used = set(allocated_devices(snap)) | set(named_devices(snap))
    out: dict[Spot, int] = defaultdict(int)
    for device, (node, tainted) in published_devices(snap).items():
        for res, of in drivers.items():
            if of == device[0]:
                out[(node, res)] += 0 if tainted or device in used else 1
    return dict(out)


def dra_double_allocations(snap: Snapshot) -> list[str]:
    """A device in two allocations, or named by two Bound claims; an allocation of a
    device its driver publishes on another node than the allocation's."""
    out = [
        f"{'/'.join(d)} allocated in {', '.join(sorted(holders))}"
        for d, holders in sorted(allocated_devices(snap).items())
        if len(holders) > 1
    ]
    out += [
        f"{'/'.join(d)} named by Bound claims {', '.join(sorted(holders))}"
        for d, holders in sorted(named_devices(snap).items())
        if len(holders) > 1
    ]
    published = published_devices(snap)
    for rc in snap.resource_claims:
        node = allocations.node_of(((rc.get("status") or {}).get("allocation")) or {})
        for device in allocations.devices_of(rc):
            where = published.get(device)
            if where is not None and where[0] != node:
                out.append(f"{key(rc)}: {'/'.join(device)} is on {where[0]}, allocated on {node}")
    return out


def dra_mismatches(snap: Snapshot) -> list[str]:
    """Once converged: every Bound claim of a DRA class holds its ``count`` devices through
    the ResourceClaim named in its status, controlled by it, allocated on its node with the
    devices its status names; a waiting claim names no devices; an allocated ResourceClaim
    carrying the hold label belongs to a claim that is Bound with its devices."""
    dra = {c["metadata"]["name"] for c in snap.classes if resource_of(c).startswith(DRA_PREFIX)}
    held = {key(rc): rc for rc in snap.resource_claims}
    out = []
    holding: set[str] = set()
    for claim in snap.claims:
        if str(claim["spec"]["className"]) not in dra:
            continue
        k, status = key(claim), _status(claim)
        named = sorted(
            (str(d.get("driver")), str(d.get("pool")), str(d.get("device")))
            for d in status.get("devices") or []
        )
        if not holds(claim):
            if named and not _deleting(claim):
                out.append(f"{k}: {phase(claim) or 'no phase'} and names devices {named}")
            continue
        rc_key = f"{claim['metadata']['namespace']}/{status.get('resourceClaimName')}"
        rc = held.get(rc_key)
        holding.add(rc_key)
        if rc is None:
            out.append(f"{k}: Bound, its ResourceClaim {rc_key} does not exist")
            continue
        if _controller_uid(rc, names.GPU_CLAIM) != claim["metadata"].get("uid"):
            out.append(f"{k}: Bound, its ResourceClaim {rc_key} is not controlled by it")
        allocation = (rc.get("status") or {}).get("allocation") or {}
        devices = sorted(allocations.devices_of(rc))
        if devices != named or len(named) != int(claim["spec"]["count"]):
            out.append(f"{k}: count {claim['spec']['count']}, names {named}, allocated {devices}")
        if allocations.node_of(allocation) != status.get("nodeName"):
            out.append(
                f"{k}: Bound on {status.get('nodeName')}, allocated on "
                f"{allocations.node_of(allocation) or 'no node'}"
            )
    for k, rc in sorted(held.items()):
        labels = (rc.get("metadata") or {}).get("labels") or {}
        held_alone = labels.get(names.DRA_HOLD_LABEL) == "true" and k not in holding
        if held_alone and allocations.devices_of(rc):
            out.append(f"{k}: a hold allocated with no Bound claim holding it")
    return out


# ---- eligibility, budgets, stuck claims --------------------------------------------------

_SKIPPED_TAINTS = {
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
}


def _tolerates(cls: Obj, taint: Obj) -> bool:
    for t in (cls.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def eligible(node: Obj, cls: Obj) -> bool:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    if not ready or (node.get("spec") or {}).get("unschedulable"):
        return False
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in _SKIPPED_TAINTS:
            continue
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(cls, taint):
            return False
    return True


def _time(value: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None


def refused_now(claim: Obj, now: datetime.datetime) -> set[str]:
    out = set()
    for entry in _status(claim).get("refusedNodes") or []:
        until = _time(entry.get("until"))
        if until is not None and until > now:
            out.add(str(entry.get("nodeName")))
    return out


def _order(claim: Obj) -> tuple[str, str, str]:
    meta = claim["metadata"]
    return (str(meta.get("creationTimestamp")), str(meta.get("namespace")), str(meta["name"]))


def _deleting(claim: Obj) -> bool:
    return bool((claim.get("metadata") or {}).get("deletionTimestamp"))


def budget_holds(claim: Obj, snap: Snapshot) -> bool:
    """Every budget of the claim's namespace holds with the claims bound or ordered before it,
    plus itself."""
    ns = claim["metadata"]["namespace"]
    cls = str(claim["spec"]["className"])
    mine = _order(claim)
    before = [
        c
        for c in snap.claims
        if c["metadata"]["namespace"] == ns
        and key(c) != key(claim)
        and (holds(c) or _order(c) < mine)
    ]
    for quota in snap.quotas:
        if quota["metadata"]["namespace"] != ns:
            continue
        for budget_key, hard in ((quota.get("spec") or {}).get("hard") or {}).items():
            if budget_key == names.QUOTA_TOTAL_KEY:
                scope = [*before, claim]
            elif budget_key == f"{cls}.{names.QUOTA_TOTAL_KEY}":
                scope = [c for c in [*before, claim] if c["spec"]["className"] == cls]
            else:
                continue
            if sum(int(c["spec"]["count"]) for c in scope) > units(hard):
                return False
    return True


def overbudgets(snap: Snapshot) -> list[str]:
    """Every budget a namespace's Bound claims overrun (the e2e suite's own check,
    ``harness.ledger.overbudgets``, on the snapshot)."""
    return ledger.overbudgets(snap.claims, snap.quotas)


def free_units(snap: Snapshot) -> dict[Spot, int]:
    used = used_units(snap)
    out: dict[Spot, int] = {}
    for node in snap.nodes:
        for res in (node.get("status") or {}).get("allocatable") or {}:
            if "/" in res:
                name = node["metadata"]["name"]
                out[(name, res)] = allocatable(node, res) - used.get((name, res), 0)
    out.update(dra_free(snap))
    return out


def fitting_nodes(
    claim: Obj, snap: Snapshot, free: dict[Spot, int], now: datetime.datetime
) -> list[str]:
    classes = {c["metadata"]["name"]: c for c in snap.classes}
    cls = classes.get(str(claim["spec"]["className"]))
    if cls is None:
        return []
    res = resource_of(cls)
    refused = refused_now(claim, now)
    return sorted(
        n["metadata"]["name"]
        for n in snap.nodes
        if eligible(n, cls)
        and n["metadata"]["name"] not in refused
        and free.get((n["metadata"]["name"], res), 0) >= int(claim["spec"]["count"])
    )


def waiting(claim: Obj) -> bool:
    return phase(claim) in ("", PENDING) and not _deleting(claim)


def stuck_claims(snap: Snapshot, now: datetime.datetime | None = None) -> list[str]:
    """The claims the operator should have settled and has not (see the module docstring)."""
    now = now or datetime.datetime.now(datetime.UTC)
    nodes = {n["metadata"]["name"] for n in snap.nodes}
    free = free_units(snap)
    out = []
    fits: dict[str, bool] = {}
    for claim in sorted(snap.claims, key=_order):
        k = key(claim)
        if holds(claim) and claim["status"]["nodeName"] not in nodes:
            out.append(f"{k}: Bound to node {claim['status']['nodeName']}, which is gone")
        elif phase(claim) == LOST:
            out.append(f"{k}: still Lost")
        elif waiting(claim):
            fits[k] = bool(fitting_nodes(claim, snap, free, now)) and budget_holds(claim, snap)
    by_class: dict[str, list[Obj]] = defaultdict(list)
    for claim in sorted(snap.claims, key=_order):
        if key(claim) in fits:
            by_class[str(claim["spec"]["className"])].append(claim)
    for queue in by_class.values():
        kept = ""  # the node nominated by the oldest claim of the class that fits nowhere
        for claim in queue:
            k = key(claim)
            cond = bound_condition(claim)
            if cond.get("status") != "False" or not cond.get("reason"):
                out.append(f"{k}: waits with no reason (Bound condition {cond or 'missing'})")
            where = [n for n in fitting_nodes(claim, snap, free, now) if n != kept]
            if fits[k] and where:
                out.append(
                    f"{k}: fits on {where} and waits ({cond.get('reason')}: {cond.get('message')})"
                )
            if not fits[k] and not kept and cond.get("reason") != "BudgetExceeded":
                # It waits for capacity: younger claims of its class stay off its node.
                kept = nearest_node(claim, snap, free, now)
    return out


def nearest_node(claim: Obj, snap: Snapshot, free: dict[Spot, int], now: datetime.datetime) -> str:
    """The eligible node not refused for ``claim`` whose allocatable holds its count and
    where the fewest units are missing (ties by name); "" when there is none."""
    classes = {c["metadata"]["name"]: c for c in snap.classes}
    cls = classes.get(str(claim["spec"]["className"]))
    if cls is None:
        return ""
    res = resource_of(cls)
    need = int(claim["spec"]["count"])
    refused = refused_now(claim, now)
    cap = capacity(snap)
    reachable = sorted(
        (need - max(0, free.get((n["metadata"]["name"], res), 0)), n["metadata"]["name"])
        for n in snap.nodes
        if eligible(n, cls)
        and n["metadata"]["name"] not in refused
        and cap.get((n["metadata"]["name"], res), 0) >= need
    )
    return reachable[0][1] if reachable else ""


#: What the order webhook says for each refusal of docs/design.md §5 (for the figures).
_REFUSALS = (
    ("allows at most", "over maxCount"),
    ("not entitled", "not entitled"),
    ("budget exceeded", "over budget"),
    ("free GPU", "no node has it free"),
    ("does not exist", "unknown class"),
)
#: Answers that are no decision: the replica could not judge (the order was not judged).
_NO_DECISION = ("failed calling webhook", "not synced", "could not decide")


def refusal_kind(message: str, existing: Iterable[str] = ()) -> str:
    """What a refused order was told, in a word; ``undecided: ...`` when the refusal was
    no decision of a webhook (transport failure, a replica not ready, an error), or a
    decision on a cache that is wrong (a class in ``existing`` said not to exist)."""
    if "denied the request" not in message or any(n in message for n in _NO_DECISION):
        return f"undecided: {message[-160:]}"
    if any(f"class {c} does not exist" in message for c in existing):
        return f"undecided: refused on a stale cache: {message[-160:]}"
    kinds = [kind for fragment, kind in _REFUSALS if fragment in message]
    return " + ".join(kinds) or f"other: {message[-160:]}"


def decided(message: str, existing: Iterable[str] = ()) -> bool:
    return not refusal_kind(message, existing).startswith("undecided")
