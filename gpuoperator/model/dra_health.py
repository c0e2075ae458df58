"""Device health of DRA holds (docs/design.md §5 "DRA classes", "Device health"): what
becomes of a Bound claim of a DRA class when a device it holds turns unhealthy.

A held device is **unhealthy** when the class's inventory (``dra_devices.Inventory``)

* lists it with a ``NoSchedule`` or ``NoExecute`` device taint (:data:`TAINTED`: the driver
  marks it broken in its ResourceSlice, or a DeviceTaintRule selects it), or
* does not list it while its pool is counted whole (:data:`GONE`: the driver no longer
  publishes the device, or it no longer matches the DeviceClass). A pool that is not counted
  (absent, or being republished with slices missing) says nothing about its devices: they
  are left alone until it is whole again.

Such a claim is, as on a cordoned node (``model.draining``):

* **movable** (idle: serving no VM instance, not being deleted): it moves to healthy
  devices, chosen by the binding rules (:func:`move_target`): the class's free devices on
  the eligible nodes, its own healthy devices counted free for itself (so it may stay on its
  node, keeping them), ``placementPolicy`` for the node, ``dra_holds.choose`` for the
  devices (topology first), its unexpired ``refusedNodes`` passed over. One that fits
  nowhere stays, and says so (condition :data:`CONDITION`, reason the cause);
* **blocking** (serving a VM instance): GPU VMs cannot live-migrate, so the claim is not
  moved; the condition and an Event tell the tenant which device is unhealthy, and
  ``gpuoperator status --node N`` lists it;
* **releasing** (being deleted): its devices go with it.

Every function is pure and idempotent.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator.model import (
    binding,
    dra_devices,
    dra_holds,
    draining,
    gpu_hours,
    objects,
    orders,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model.draining import Role

Obj = dict[str, Any]
Key = tuple[str, str]

#: The claim condition reporting a hold with an unhealthy device that stays where it is.
CONDITION: Final = "DeviceUnhealthy"
#: Causes (the condition's and the Event's reason; a move's Event reason is ``Moved``).
TAINTED: Final = "DeviceTainted"
GONE: Final = "DeviceGone"


@dataclasses.dataclass(frozen=True)
class Sick:
    """A Bound claim of the class holding unhealthy devices: ``bad`` maps each to its cause;
    ``role``, ``vmi`` and ``running`` as ``model.draining`` judges the claim."""

    key: Key
    node: str
    count: int
    bad: tuple[tuple[dra_devices.DeviceRef, str], ...]
    role: Role
    vmi: str = ""
    running: bool = False

    @property
    def cause(self) -> str:
        """:data:`TAINTED` when any bad device is tainted, else :data:`GONE`."""
        return TAINTED if any(c == TAINTED for _, c in self.bad) else GONE


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def held(claim: Mapping[str, Any]) -> tuple[dra_devices.DeviceRef, ...]:
    """The devices a Bound claim's status names (none for any other claim)."""
    if not gpuclaims.is_bound(dict(claim)):
        return ()
    return tuple(sorted(dra_holds.claimed([claim])))


def bad_devices(
    claim: Mapping[str, Any],
    inventory: dra_devices.Inventory,
    listed: Mapping[dra_devices.DeviceRef, dra_devices.Device] | None = None,
) -> tuple[tuple[dra_devices.DeviceRef, str], ...]:
    """The claim's unhealthy devices with their cause (the module's rules); ``listed`` is
    :func:`listing` of ``inventory`` when the caller has it already."""
    return unhealthy(held(claim), inventory, listed)


def listing(
    inventory: dra_devices.Inventory,
) -> dict[dra_devices.DeviceRef, dra_devices.Device]:
    """Every device of ``inventory`` by reference."""
    return {d.ref: d for view in inventory.nodes.values() for d in view.devices}


def unhealthy(
    refs: Iterable[dra_devices.DeviceRef],
    inventory: dra_devices.Inventory,
    listed: Mapping[dra_devices.DeviceRef, dra_devices.Device] | None = None,
) -> tuple[tuple[dra_devices.DeviceRef, str], ...]:
    """Which of ``refs`` are unhealthy, with their cause (the module's rules)."""
    if listed is None:
        listed = listing(inventory)
    out = []
    for ref in refs:
        device = listed.get(ref)
        if device is None:
            if (ref.driver, ref.pool) in inventory.pools:
                out.append((ref, GONE))
        elif device.tainted:
            out.append((ref, TAINTED))
    return tuple(out)


def sick_holds(
    claims: Iterable[Mapping[str, Any]],
    inventory: dra_devices.Inventory,
    vmis: Mapping[Key, Mapping[str, Any]],
) -> list[Sick]:
    """The claims (of one DRA class) holding unhealthy devices, in order of creation;
    ``vmis`` are the cached VM instances by ``(namespace, name)``."""
    out = []
    listed = listing(inventory)
    bound = [c for c in claims if held(c)]
    for claim in sorted(bound, key=orders.creation_order):
        bad = bad_devices(claim, inventory, listed)
        if not bad:
            continue
        judged = judge(claim, vmis)
        out.append(
            Sick(
                key=judged.key,
                node=gpuclaims.node_name(dict(claim)),
                count=judged.count,
                bad=bad,
                role=judged.role,
                vmi=judged.vmi,
                running=judged.running,
            )
        )
    return out


def judge(claim: Mapping[str, Any], vmis: Mapping[Key, Mapping[str, Any]]) -> draining.Hold:
    """The claim as a cordoned node's drain judges it (``model.draining.hold``), ``vmis``
    being the cached VM instances by ``(namespace, name)``."""
    ns = str(_mapping(claim.get("metadata")).get("namespace") or "")
    return draining.hold(claim, vmis.get((ns, gpu_hours.served_vmi_name(claim))))


def _own_free(claim: Mapping[str, Any], inventory: dra_devices.Inventory) -> dra_devices.Inventory:
    """``inventory`` with the claim's own healthy devices free (for its own re-choice)."""
    own = set(held(claim))
    return dra_devices.Inventory(
        nodes={
            name: dra_devices.NodeDevices(
                name,
                tuple(
                    dataclasses.replace(d, held=False) if d.ref in own and not d.tainted else d
                    for d in view.devices
                ),
            )
            for name, view in inventory.nodes.items()
        },
        reasons=inventory.reasons,
        pools=inventory.pools,
    )


def move_target(
    claim: Obj,
    cls: Obj,
    nodes: Iterable[Obj],
    inventory: dra_devices.Inventory,
    policy: binding.Policy,
    now: datetime.datetime,
) -> tuple[str, tuple[dra_devices.DeviceRef, ...]] | None:
    """Where a movable sick claim goes: the node and its devices (the module's rules), or
    ``None`` when no eligible node has enough healthy free devices."""
    return _target(claim, cls, nodes, _own_free(claim, inventory), policy, now)


def _target(
    claim: Obj,
    cls: Obj,
    nodes: Iterable[Obj],
    inventory: dra_devices.Inventory,
    policy: binding.Policy,
    now: datetime.datetime,
) -> tuple[str, tuple[dra_devices.DeviceRef, ...]] | None:
    """The binding rules' node and devices for ``claim`` on ``inventory`` as it is."""
    count = orders.ordered_count(claim)
    frees, _ = binding.dra_figures(cls, nodes, inventory)
    refused = binding.unexpired_refusals(claim, now)
    fitting = sorted((n, f) for n, f in frees.items() if f >= count and n not in refused)
    node = binding.choose(fitting, policy)
    if node is None:
        return None
    devices = dra_holds.choose(inventory.nodes[node], count)
    return (node, devices) if devices is not None else None


def adoptable(
    claim: Mapping[str, Any], hold: Mapping[str, Any], inventory: dra_devices.Inventory
) -> tuple[str, tuple[dra_devices.DeviceRef, ...]] | None:
    """A move already written to the claim's own hold but not to its status (the status
    write lost a race, or the leader stopped between the two): the node and devices of
    ``hold``'s allocation when they are healthy and not what the claim's status names, so
    the claim's status is written to match instead of moving the hold again."""
    devices = dra_holds.allocated(hold)
    node = dra_holds.allocation_node(hold)
    if not devices or not node or set(devices) == set(held(claim)):
        return None
    if unhealthy(devices, inventory) or {d.pool for d in devices} != {node}:
        return None
    return node, devices


def _refs(bad: Iterable[tuple[dra_devices.DeviceRef, str]]) -> str:
    parts = []
    for ref, cause in bad:
        what = "tainted" if cause == TAINTED else "gone from its ResourceSlice"
        parts.append(f"{ref.driver}/{ref.pool}/{ref.device} ({what})")
    return ", ".join(parts)


def moved_message(sick: Sick, target: str, devices: Iterable[dra_devices.DeviceRef]) -> str:
    """The ``Moved`` condition's and Event's message."""
    names = ", ".join(f"{d.driver}/{d.pool}/{d.device}" for d in devices)
    where = f"within {target}" if target == sick.node else f"from {sick.node} to {target}"
    return f"moved {where}, devices {names}: {sick.cause}: {_refs(sick.bad)}"


def stuck_message(sick: Sick, device_class: str) -> str:
    units = f"{sick.count} healthy free device{'' if sick.count == 1 else 's'}"
    return (
        f"{_refs(sick.bad)}; no eligible node has {units} of DeviceClass {device_class} "
        "now; the hold stays until room frees or the device is healthy again"
    )


def serving_message(sick: Sick) -> str:
    what = "running" if sick.running else "not running"
    return (
        f"{_refs(sick.bad)}; the claim serves VM {sick.key[0]}/{sick.vmi} ({what}) and is not "
        "moved (GPU VMs cannot live-migrate): stop the VM to move the hold to healthy devices"
    )


# ---- a Bound claim whose hold is gone -------------------------------------------------------

#: The ``Bound`` reason of a claim whose hold was created again on the devices it names.
HOLD_RESTORED: Final = "HoldRestored"
#: The ``Bound`` reason of a claim whose hold was gone and that fits nowhere (it waits), and
#: the condition (and Warning Event) of one serving a VM whose devices cannot be held again.
HOLD_LOST: Final = "HoldLost"
HOLD_MISSING: Final = "HoldMissing"


def hold_missing(claim: Mapping[str, Any], resource_claim: Mapping[str, Any] | None) -> bool:
    """Whether a Bound claim naming devices has lost its hold: no ResourceClaim of its
    hold's name exists, or its own one (``dra_holds.is_hold_of``) holds no allocation (a
    leader stopped between a move's delete and its create, or between the create and the
    allocation; an administrator deleted it). A ResourceClaim of that name that the claim
    does not control is not its hold and is never replaced."""
    if not held(claim):
        return False
    if resource_claim is None:
        return True
    return dra_holds.is_hold_of(resource_claim, claim) and not dra_holds.allocated(resource_claim)


@dataclasses.dataclass(frozen=True)
class Rehold:
    """Where a claim that lost its hold is held again: ``restored`` when on the very
    devices its status names, else moved there by the binding rules."""

    node: str
    devices: tuple[dra_devices.DeviceRef, ...]
    restored: bool


def rehold_target(
    claim: Obj,
    cls: Obj,
    nodes: Iterable[Obj],
    inventory: dra_devices.Inventory,
    policy: binding.Policy,
    now: datetime.datetime,
    *,
    move: bool,
) -> Rehold | None:
    """Where ``claim`` (Bound, :func:`hold_missing`) is held again. ``inventory`` is the
    class's devices with every allocation and every other counted claim's devices held,
    but not the devices this claim's status names (nothing else holds those unless it says
    so). The claim's own devices when each is listed on its node and free (no allocation,
    no other claim, no blocking taint); else, when ``move``, the node and devices the
    binding rules choose (as a health move does); else ``None``."""
    nodes = list(nodes)
    own = held(claim)
    node = gpuclaims.node_name(claim)
    view = inventory.nodes.get(node)
    free = {d.ref for d in view.devices if d.free} if view is not None else set()
    if own and set(own) <= free and node in {objects.key(n)[1] for n in nodes}:
        return Rehold(node, own, restored=True)
    if not move:
        return None
    found = _target(claim, cls, nodes, inventory, policy, now)
    return Rehold(found[0], found[1], restored=False) if found is not None else None


def _names(devices: Iterable[dra_devices.DeviceRef]) -> str:
    return ", ".join(f"{d.driver}/{d.pool}/{d.device}" for d in devices)


def rehold_message(claim: Mapping[str, Any], found: Rehold) -> str:
    """The ``Bound`` condition's and Event's message of a claim held again."""
    name = dra_holds.resource_claim_name(claim)
    if found.restored:
        return (
            f"ResourceClaim {name} was gone; created again on node {found.node}, "
            f"devices {_names(found.devices)}"
        )
    source = gpuclaims.node_name(dict(claim))
    where = f"within {found.node}" if found.node == source else f"from {source} to {found.node}"
    return (
        f"ResourceClaim {name} was gone and devices {_names(held(claim))} are no longer free "
        f"and healthy; moved {where}, devices {_names(found.devices)}"
    )


def hold_lost_message(claim: Mapping[str, Any], device_class: str) -> str:
    """The ``Bound`` condition's message of a claim that lost its hold and fits nowhere."""
    count = orders.ordered_count(dict(claim))
    units = f"{count} free healthy device{'' if count == 1 else 's'}"
    return (
        f"ResourceClaim {dra_holds.resource_claim_name(claim)} was gone, devices "
        f"{_names(held(claim))} are no longer free and healthy, and no eligible node has "
        f"{units} of DeviceClass {device_class}; the claim will be bound again"
    )


def hold_missing_message(claim: Mapping[str, Any], hold: draining.Hold) -> str:
    """The ``HoldMissing`` condition's message of a claim serving a VM that lost its hold
    and whose devices cannot be held again."""
    return (
        f"ResourceClaim {dra_holds.resource_claim_name(claim)} is gone and devices "
        f"{_names(held(claim))} are no longer free and healthy; the claim serves VM "
        f"{hold.key[0]}/{hold.vmi} and is not moved (GPU VMs cannot live-migrate): stop the "
        "VM to bind the claim again"
    )
