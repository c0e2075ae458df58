"""A GPUClaim's status transitions, decided once: each function returns the whole status the
claim takes, and the controllers only choose a transition and write what it returns (through
the claim status write-back).

What each transition sets (``Bound`` is the claim's ``Bound`` condition,
:data:`claims.BOUND_CONDITION`; every field not named stays as it was):

* :func:`bound` (a waiting claim gets a node): phase ``Bound``, ``nodeName`` the node,
  ``boundTime`` now, ``Bound`` True with reason ``Bound``, ``observedGeneration`` the
  claim's generation, ``usage`` the interval the hold opens; ``lostNode`` removed.
* :func:`dra_bound` (a waiting claim of a DRA class gets a node and devices there): what
  :func:`bound` sets, plus ``resourceClaimName`` the ResourceClaim that holds the devices
  and ``devices`` those devices (``{driver, pool, device}``).
* :func:`moved` (a Bound claim changes node): phase ``Bound``, ``nodeName`` the target,
  ``boundTime`` now, ``Bound`` True with reason ``Moved``; ``lostNode`` removed, and the
  conditions the caller names cleared.
* :func:`migrating` (a live migration of the claim's VM got a target): ``migration`` the
  transient hold, the ``Migrating`` condition True; phase and node stay.
* :func:`migrated` (the VM completed its migration): what :func:`moved` sets, to the
  transient hold's node with the ``Bound`` reason ``Migrated``, ``migration`` removed and the
  ``Migrating`` condition False (``Migrated``), in one write; usage goes on as for any move.
* :func:`migration_cleared` (the migration ended otherwise, or got no target): ``migration``
  removed, the ``Migrating`` condition False with the caller's reason; phase and node stay.
* :func:`refused` (a node refused the claim's set): the node joins ``refusedNodes``; a claim
  bound to that very node is also unbound: phase ``Pending``, no ``nodeName``,
  ``boundTime``, ``devices`` nor ``resourceClaimName``, ``Bound`` False with the caller's
  reason.
* :func:`preempted` (a guaranteed order took a preemptible hold's units back): phase
  ``Pending``, no ``nodeName``, ``boundTime``, ``devices`` nor ``resourceClaimName``,
  ``Bound`` False with reason ``Preempted`` naming the node and the order, the usage
  interval the hold had open closed in the same write.
* :func:`hold_lost` (a Bound DRA claim's hold is gone and it fits nowhere): as
  :func:`preempted`, with the caller's reason. :func:`held_again` (its hold was created
  again on its own devices): only the ``Bound`` condition (True, the caller's reason).
* :func:`lost` (a Bound claim's node is gone): phase ``Lost``, ``lostNode`` the node,
  ``Bound`` False with reason ``NodeLost``; ``nodeName`` and ``boundTime`` kept until it
  waits.
* :func:`waiting` (the claim waits for a node, with a reason): ``Bound`` False with that
  reason, ``observedGeneration`` the claim's generation; phase ``Pending`` (a claim already
  ``Pending`` keeps it); a ``Lost`` claim also drops ``nodeName``, ``boundTime``,
  ``devices`` and ``resourceClaimName`` and keeps the node it lost in ``lostNode``.
* :func:`counted` (GPU-hours): ``usage`` the figures given; nothing else changes (the
  phase and node stay, so it is written without an assumption, ``ClaimStatus.record``).
* :func:`attached` (the attachments controller): ``attachment`` the VMI that uses the claim
  (or none) and the ``Attached`` condition saying so, with the VMIs that wait for it; only
  those two fields, sent as a merge patch of the status (never the phase nor the node).
* :func:`flagged` and :func:`unflagged` (a condition beside ``Bound``, such as draining's
  ``NodeCordoned``): that condition True with a reason, or gone; nothing else changes.

**The lost node.** ``Lost`` is transient (its node is gone, it goes back to ``Pending`` in the
binder's same pass). ``status.lostNode`` keeps the node a claim lost until it is bound again,
and the ``Bound`` condition of a waiting claim that lost its node ends with
":data:`LOST_NOTE`". Claims written before ``status.lostNode`` existed carry the node only in
that note: :func:`lost_node` reads it from there when the field is absent.

``is_bound`` is :func:`claims.is_bound` (the one definition). Every function is pure and
idempotent: plain dicts in, new dicts out; the claim passed in is never changed.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator.model import (
    attachments,
    binding,
    conditions,
    dra_devices,
    dra_holds,
    gpu_hours,
    migrations,
)
from gpuoperator.model import claims as gpuclaims

Obj = dict[str, Any]

#: Reasons on the ``Bound`` condition (and of the Events that tell them).
BOUND: Final = "Bound"
MOVED: Final = "Moved"
NODE_LOST: Final = "NodeLost"
#: The status field naming the node a claim lost, until it is bound again.
LOST_NODE_FIELD: Final = "lostNode"
#: Appended to the ``Bound`` condition's message of a waiting claim that lost its node.
LOST_NOTE: Final = "; its node {node} is gone"

_CONDITION: Final = gpuclaims.BOUND_CONDITION


def _status(claim: Mapping[str, Any]) -> Obj:
    found = claim.get("status")
    return dict(found) if isinstance(found, Mapping) else {}


def _generation(claim: Mapping[str, Any]) -> Any:
    meta = claim.get("metadata")
    return meta.get("generation") if isinstance(meta, Mapping) else None


def _condition(
    claim: Mapping[str, Any],
    status: Obj,
    ok: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
    kind: str = _CONDITION,
) -> list[Obj]:
    """``status``'s conditions with the claim's ``kind`` condition (``Bound`` unless told)
    set, observing the claim's generation."""
    return conditions.set_condition(
        status.get("conditions"),
        kind,
        ok,
        reason,
        message,
        now=now,
        observed_generation=_generation(claim),
    )


def bound(
    claim: Mapping[str, Any],
    node: str,
    now: datetime.datetime,
    vmi: Mapping[str, Any] | None = None,
) -> Obj:
    """``claim`` bound to ``node`` at ``now``: ``Bound``, with ``boundTime``, the claim's
    generation observed, no lost node any more, and the usage interval the hold opens
    (``gpu_hours.transition``, ``vmi`` being the cached VM instance the claim serves): it is
    recorded in the binding itself, so the GPU-hours controller finds nothing to write."""
    status = _status(claim)
    status.pop(LOST_NODE_FIELD, None)
    status.update(
        phase=gpuclaims.Phase.BOUND,
        nodeName=node,
        boundTime=conditions.stamp(now),
        observedGeneration=_generation(claim),
        conditions=_condition(claim, status, True, BOUND, f"bound to node {node}", now),
    )
    change = gpu_hours.transition({**claim, "status": status}, vmi, now)
    if change is not None:
        status["usage"] = gpu_hours.to_status(change[1])
    return status


def dra_bound(
    claim: Mapping[str, Any],
    node: str,
    resource_claim_name: str,
    devices: Iterable[dra_devices.DeviceRef],
    now: datetime.datetime,
    vmi: Mapping[str, Any] | None = None,
) -> Obj:
    """``claim`` (of a DRA class) bound to ``node`` at ``now`` (:func:`bound`), holding
    ``devices`` through the ResourceClaim ``resource_claim_name`` (in its namespace)."""
    held = dra_holds.device_status(devices)
    if not 1 <= len(held) <= dra_holds.MAX_DEVICES:
        raise ValueError(f"a DRA claim holds 1 to {dra_holds.MAX_DEVICES} devices")
    status = bound(claim, node, now, vmi)
    status.update(resourceClaimName=resource_claim_name, devices=held)
    return status


def moved(
    claim: Mapping[str, Any],
    target: str,
    message: str,
    now: datetime.datetime,
    *,
    clear: Iterable[str] = (),
    reason: str = MOVED,
) -> Obj:
    """``claim`` (Bound) moved to ``target`` at ``now``: the ``Bound`` condition says
    ``reason`` (``Moved``) with ``message``; the conditions of the types in ``clear`` are
    removed."""
    status = _status(claim)
    status.pop(LOST_NODE_FIELD, None)
    gone = set(clear)
    kept = _condition(claim, status, True, reason, message, now)
    status.update(
        phase=gpuclaims.Phase.BOUND,
        nodeName=target,
        boundTime=conditions.stamp(now),
        conditions=[c for c in kept if c.get("type") not in gone],
    )
    return status


def migrating(
    claim: Mapping[str, Any], hold: migrations.TransientHold, now: datetime.datetime
) -> Obj:
    """``claim`` (Bound) with the transient hold ``hold`` of its VM's live migration:
    ``migration`` recorded, the ``Migrating`` condition True."""
    status = _status(claim)
    status[migrations.FIELD] = migrations.as_status(hold)
    message = f"units held on node {hold.target_node} for live migration {hold.uid}"
    status["conditions"] = _condition(
        claim, status, True, migrations.MIGRATING, message, now, kind=migrations.CONDITION
    )
    return status


def migrated_message(source: str, target: str) -> str:
    """The ``Bound`` condition's (and Event's) message of a claim that moved with its VM."""
    return f"moved from node {source} to node {target} with its VM's live migration"


def migrated(claim: Mapping[str, Any], now: datetime.datetime) -> Obj:
    """``claim`` (Bound, with a transient hold) whose VM completed its live migration: it
    moves to the transient hold's node (:func:`moved`, the ``Bound`` reason ``Migrated``),
    ``migration`` removed, the ``Migrating`` condition False with reason ``Migrated``."""
    hold = migrations.transient_hold(claim)
    if hold is None:
        raise ValueError("only a claim with a transient hold moves with its VM's migration")
    message = migrated_message(gpuclaims.node_name(claim), hold.target_node)
    status = moved(claim, hold.target_node, message, now, reason=migrations.MIGRATED)
    status.pop(migrations.FIELD, None)
    status["conditions"] = _condition(
        claim, status, False, migrations.MIGRATED, message, now, kind=migrations.CONDITION
    )
    return status


def migration_cleared(
    claim: Mapping[str, Any], reason: str, message: str, now: datetime.datetime
) -> Obj | None:
    """``claim`` without a transient hold (its migration ended without it, or never got
    one): it stays where it is, ``migration`` removed, the ``Migrating`` condition False
    with ``reason`` and ``message``; ``None`` when it says exactly that already."""
    status = _status(claim)
    current = conditions.find(status.get("conditions"), migrations.CONDITION) or {}
    said = (current.get("status"), current.get("reason"), current.get("message"))
    if migrations.FIELD not in status and said == ("False", reason, message):
        return None
    status.pop(migrations.FIELD, None)
    status["conditions"] = _condition(
        claim, status, False, reason, message, now, kind=migrations.CONDITION
    )
    return status


def dra_moved(
    claim: Mapping[str, Any],
    target: str,
    resource_claim_name: str,
    devices: Iterable[dra_devices.DeviceRef],
    message: str,
    now: datetime.datetime,
    *,
    clear: Iterable[str] = (),
) -> Obj:
    """``claim`` (of a DRA class, Bound) moved to ``devices`` on ``target`` (:func:`moved`),
    held through the ResourceClaim ``resource_claim_name``."""
    held = dra_holds.device_status(devices)
    if not 1 <= len(held) <= dra_holds.MAX_DEVICES:
        raise ValueError(f"a DRA claim holds 1 to {dra_holds.MAX_DEVICES} devices")
    status = moved(claim, target, message, now, clear=clear)
    status.update(resourceClaimName=resource_claim_name, devices=held)
    return status


def refused(
    claim: Mapping[str, Any],
    node: str,
    until: datetime.datetime,
    reason: str,
    message: str,
    now: datetime.datetime,
) -> Obj:
    """``node`` refused ``claim``'s set at ``now``: the node joins ``refusedNodes`` until
    ``until`` (``binding.add_refusal``), and a claim bound to that node goes back to
    ``Pending`` without node nor ``boundTime``, its ``Bound`` condition saying ``reason``
    and ``message``."""
    status = _status(claim)
    status["refusedNodes"] = binding.add_refusal(status.get("refusedNodes"), node, until, now=now)
    if gpuclaims.is_bound_to(claim, node):
        status["phase"] = gpuclaims.Phase.PENDING
        status.pop("nodeName", None)
        status.pop("boundTime", None)
        _drop_devices(status)
        status["conditions"] = _condition(claim, status, False, reason, message, now)
    return status


#: The ``Bound`` reason of a preemptible hold a guaranteed order took back.
PREEMPTED: Final = "Preempted"


def preempted_message(node: str, by: str, by_class: str, spot_class: str) -> str:
    return (
        f"units on node {node} were taken back for guaranteed claim {by} of class "
        f"{by_class} (class {spot_class} is preemptible); the claim will be bound again "
        "where room is"
    )


def preempted(
    claim: Mapping[str, Any],
    message: str,
    now: datetime.datetime,
    *,
    clear: Iterable[str] = (),
) -> Obj:
    """``claim`` (Bound, of a preemptible class, serving no VM) gives its units back:
    ``Pending`` with reason :data:`PREEMPTED`, the open usage interval closed; the
    conditions of the types in ``clear`` are removed."""
    return _unbound(claim, PREEMPTED, message, now, clear=clear)


def _unbound(
    claim: Mapping[str, Any],
    reason: str,
    message: str,
    now: datetime.datetime,
    *,
    clear: Iterable[str] = (),
) -> Obj:
    """``claim`` (Bound, serving no VM) gives its units back: ``Pending`` with ``reason``,
    no node, ``boundTime`` nor devices, the open usage interval closed."""
    status = _status(claim)
    gone = set(clear)
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") not in gone]
    status["phase"] = gpuclaims.Phase.PENDING
    status.pop("nodeName", None)
    status.pop("boundTime", None)
    _drop_devices(status)
    status["observedGeneration"] = _generation(claim)
    status["conditions"] = _condition(claim, status, False, reason, message, now)
    change = gpu_hours.transition({**claim, "status": status}, None, now)
    if change is not None:
        status["usage"] = gpu_hours.to_status(change[1])
    return status


def hold_lost(
    claim: Mapping[str, Any],
    reason: str,
    message: str,
    now: datetime.datetime,
    *,
    clear: Iterable[str] = (),
) -> Obj:
    """``claim`` (Bound, of a DRA class, idle) whose hold is gone and whose devices cannot
    be held again anywhere: ``Pending`` with ``reason``, as a claim whose node is gone
    waits (the binder binds it again where room is), its usage interval closed."""
    return _unbound(claim, reason, message, now, clear=clear)


def held_again(claim: Mapping[str, Any], reason: str, message: str, now: datetime.datetime) -> Obj:
    """``claim`` (Bound, of a DRA class) whose hold was created again on the node and
    devices its status names: only the ``Bound`` condition says ``reason``."""
    status = _status(claim)
    status["conditions"] = _condition(claim, status, True, reason, message, now)
    return status


def _drop_devices(status: Obj) -> None:
    """An unbound claim names no devices (a DRA claim's hold, if still there, is deleted or
    bound again by the binder; its allocation keeps the devices counted meanwhile)."""
    status.pop("devices", None)
    status.pop("resourceClaimName", None)


def lost_message(node: str) -> str:
    """The ``Bound`` condition's message of a claim whose node ``node`` is gone."""
    return f"node {node} is gone; the claim will be bound again"


def lost(claim: Mapping[str, Any], now: datetime.datetime) -> Obj:
    """``claim`` (Bound) whose node is gone: ``Lost``, the node recorded in ``lostNode``."""
    status = _status(claim)
    node = gpuclaims.node_name(claim)
    status["phase"] = gpuclaims.Phase.LOST
    status[LOST_NODE_FIELD] = node
    message = lost_message(node)
    status["conditions"] = _condition(claim, status, False, NODE_LOST, message, now)
    return status


def lost_node(claim: Mapping[str, Any]) -> str:
    """The node a waiting claim lost (``""``: none): ``status.lostNode``, else the node
    named by the lost-node note of its ``Bound`` condition (a status written before the
    field existed), else, for a ``Lost`` claim, its ``nodeName``."""
    status = _status(claim)
    if status.get(LOST_NODE_FIELD):
        return str(status[LOST_NODE_FIELD])
    if gpuclaims.phase(claim) == gpuclaims.Phase.LOST:
        return gpuclaims.node_name(claim)
    current = conditions.find(status.get("conditions"), _CONDITION) or {}
    message = str(current.get("message") or "")
    head, tail = LOST_NOTE.split("{node}")
    start = message.rfind(head)
    if start < 0 or not message.endswith(tail):
        return ""
    return message[start + len(head) : len(message) - len(tail)]


def waiting_message(claim: Mapping[str, Any], message: str) -> str:
    """``message`` as the ``Bound`` condition of a waiting claim says it: with the lost-node
    note while the claim has lost its node."""
    node = lost_node(claim)
    return message + LOST_NOTE.format(node=node) if node else message


def waiting(
    claim: Mapping[str, Any], reason: str, message: str, now: datetime.datetime
) -> Obj | None:
    """``claim`` waiting for a node for ``reason`` (``message`` says why): ``Pending``, its
    ``Bound`` condition False with the reason and :func:`waiting_message`. A ``Lost`` claim
    drops its node and ``boundTime`` and keeps the node it lost in ``lostNode``. ``None``
    when the claim already says exactly this (nothing to write)."""
    status = _status(claim)
    current = conditions.find(status.get("conditions"), _CONDITION)
    is_lost = gpuclaims.phase(claim) == gpuclaims.Phase.LOST
    told = waiting_message(claim, message)
    if (
        not is_lost
        and current
        and (current.get("reason"), current.get("message")) == (reason, told)
        and status.get("phase")
    ):
        return None
    if is_lost:
        status[LOST_NODE_FIELD] = lost_node(claim)
        status.pop("nodeName", None)
        status.pop("boundTime", None)
        _drop_devices(status)
    if is_lost or not status.get("phase"):
        status["phase"] = gpuclaims.Phase.PENDING
    status["observedGeneration"] = _generation(claim)
    status["conditions"] = _condition(claim, status, False, reason, told, now)
    return status


def flagged(
    claim: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime.datetime
) -> Obj | None:
    """``claim`` with its condition ``type_`` True for ``reason`` and ``message``; ``None``
    when it says exactly that already (nothing to write)."""
    status = _status(claim)
    current = conditions.find(status.get("conditions"), type_)
    if current and current.get("message") == message and current.get("status") == "True":
        return None
    status["conditions"] = conditions.set_condition(
        status.get("conditions"),
        type_,
        True,
        reason,
        message,
        now=now,
        observed_generation=_generation(claim),
    )
    return status


def unflagged(claim: Mapping[str, Any], type_: str) -> Obj:
    """``claim`` without its condition ``type_``."""
    status = _status(claim)
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != type_]
    return status


def counted(claim: Mapping[str, Any], usage: gpu_hours.Usage) -> Obj:
    """``claim`` with ``usage`` as its ``status.usage`` (``gpu_hours.to_status``)."""
    status = _status(claim)
    status["usage"] = gpu_hours.to_status(usage)
    return status


def attached(
    claim: Mapping[str, Any],
    attachment: Mapping[str, Any] | None,
    waiting: list[str],
    now: datetime.datetime,
) -> Obj:
    """The part of ``claim``'s status the attachments controller writes: ``attachment``
    (``{vmi, uid}``, or ``None``: no VM uses the claim) and the ``Attached`` condition for
    it and the ``waiting`` VMIs' names (``attachments.condition_for``)."""
    holder = str((attachment or {}).get("vmi") or "")
    uid = str((attachment or {}).get("uid") or "")
    status, reason, message = attachments.condition_for(holder, uid, waiting)
    return {
        "attachment": dict(attachment) if attachment is not None else None,
        "conditions": conditions.set_condition(
            _status(claim).get("conditions"),
            attachments.CONDITION,
            status,
            reason,
            message,
            now=now,
        ),
    }
