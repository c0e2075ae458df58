"""Live migration of a VM whose claims are Bound (docs/design.md §5 "Live migration"): the
transient hold a claim carries while its VM migrates, read in one place.

While a VirtualMachineInstanceMigration of the VM runs, each of the VM's claims records
``status.migration: {uid, targetNode}``: ``uid`` is the migration's (KubeVirt labels the
migration's target pod with it, ``kubevirt.io/migrationJobUID``), ``targetNode`` the node
the transient hold keeps the claim's units on. The claim still holds its units on
``status.nodeName`` (the source) as well, until the migration ends: on success it moves to
the target, on failure or cancel the transient hold is dropped.

Every function is pure: plain dicts in, plain values out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

#: The claim's status field holding the transient hold.
FIELD: Final = "migration"


@dataclasses.dataclass(frozen=True)
class TransientHold:
    """A claim's transient hold: the migration's UID and the target node."""

    uid: str
    target_node: str


def transient_hold(claim: Mapping[str, Any]) -> TransientHold | None:
    """The claim's ``status.migration``, or ``None`` when it has none (or a malformed one)."""
    status = claim.get("status") or {}
    held = status.get(FIELD) if isinstance(status, Mapping) else None
    if not isinstance(held, Mapping):
        return None
    uid, target = held.get("uid"), held.get("targetNode")
    if not isinstance(uid, str) or not isinstance(target, str) or not uid or not target:
        return None
    return TransientHold(uid=uid, target_node=target)


def as_status(hold: TransientHold) -> dict[str, str]:
    """The ``status.migration`` value recording ``hold``."""
    return {"uid": hold.uid, "targetNode": hold.target_node}
