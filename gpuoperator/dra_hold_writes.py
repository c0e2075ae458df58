"""Writing DRA holds (docs/design.md §5 "DRA classes"): the ResourceClaim through which a
claim of a DRA class holds its devices, created and allocated, or released. The binder
(binding, adopting) and device health (moving a hold off a tainted or vanished device) write
holds through this module only, so a hold is written one way.

:func:`allocate` creates the claim's ResourceClaim (``model.dra_holds.resource_claim``,
controlled by the GPUClaim) and writes its allocation of the devices the claim's assumed
state names, through the status subresource with the created object's resourceVersion as
the precondition. The claim's state is assumed in the ledger before (its devices count as
held from then on), and the outcome settles that assumption as the claim-status write-back
does: a conflict, a ResourceClaim that is gone, one that is not the claim's, or one already
allocated forgets it (the next pass decides on the watched state); an unknown outcome keeps
it for ``ASSUME_TTL`` and raises. Only once it returns True does the caller write the
claim's status, so a claim's status never names devices before an allocation holds them.

:func:`release` deletes a hold with its uid as the precondition (one already gone is no
error).

:func:`rewrite` is the one move of a Bound claim's hold, shared by device health (a hold off
an unhealthy device, or held again once its ResourceClaim is gone) and draining (an idle
hold off a cordoned node): the claim's new state assumed first, the old hold (if any)
deleted, the new one created and allocated, and only then the claim's status sent.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Protocol

from gpuoperator.claim_status import ASSUME_TTL, Announcement, ClaimStatus, unknown_outcome
from gpuoperator.kinds import ResourceClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import dra_devices, dra_holds
from gpuoperator.runtime import errors, protocols
from gpuoperator.runtime.client import Obj


class HoldsAccess(
    protocols.Creates, protocols.Gets, protocols.ReplacesStatus, protocols.Deletes, Protocol
):
    """Writes DRA holds: creates a ResourceClaim, reads it after AlreadyExists, writes its
    allocation; deletes a hold."""


def intended_devices(intended: Obj) -> list[dra_devices.DeviceRef]:
    """The devices an assumed claim state names (``status.devices``)."""
    return [
        dra_devices.DeviceRef(str(d["driver"]), str(d["pool"]), str(d["device"]))
        for d in intended["status"]["devices"]
    ]


def allocate(
    writer: HoldsAccess,
    ledger: Ledger,
    claim: Obj,
    intended: Obj,
    node: str,
    device_class: str,
    now: datetime.datetime,
) -> bool:
    """Create and allocate ``claim``'s hold on ``node`` for the devices of ``intended`` (the
    state assumed for it); whether it is allocated (module docstring)."""
    key = gpuclaims.key(claim)
    held = intended_devices(intended)
    try:
        try:
            hold = writer.create(
                ResourceClaim, dra_holds.resource_claim(claim, device_class, len(held))
            )
        except errors.AlreadyExistsError:
            hold = writer.get(ResourceClaim, key[1], key[0])
            if not dra_holds.is_hold_of(hold, claim) or dra_holds.allocated(hold):
                ledger.forget(key)  # the next pass decides on the watched hold
                return False
        hold = {
            **hold,
            "status": {**(hold.get("status") or {}), **dra_holds.allocation(held, node, now)},
        }
        writer.replace_status(ResourceClaim, hold)
    except (errors.ConflictError, errors.NotFoundError):
        ledger.forget(key)  # changed or gone meanwhile: decide again
        return False
    except BaseException as exc:
        if unknown_outcome(exc):
            ledger.expire_after(key, ASSUME_TTL)
        else:
            ledger.forget(key)
        raise
    return True


def release(writer: HoldsAccess, hold: Obj) -> None:
    """Delete ``hold`` (uid precondition); one already gone is no error."""
    meta = hold.get("metadata") or {}
    with contextlib.suppress(errors.NotFoundError):
        writer.delete(
            ResourceClaim,
            str(meta.get("name")),
            str(meta.get("namespace")),
            uid=str(meta.get("uid") or ""),
        )


def rewrite(
    writer: HoldsAccess,
    statuses: ClaimStatus,
    claim: Obj,
    state: Obj,
    node: str,
    device_class: str,
    now: datetime.datetime,
    announce: Announcement,
    *,
    old: Obj | None = None,
    allocated_already: bool = False,
) -> bool | None:
    """Move ``claim``'s hold to the devices ``state`` (its new status) names on ``node``:
    ``state`` is assumed first (its devices count as held from then on), ``old`` (the
    claim's current hold, if any) is deleted, the hold is created again and allocated
    (:func:`allocate`), and only then the status is sent. With ``allocated_already`` the
    claim's hold already holds those devices (a move whose status write was lost): only
    the status is sent. True once written, None when a write lost a race (decide again)."""
    intended = statuses.assume(claim, state)
    if not allocated_already:
        try:
            if old is not None:
                release(writer, old)
        except BaseException:
            statuses.ledger.forget(gpuclaims.key(claim))
            raise
        if not allocate(writer, statuses.ledger, claim, intended, node, device_class, now):
            return None
    return True if statuses.send(intended, announce).ok else None
