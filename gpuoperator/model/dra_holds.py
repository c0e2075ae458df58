"""A DRA claim's hold: which devices of its node it takes, and the allocated ResourceClaim
that holds them (docs/design.md §5 "DRA classes", "Binding").

Once the binding plan has picked a node for a claim of a DRA class, the claim takes
concrete devices there. :func:`choose` decides which, from the node's devices in the
class's inventory (``dra_devices.NodeDevices``):

* only free devices (no allocation holds them, no blocking taint), each at most once;
* when one value of the class's ``topologyAttribute`` has enough free devices, all of them
  come from one value: the value with the **fewest** free devices that still fits (ties by
  value), so a one-device claim fills a partly used group and a 4-device claim on an
  8-device node with two groups of 4 takes one whole group, keeping the other whole;
* otherwise the claim spans values, taking the values with the most free devices first
  (ties by value; devices without the attribute last), so it spans as few as it can;
* within a value, devices in the order of their reference (driver, pool, device).

The same inventory and count always give the same devices.

:func:`resource_claim` is the ResourceClaim (``resource.k8s.io/v1``) the binder creates for
the hold, in the GPUClaim's namespace and named after it (:func:`resource_claim_name`),
controlled by the GPUClaim (garbage collection removes it with the claim), with one request
for exactly ``count`` devices of the class's DeviceClass. :func:`allocation` is its status,
written through the status subresource as an outside allocator does: the results, a node
selector on the node's ``metadata.name`` and ``allocationTimestamp`` (without it,
kube-scheduler's own write of the timestamp is refused as a change of an immutable
allocation and the pod that uses the claim stays Pending).

**Counted before the watch shows it.** A binding is written as the ResourceClaim and its
allocation, then the claim's status; until the allocation reaches the cache, the devices
a claim's counted state names (``status.devices`` of a Bound claim, assumed or from the
watch) are what holds them. :func:`counted_inventory` marks those as held too, so the
binder never hands the same device out twice between the write and the watch; a device
both name is held once.

Pure and idempotent: plain values in, new dicts out.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import conditions, dra_devices, objects

Obj = dict[str, Any]

#: The name of the one request of a hold's ResourceClaim, and of its allocation results.
REQUEST: Final = "gpu"
#: The most devices ``GPUClaim.status.devices`` lists (the CRD's ``maxItems``), and so the
#: most one DRA claim can hold.
MAX_DEVICES: Final = 64


def _group_order(value: str | None, free: int, *, fitting: bool) -> tuple[int, int, str]:
    # Devices without the attribute share no topology: they are never "one value" and come
    # last when the claim spans values.
    absent = 1 if value is None else 0
    return (absent, free if fitting else -free, value or "")


def choose(node: dra_devices.NodeDevices, count: int) -> tuple[dra_devices.DeviceRef, ...] | None:
    """The ``count`` devices of ``node`` a claim takes (the rules are the module's), or
    ``None`` when fewer than ``count`` are free (or ``count`` is below 1)."""
    if count < 1:
        return None
    groups: dict[str | None, list[dra_devices.DeviceRef]] = {}
    for device in sorted(node.devices, key=lambda d: d.ref):
        if device.free:
            groups.setdefault(device.topology, []).append(device.ref)
    if sum(len(refs) for refs in groups.values()) < count:
        return None
    fitting = [v for v, refs in groups.items() if v is not None and len(refs) >= count]
    if fitting:
        best = min(fitting, key=lambda v: _group_order(v, len(groups[v]), fitting=True))
        return tuple(groups[best][:count])
    chosen: list[dra_devices.DeviceRef] = []
    for value in sorted(groups, key=lambda v: _group_order(v, len(groups[v]), fitting=False)):
        chosen.extend(groups[value][: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(chosen)


def resource_claim_name(claim: Mapping[str, Any]) -> str:
    """The name of a claim's ResourceClaim: the GPUClaim's own (another kind, so no
    collision with it; any GPUClaim name is a valid ResourceClaim name). A ResourceClaim
    of that name that the GPUClaim does not control (:func:`is_hold_of`) is a tenant's and
    is never adopted."""
    return objects.key(claim)[1]


def _owner(claim: Mapping[str, Any]) -> Obj:
    meta = objects.meta(claim)
    uid, name = meta.get("uid"), meta.get("name")
    if not uid or not name:
        raise ValueError("a hold is owned by an existing GPUClaim: it needs a name and uid")
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def resource_claim(claim: Mapping[str, Any], device_class_name: str, count: int) -> Obj:
    """The ResourceClaim holding ``claim``'s devices, as created (the allocation follows
    through the status subresource, :func:`allocation`): in the claim's namespace, named
    :func:`resource_claim_name`, labelled :data:`names.DRA_HOLD_LABEL`, controlled by the
    claim, requesting exactly ``count`` devices of ``device_class_name``."""
    if not 1 <= count <= MAX_DEVICES:
        raise ValueError(f"a DRA hold has 1 to {MAX_DEVICES} devices, got {count}")
    namespace, _ = objects.key(claim)
    return {
        "apiVersion": names.DRA_API_VERSION,
        "kind": names.RESOURCE_CLAIM_KIND,
        "metadata": {
            "name": resource_claim_name(claim),
            "namespace": namespace,
            "labels": {names.DRA_HOLD_LABEL: names.TRUE},
            "ownerReferences": [_owner(claim)],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": REQUEST,
                        "exactly": {
                            "deviceClassName": device_class_name,
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                ]
            }
        },
    }


def node_selector(node: str) -> Obj:
    """The allocation's node selector: the node by ``metadata.name`` (the hostname label can
    differ from the node's name)."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def allocation(devices: Iterable[dra_devices.DeviceRef], node: str, now: datetime.datetime) -> Obj:
    """The status that allocates ``devices`` on ``node`` at ``now`` (``status.allocation``,
    one result per device of the request :data:`REQUEST`)."""
    return {
        "allocation": {
            "allocationTimestamp": conditions.stamp(now),
            "devices": {
                "results": [
                    {"request": REQUEST, "driver": d.driver, "pool": d.pool, "device": d.device}
                    for d in devices
                ]
            },
            "nodeSelector": node_selector(node),
        }
    }


def is_hold_of(resource_claim: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Whether ``resource_claim`` is ``claim``'s hold: controlled by that very GPUClaim (its
    UID), never merely of the same name."""
    uid = objects.meta(claim).get("uid")
    owners = objects.meta(resource_claim).get("ownerReferences")
    return bool(uid) and any(
        isinstance(o, Mapping)
        and o.get("controller") is True
        and o.get("kind") == names.GPU_CLAIM
        and o.get("uid") == uid
        for o in (owners if isinstance(owners, list) else [])
    )


def allocated(resource_claim: Mapping[str, Any]) -> tuple[dra_devices.DeviceRef, ...]:
    """The devices ``resource_claim``'s allocation holds, in result order (none when it is
    not allocated)."""
    status = resource_claim.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return tuple(
        dra_devices.DeviceRef(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        for r in (results if isinstance(results, list) else [])
        if isinstance(r, Mapping)
    )


def allocation_node(resource_claim: Mapping[str, Any]) -> str:
    """The node ``resource_claim``'s allocation names in its node selector's
    ``metadata.name`` field (:func:`node_selector`), ``""`` when it is not allocated or
    names none that way."""
    status = resource_claim.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    selector = alloc.get("nodeSelector") if isinstance(alloc, Mapping) else None
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    for term in terms if isinstance(terms, list) else []:
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        for f in fields if isinstance(fields, list) else []:
            values = f.get("values") if isinstance(f, Mapping) else None
            for v in values if isinstance(values, list) else []:
                return str(v)
    return ""


def device_status(devices: Iterable[dra_devices.DeviceRef]) -> list[Obj]:
    """``GPUClaim.status.devices`` for ``devices``."""
    return [{"driver": d.driver, "pool": d.pool, "device": d.device} for d in devices]


def claimed(claims: Iterable[Mapping[str, Any]]) -> set[dra_devices.DeviceRef]:
    """The devices Bound claims name in ``status.devices`` (as counted: an assumed bind
    names its devices before its allocation is watched)."""
    found: set[dra_devices.DeviceRef] = set()
    for claim in claims:
        if not gpuclaims.is_bound(claim):
            continue
        status = claim.get("status")
        entries = status.get("devices") if isinstance(status, Mapping) else None
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, Mapping):
                found.add(
                    dra_devices.DeviceRef(
                        str(e.get("driver")), str(e.get("pool")), str(e.get("device"))
                    )
                )
    return found


def counted_inventory(
    inventory: dra_devices.Inventory, claimed_devices: set[dra_devices.DeviceRef]
) -> dra_devices.Inventory:
    """``inventory`` with the ``claimed_devices`` (:func:`claimed`) held as well."""
    return dra_devices.Inventory(
        nodes={
            name: dra_devices.NodeDevices(
                name,
                tuple(
                    dataclasses.replace(d, held=True)
                    if d.ref in claimed_devices and not d.held
                    else d
                    for d in view.devices
                ),
            )
            for name, view in inventory.nodes.items()
        },
        reasons=inventory.reasons,
        pools=inventory.pools,
    )


def assign(
    bindings: Iterable[tuple[objects.Key, str, int]], inventory: dra_devices.Inventory
) -> dict[objects.Key, tuple[dra_devices.DeviceRef, ...]]:
    """The devices each of a plan's bindings ``(claim key, node, count)`` takes, in plan
    order: :func:`choose` on the node's devices less those the earlier bindings took. A
    binding whose node has fewer free devices left than its count (which a plan on the same
    inventory never makes) gets none and is left out."""
    taken: set[dra_devices.DeviceRef] = set()
    out: dict[objects.Key, tuple[dra_devices.DeviceRef, ...]] = {}
    for key, node, count in bindings:
        view = inventory.nodes.get(node)
        if view is None:
            continue
        left = dra_devices.NodeDevices(
            node,
            tuple(dataclasses.replace(d, held=True) if d.ref in taken else d for d in view.devices),
        )
        chosen = choose(left, count)
        if chosen is not None:
            taken.update(chosen)
            out[key] = chosen
    return out


# ---- devices held outside the catalog's holds ----------------------------------------------

#: The devices a ``DevicesHeldOutside`` message names; the rest are counted ("and N more").
MAX_NAMED_OUTSIDE: Final = 3


@dataclasses.dataclass(frozen=True, order=True)
class OutsideHold:
    """A device of a DRA class that an allocation of a ResourceClaim no GPUClaim controls
    holds (``holder``: the ResourceClaim's namespace and name)."""

    device: dra_devices.DeviceRef
    node: str
    holder: objects.Key


def is_hold(resource_claim: Mapping[str, Any]) -> bool:
    """Whether ``resource_claim`` is one of the catalog's holds: controlled by a GPUClaim
    (as ``config/policy/dra-holds.yaml`` recognises one, never by the hold label)."""
    owners = objects.meta(resource_claim).get("ownerReferences")
    return any(
        isinstance(o, Mapping) and o.get("controller") is True and o.get("kind") == names.GPU_CLAIM
        for o in (owners if isinstance(owners, list) else [])
    )


def held_outside(
    inventory: dra_devices.Inventory, resource_claims: Iterable[Mapping[str, Any]]
) -> tuple[OutsideHold, ...]:
    """The class's devices (``inventory``, any node) that allocations of ResourceClaims that
    are not holds (:func:`is_hold`) hold: a pod of an exempt namespace that kube-scheduler
    allocated, or a claim of another DeviceClass selecting the same devices. The inventory
    already counts them as used (any allocation holds a device); this says whose they are.
    Sorted by device, then holder; a device two such claims hold appears twice."""
    nodes = {d.ref: d.node for view in inventory.nodes.values() for d in view.devices}
    found: set[OutsideHold] = set()
    for claim in resource_claims:
        if is_hold(claim):
            continue
        holder = objects.key(claim)
        for ref in allocated(claim):
            if ref in nodes:
                found.add(OutsideHold(ref, nodes[ref], holder))
    return tuple(sorted(found))


def outside_condition(
    device_class_name: str, holds: Iterable[OutsideHold]
) -> tuple[bool, str, str]:
    """The class's ``DevicesHeldOutside`` condition (status, reason, message) for
    :func:`held_outside`'s answer: True naming up to :data:`MAX_NAMED_OUTSIDE` devices and
    their ResourceClaims (and how many more), False when there are none."""
    listed = list(holds)
    if not listed:
        return (
            False,
            "NoneHeldOutside",
            f"no device of DeviceClass {device_class_name} is held by a ResourceClaim other "
            "than the GPU claims' holds",
        )
    devices = {h.device for h in listed}
    named = ", ".join(
        f"{h.device.driver}/{h.device.pool}/{h.device.device} on node {h.node} by "
        f"ResourceClaim {h.holder[0]}/{h.holder[1]}"
        for h in listed[:MAX_NAMED_OUTSIDE]
    )
    more = f" and {len(listed) - MAX_NAMED_OUTSIDE} more" if len(listed) > MAX_NAMED_OUTSIDE else ""
    return (
        True,
        "HeldByOtherClaims",
        f"{len(devices)} device(s) of DeviceClass {device_class_name} are held by "
        f"ResourceClaims that no GPUClaim controls, so they are counted as used and never "
        f"allocated to a GPU claim: {named}{more}",
    )
