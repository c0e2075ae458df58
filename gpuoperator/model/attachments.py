"""Attachments: which VM instance a held claim's ``status.attachment`` ``{vmi, uid}`` may
name, and the claim's ``Attached`` condition saying who holds it and who waits. The
attachments controller applies these rules; see its docstring for when it attaches, clears
and fills.

* A VMI **uses** a claim when its references name it as a held claim; it **confirms** an
  attachment without UID when it exists with a UID and uses the claim.
* A confirmed attachment (with UID) is **stale** once its VMI is gone or has another UID; a
  VMI being deleted is still the claim's user (``claims.is_live_user``).
* Of several VMIs that may be given a claim, the **oldest** gets it: ``creationTimestamp``
  (RFC 3339 in UTC, so the strings compare as times), then name, then UID.

Every function is pure: no I/O, plain dicts in, nothing mutated.
"""

from __future__ import annotations

from typing import Any, Final

from gpuoperator.model import claims, objects, references

Obj = dict[str, Any]

#: The claim's condition saying which VM instance holds it and which wait.
CONDITION: Final = "Attached"
#: Its reasons: one VM instance holds the claim; others wait too; none holds it.
ATTACHED: Final = "Attached"
VMS_WAITING: Final = "VMsWaiting"
NOT_ATTACHED: Final = "NotAttached"


def recorded(claim: Obj) -> dict[str, Any]:
    """The claim's ``status.attachment`` (``{}`` when none)."""
    found = (claim.get("status") or {}).get("attachment")
    return found if isinstance(found, dict) else {}


def uses_claim(vmi: Obj, claim_name: str) -> bool:
    """Whether the VMI names ``claim_name`` as a held claim in its references."""
    if not references.has_references(vmi):
        return False
    try:
        refs = references.from_object(vmi)
    except references.AnnotationError:
        return False
    return claim_name in references.held_claims(refs)


def confirms(vmi: Obj | None, claim_name: str) -> bool:
    """Whether ``vmi`` is one an unconfirmed attachment of ``claim_name`` may be confirmed
    for: it exists with a UID (being deleted or not) and uses the claim."""
    return vmi is not None and bool(objects.meta(vmi).get("uid")) and uses_claim(vmi, claim_name)


def stale_reason(attached: dict[str, Any], vmi: Obj | None) -> tuple[str, str] | None:
    """Why a confirmed attachment (with UID) no longer holds — ``(reason, message)`` — or
    ``None`` while its VMI is a live user: it exists with that UID, being deleted or not
    (``claims.is_live_user``)."""
    name, uid = str(attached.get("vmi") or ""), str(attached.get("uid") or "")
    if claims.is_live_user(claims.VmiRef(name, uid), vmi):
        return None
    if vmi is None:
        return ("VMDeleted", f"VM instance {name} (uid {uid}) no longer exists")
    return (
        "VMReplaced",
        f"VM instance {name} now has uid {objects.meta(vmi).get('uid')}, not the uid {uid} the "
        "claim was attached to",
    )


def age(vmi: Obj) -> tuple[str, str, str]:
    """The order in which VMIs get a claim: oldest ``creationTimestamp`` first (RFC 3339 in
    UTC, so the strings compare as times), then name, then UID."""
    meta = objects.meta(vmi)
    return (
        str(meta.get("creationTimestamp") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
    )


def live_users(vmis: list[Obj], claim_name: str) -> list[Obj]:
    """The VMIs that may be given ``claim_name``: they exist with a UID, name it in their
    references, are not being deleted and have not finished; oldest first (:func:`age`).
    (A VMI being deleted keeps an attachment it has, but gets none.)"""
    return sorted(
        (
            v
            for v in vmis
            if confirms(v, claim_name)
            and not claims.is_vmi_final(v)
            and not objects.meta(v).get("deletionTimestamp")
        ),
        key=age,
    )


def condition_for(holder: str, uid: str, waiting: list[str]) -> tuple[bool, str, str]:
    """The claim's ``Attached`` condition (status, reason, message) for the VMI ``holder``
    with ``uid`` ("" holder: none) and the ``waiting`` VMIs' names."""
    if not holder:
        return (False, NOT_ATTACHED, "no VM instance uses this claim")
    held = f"attached to VM instance {holder} (uid {uid})"
    if not waiting:
        return (True, ATTACHED, held)
    return (
        True,
        VMS_WAITING,
        f"{held}; also named by VM instance {', '.join(waiting)}, which waits with its "
        f"launcher pod gated until {holder} is gone (a claim serves one VM at a time)",
    )
