"""What a GPUClaim is, decided once (docs/design.md §2 GPUClaim, §5 "Capacity", §10): its phases,
its key, the VM instance it serves, and whether that VM instance is still a live user.

**Phases.** ``Pending`` (waiting for a node), ``Bound`` (holding ``spec.count`` units on
``status.nodeName``) and ``Lost`` (its node is gone; transient, it goes back to ``Pending``).
:func:`is_bound` is the one test of a claim holding units; the statuses of the transitions
between phases are :mod:`gpuoperator.model.claim_states`'s.

**Whom a claim serves** (:func:`user`). A template claim is owned by its VMI: its controller
ownerReference to a ``kubevirt.io`` VirtualMachineInstance names the VMI by name and UID. A
held claim names its VMI in ``status.attachment`` (``{vmi, uid}``, recorded by the attachments
controller once the VMI exists; an attachment without UID is one an earlier version's VMI
webhook wrote, not confirmed yet). When a claim carries
both, the ownerReference decides. Either way a claim serves one VMI at a time, so its units
never cover the pods of two: whatever a tenant writes, every unit is counted at least once.

**A live user** (:func:`is_live_user`). The VMI the claim serves is live while it exists
(with the recorded UID, when one is recorded) — **including while it is being deleted**: a
VMI with a deletionTimestamp still has its launcher pod, which may hold the GPU during the
VM's graceful shutdown. It stops being a user only once it is gone from the API. Claim
protection, the attachments controller, the VMI webhook and placement all judge "live" with
this one rule.

**Accounting** (:func:`covering_vmi`). The units a Bound claim holds cover the pods its VMI
controls on the claim's node, but only through a VMI UID: a confirmed attachment's UID or the
owner's. An unconfirmed attachment covers nothing yet (the pod is then counted in full, which
can only show fewer free units for a moment, never more).

Every function is pure and idempotent: plain dicts in, plain values out.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import objects

Obj = dict[str, Any]
#: A claim's key is its object key (:mod:`gpuoperator.model.objects`).
Key = objects.Key
key = objects.key


class Phase(enum.StrEnum):
    """``GPUClaim.status.phase``."""

    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


#: The type of the claim's condition that says whether it is bound, and why not.
BOUND_CONDITION: Final = "Bound"
#: Phases of a claim waiting for a node (``""``: no status yet).
WAITING_PHASES: Final = frozenset({"", Phase.PENDING, Phase.LOST})


#: VMI phases after which the VMI never runs again (KubeVirt's final phases).
VMI_FINAL_PHASES: Final = frozenset({names.VMI_SUCCEEDED, names.VMI_FAILED})


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping((obj or {}).get("metadata"))


def _status(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping((obj or {}).get("status"))


def phase(claim: Mapping[str, Any]) -> str:
    """``status.phase`` (``""`` for a claim no controller has looked at yet)."""
    return str(_status(claim).get("phase") or "")


def node_name(claim: Mapping[str, Any]) -> str:
    """``status.nodeName`` (``""`` when unbound)."""
    return str(_status(claim).get("nodeName") or "")


def is_bound(claim: Mapping[str, Any]) -> bool:
    """Whether the claim holds units: phase ``Bound`` with a node."""
    return phase(claim) == Phase.BOUND and bool(node_name(claim))


def is_bound_to(claim: Mapping[str, Any], node: str) -> bool:
    """Whether the claim holds units on ``node``."""
    return is_bound(claim) and node_name(claim) == node


def is_deleting(claim: Mapping[str, Any]) -> bool:
    """Whether the claim is being deleted (``metadata.deletionTimestamp``): it still exists,
    holds what it holds and is charged, but is never given units again."""
    return bool(_meta(claim).get("deletionTimestamp"))


def is_vmi_final(vmi: Mapping[str, Any] | None) -> bool:
    """Whether the VMI reached a phase after which it never runs again."""
    return _status(vmi).get("phase") in VMI_FINAL_PHASES


@dataclasses.dataclass(frozen=True)
class VmiRef:
    """A VM instance a claim serves, by name and UID (``""``: not recorded yet)."""

    name: str
    uid: str


def attachment(claim: Mapping[str, Any]) -> VmiRef | None:
    """The claim's ``status.attachment`` (``None`` without one naming a VMI)."""
    found = _mapping(_status(claim).get("attachment"))
    name = str(found.get("vmi") or "")
    return VmiRef(name, str(found.get("uid") or "")) if name else None


def is_vmi_owner(owner: Any) -> bool:
    """Whether an ownerReference is a controller reference to a KubeVirt VMI."""
    return (
        isinstance(owner, Mapping)
        and owner.get("controller") is True
        and owner.get("kind") == names.VMI_KIND
        and str(owner.get("apiVersion") or "").startswith(names.KUBEVIRT_GROUP + "/")
        and bool(owner.get("name"))
    )


def controlling_vmi(obj: Mapping[str, Any]) -> VmiRef | None:
    """The VMI that controls ``obj`` (a template claim, a launcher pod) through its
    controller ownerReference; ``None`` when no VMI does."""
    owners = _meta(obj).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if is_vmi_owner(owner):
            return VmiRef(str(owner["name"]), str(owner.get("uid") or ""))
    return None


def user(claim: Mapping[str, Any]) -> VmiRef | None:
    """The VMI the claim serves: its owner (template claims), else its attachment."""
    return controlling_vmi(claim) or attachment(claim)


def vmi_names(claim: Mapping[str, Any]) -> set[str]:
    """The names of the VMIs the claim may serve: the one controlling it and the one its
    attachment names (:func:`user` picks between them)."""
    refs = (controlling_vmi(claim), attachment(claim))
    return {ref.name for ref in refs if ref is not None}


def is_live_user(ref: VmiRef | None, vmi: Mapping[str, Any] | None) -> bool:
    """Whether ``vmi`` (the cached VMI of ``ref``'s name, ``None`` when there is none) is the
    live VM instance ``ref`` names: it exists, with ``ref``'s UID when one is recorded. A VMI
    being deleted is live (see the module docstring)."""
    if ref is None or vmi is None or str(_meta(vmi).get("name") or "") != ref.name:
        return False
    return not ref.uid or str(_meta(vmi).get("uid") or "") == ref.uid


def protects(ref: VmiRef | None, vmi: Mapping[str, Any] | None, *, pods_left: bool) -> bool:
    """Whether a claim serving ``ref`` must keep its protection finalizer, ``vmi`` being the
    cached VMI of that name and ``pods_left`` whether a pod that VMI controls has not
    terminated yet.

    While the VMI is a live user (:func:`is_live_user`), with one exception: a VMI deleted
    with foreground propagation (finalizer ``foregroundDeletion``) waits for its blocking
    dependents, a template claim among them; once its pods are gone nothing holds the GPU,
    and waiting for the VMI would deadlock with the garbage collector waiting for the claim.
    """
    if not is_live_user(ref, vmi):
        return False
    meta = _meta(vmi)
    foreground = names.FOREGROUND_DELETION_FINALIZER in (meta.get("finalizers") or [])
    return not (meta.get("deletionTimestamp") and foreground and not pods_left)


def serves_live_vmi(claim: Mapping[str, Any], vmi: Mapping[str, Any] | None) -> bool:
    """Whether the claim serves ``vmi`` (the cached VMI named by :func:`user`) and that VMI
    is still a live user: the claim's units are in use, or about to be."""
    return is_live_user(user(claim), vmi)


def covering_vmi(claim: Mapping[str, Any]) -> Key | None:
    """``(namespace, VMI UID)`` of the VMI whose launcher pods the claim's units cover, or
    ``None`` when they cover no pod (no user, or an attachment without UID yet)."""
    ref = user(claim)
    if ref is None or not ref.uid:
        return None
    return (key(claim)[0], ref.uid)


def other_live_user(
    claim: Mapping[str, Any], vmi_name: str, find_vmi: Callable[[str], Mapping[str, Any] | None]
) -> str:
    """Another live VMI ``claim`` is attached to, ``""`` when none (:func:`is_live_user`: a VMI
    being deleted is still live). An attachment naming ``vmi_name`` is that VMI's (or an
    earlier one's of that name, which is gone). ``find_vmi`` looks a VMI of the claim's
    namespace up by name (``None`` when there is none)."""
    attached = attachment(claim)
    if attached is None or attached.name == vmi_name:
        return ""
    return attached.name if is_live_user(attached, find_vmi(attached.name)) else ""
