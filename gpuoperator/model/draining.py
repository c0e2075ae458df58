"""Drain-aware holds (docs/design.md §5 "Draining"): what becomes of the holds on a cordoned node.

A hoster cordons a node for maintenance. Each claim Bound to it is one of:

* **movable** — a hold of a stopped VM: Bound, serving no VM instance (no attachment, not a
  template claim), not being deleted. It is moved to another node the binding model would
  bind it to now (``binding.candidates``: eligible for its class, ``free >= count``, not in
  its unexpired ``refusedNodes``; the cordoned node itself is not eligible), chosen by the
  ``placementPolicy`` (``binding.choose``). Holds are considered in order of creation, so
  the oldest moves first when room is short.
* **blocking** — serving a VM instance (attached, or a template claim owned by its VMI):
  GPU passthrough VMs cannot live-migrate, so their VMs block the drain until the tenant
  stops them; the claim is left as it is (a VM whose pod has not started yet is re-placed
  by placement when the cordoned node refuses its pinned pod).
* **releasing** — being deleted: its units go with it.

A movable hold that fits nowhere stays where it is and is reported, with why.

Choices where docs/design.md is silent:

* A move goes before claims waiting in the binder's queue: the hold was granted earlier,
  and the move only keeps it.
* A hold with an attachment whose VM instance is gone is left alone until the attachments
  controller clears the attachment (the claim's update brings the node back).

Every function is pure and idempotent.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator.model import capacity, eligibility, gpu_hours, orders
from gpuoperator.model import claims as gpuclaims

Obj = dict[str, Any]
Key = capacity.Key

#: The claim condition reporting a hold that cannot leave its cordoned node.
CONDITION: Final = "NodeCordoned"
#: The reason of a hold that stays (a move's is ``claim_states.MOVED``).
CANNOT_MOVE: Final = "CannotMove"


class Role(enum.StrEnum):
    MOVABLE = "Movable"
    BLOCKING = "Blocking"
    RELEASING = "Releasing"


@dataclasses.dataclass(frozen=True)
class Hold:
    """A claim bound to the node, with what a drain does with it. ``vmi`` names the VM
    instance a blocking claim serves, ``running`` whether its launcher pod runs."""

    key: Key
    class_name: str
    count: int
    role: Role
    vmi: str = ""
    running: bool = False


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def draining(node: Mapping[str, Any] | None) -> bool:
    """Whether the node is cordoned (``spec.unschedulable``): its holds should leave."""
    return node is not None and eligibility.node_cordoned(dict(node))


def hold(claim: Mapping[str, Any], vmi: Mapping[str, Any] | None) -> Hold:
    """What a drain does with ``claim``; ``vmi`` is the cached VM instance named by
    :func:`gpu_hours.served_vmi_name` (``None`` when there is none)."""
    meta = _mapping(claim.get("metadata"))
    key = gpuclaims.key(claim)
    cls, count = orders.ordered_class(claim), orders.ordered_count(claim)
    if meta.get("deletionTimestamp"):
        return Hold(key, cls, count, Role.RELEASING)
    served = gpu_hours.served_vmi_name(claim)
    if served:
        running = gpu_hours.state_of(claim, vmi) is gpu_hours.State.IN_USE
        return Hold(key, cls, count, Role.BLOCKING, served, running)
    return Hold(key, cls, count, Role.MOVABLE)


def holds_on(
    node_name: str,
    claims: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
) -> list[Hold]:
    """The holds bound to ``node_name``, in order of creation; ``vmis`` are the cached VM
    instances by ``(namespace, name)``."""
    bound = sorted(
        (c for c in claims if gpuclaims.is_bound_to(c, node_name)), key=orders.creation_order
    )
    out = []
    for claim in bound:
        ns = str(_mapping(claim.get("metadata")).get("namespace") or "")
        out.append(hold(claim, vmis.get((ns, gpu_hours.served_vmi_name(claim)))))
    return out


def moved_message(source: str, target: str) -> str:
    return f"moved from {source} to {target}: node cordoned"


def stuck_message(source: str, count: int, resource: str) -> str:
    units = f"{count} free unit{'' if count == 1 else 's'}"
    return (
        f"node {source} is cordoned and no other eligible node has {units} of {resource} "
        "now; the hold stays until room frees or the node is uncordoned"
    )


def blocking_text(holds: Iterable[Hold]) -> str:
    """The VMs that block a drain, for a log line, an Event and ``gpuoperator status``."""
    parts = []
    for h in holds:
        if h.role is Role.BLOCKING:
            what = "running" if h.running else "not running"
            parts.append(f"{h.key[0]}/{h.vmi} ({what}; claim {h.key[1]}, {h.count} unit(s))")
    return ", ".join(parts)
