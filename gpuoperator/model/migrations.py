"""Live migration of a VM whose claims are Bound (docs/design.md §5 "Live migration"): the
transient hold a claim carries while its VM migrates, which VMs migrate, where to, and how a
migration ends for its claims, decided in one place.

While a VirtualMachineInstanceMigration of the VM runs, each of the VM's claims records
``status.migration: {uid, targetNode}``: ``uid`` is the migration's (KubeVirt labels the
migration's target pod with it, ``kubevirt.io/migrationJobUID``), ``targetNode`` the node
the transient hold keeps the claim's units on. The claim still holds its units on
``status.nodeName`` (the source) as well, until the migration ends: on success it moves to
the target, on failure or cancel the transient hold is dropped.

**Which VMs** (:func:`refusal`). A VMI whose claims (every claim its references name) are
all Bound to the VMI's node (``status.nodeName``) and of ``vgpu`` classes of a device-plugin
source. A VMI with host devices (passthrough) or DRA resource claims is not migratable:
KubeVirt refuses such a migration itself, so no transient hold is written for it.

**Where to** is for the binding rules to say (``model.binding.migration_target``).

**How it ends** (:func:`verdict`), for a claim whose transient hold names migration ``U`` on
node ``T``: *migrated* when the VMI's ``status.migrationState`` is ``U``'s, completed, not
failed, on ``T``; *cleared* (the claim stays) when that state failed or was aborted or
completed elsewhere, when the migration object is gone or finished ``Failed``, or when its
target pod is gone (absent, terminated or being deleted) after KubeVirt scheduled it and
before completion; otherwise the hold is *kept*. A migration finished ``Succeeded`` waits for
the VMI's state to say so. A migration gets transient holds only until KubeVirt schedules its
target pod (:func:`may_hold`), so one whose holds were cleared is not held again.

Choices where docs/design.md is silent:

* A migration object being deleted keeps its transient hold until it is gone: KubeVirt may
  still complete a migration whose abort fails.
* A migration that completed on another node than the transient hold's clears the hold
  (reason ``TargetMismatch``): the claim cannot follow a VM to units it never held.

Every function is pure: plain dicts in, plain values out.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import pods

Obj = dict[str, Any]

#: The claim's status field holding the transient hold.
FIELD: Final = "migration"
#: The claim condition telling the last migration of its VM.
CONDITION: Final = "Migrating"
#: Reasons of the condition (and of the Events that tell them). The claim's ``Bound``
#: condition says :data:`MIGRATED` once it moved with its VM.
MIGRATING: Final = "Migrating"
MIGRATED: Final = "Migrated"
NO_TARGET_CAPACITY: Final = "NoTargetCapacity"
MIGRATION_FAILED: Final = "MigrationFailed"
MIGRATION_ABORTED: Final = "MigrationAborted"
MIGRATION_GONE: Final = "MigrationGone"
TARGET_POD_GONE: Final = "TargetPodGone"
TARGET_MISMATCH: Final = "TargetMismatch"

#: ``VirtualMachineInstanceMigration.status.phase`` values (and KubeVirt's abort status).
SUCCEEDED: Final = names.VMIM_SUCCEEDED
FAILED: Final = names.VMIM_FAILED
#: Phases in which KubeVirt has scheduled the target pod (it exists until completion).
TARGET_PLACED_PHASES: Final = frozenset({"Scheduled", "PreparingTarget", "TargetReady", "Running"})


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


# -- the objects ------------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclasses.dataclass(frozen=True)
class Migration:
    """A ``VirtualMachineInstanceMigration``: its key, UID, the VMI it migrates
    (``spec.vmiName``), ``status.phase`` and whether it is being deleted."""

    namespace: str
    name: str
    uid: str
    vmi_name: str
    phase: str
    deleting: bool

    @property
    def finished(self) -> bool:
        return self.phase in (SUCCEEDED, FAILED)


def migration(obj: Mapping[str, Any]) -> Migration | None:
    """The migration object read, ``None`` without a name, UID or VMI name."""
    meta = _mapping(obj.get("metadata"))
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    vmi_name = str(_mapping(obj.get("spec")).get("vmiName") or "")
    if not (name and uid and vmi_name):
        return None
    return Migration(
        namespace=str(meta.get("namespace") or ""),
        name=name,
        uid=uid,
        vmi_name=vmi_name,
        phase=str(_mapping(obj.get("status")).get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


@dataclasses.dataclass(frozen=True)
class MigrationState:
    """A VMI's ``status.migrationState``: the migration's UID, its target node, and whether
    it completed, failed or was aborted."""

    uid: str
    target_node: str
    completed: bool
    failed: bool
    aborted: bool


def migration_state(vmi: Mapping[str, Any] | None) -> MigrationState | None:
    """The VMI's ``status.migrationState`` (``None`` without one)."""
    state = _mapping(_mapping((vmi or {}).get("status")).get("migrationState"))
    if not state:
        return None
    return MigrationState(
        uid=str(state.get("migrationUid") or ""),
        target_node=str(state.get("targetNode") or ""),
        completed=state.get("completed") is True,
        failed=state.get("failed") is True,
        aborted=state.get("abortStatus") == SUCCEEDED,
    )


def vmi_node(vmi: Mapping[str, Any] | None) -> str:
    """The node the VMI runs on (``status.nodeName``)."""
    return str(_mapping(_mapping(vmi).get("status")).get("nodeName") or "")


# -- which VMs --------------------------------------------------------------------------------


def refusal(
    vmi: Mapping[str, Any],
    claim_names: Sequence[str],
    claims: Mapping[str, Obj],
    classes: Mapping[str, Obj | None],
) -> str:
    """Why the VMI's claims get no transient hold (``""``: they may): ``claim_names`` are the
    claims its references name, ``claims`` the counted claims of its namespace by name,
    ``classes`` each of those claims' class by claim name (``None``: it does not exist)."""
    spec = _mapping(vmi.get("spec"))
    devices = _mapping(_mapping(spec.get("domain")).get("devices"))
    if devices.get("hostDevices"):
        return "the VM has host devices (passthrough), which KubeVirt does not live-migrate"
    if spec.get("resourceClaims"):
        return "the VM has DRA resource claims, which KubeVirt does not live-migrate"
    if not claim_names:
        return "the VM names no claims"
    node = vmi_node(vmi)
    if not node:
        return "the VM runs on no node yet"
    for name in claim_names:
        claim = claims.get(name)
        if claim is None:
            return f"claim {name} does not exist or does not serve this VM"
        cls = classes.get(name)
        if cls is None:
            return f"the class of claim {name} does not exist"
        if gpuclasses.is_dra(cls):
            return f"claim {name} is of DRA class {gpuclasses.name(cls)}"
        if not gpuclasses.is_vgpu(cls):
            return (
                f"claim {name} is of class {gpuclasses.name(cls)} in mode "
                f"{gpuclasses.mode(cls) or 'unset'}; only vgpu classes live-migrate"
            )
        if not gpuclaims.is_bound_to(claim, node):
            return f"claim {name} is not Bound to the VM's node {node}"
    return ""


def may_hold(found: Migration, state: MigrationState | None) -> bool:
    """Whether ``found`` may still get transient holds: it is not finished nor being
    deleted, KubeVirt has not scheduled its target pod yet (the pod waits, gated, for the
    holds; one placed without them is past holding), and the VMI's ``migrationState`` does
    not say it ended."""
    ended = (
        state is not None
        and state.uid == found.uid
        and (state.completed or state.failed or state.aborted)
    )
    return (
        not found.finished
        and not found.deleting
        and found.phase not in TARGET_PLACED_PHASES
        and not ended
    )


# -- how it ends ------------------------------------------------------------------------------


class End(enum.Enum):
    """What becomes of a transient hold."""

    KEPT = "Kept"
    MIGRATED = "Migrated"
    CLEARED = "Cleared"


@dataclasses.dataclass(frozen=True)
class Verdict:
    end: End
    reason: str = ""
    message: str = ""


def _live(pod: Mapping[str, Any]) -> bool:
    return not pods.is_terminated(dict(pod)) and not _mapping(pod.get("metadata")).get(
        "deletionTimestamp"
    )


def verdict(
    hold: TransientHold,
    found: Migration | None,
    state: MigrationState | None,
    target_pods: Iterable[Mapping[str, Any]],
) -> Verdict:
    """How the transient hold ``hold`` stands (module docstring): ``found`` is its
    migration object (``None``: gone), ``state`` the VMI's ``migrationState``,
    ``target_pods`` the cached pods of the VMI labelled with the hold's migration."""
    if state is not None and state.uid == hold.uid:
        if state.completed and not state.failed:
            if state.target_node == hold.target_node:
                return Verdict(End.MIGRATED, MIGRATED, f"migrated to node {hold.target_node}")
            return Verdict(
                End.CLEARED,
                TARGET_MISMATCH,
                f"migration {hold.uid} completed on node {state.target_node or 'unknown'}, "
                f"not on node {hold.target_node} where its units were held",
            )
        if state.aborted:
            return Verdict(End.CLEARED, MIGRATION_ABORTED, f"migration {hold.uid} was aborted")
        if state.failed:
            return Verdict(End.CLEARED, MIGRATION_FAILED, f"migration {hold.uid} failed")
    if found is None or found.uid != hold.uid:
        return Verdict(
            End.CLEARED, MIGRATION_GONE, f"migration {hold.uid} is gone before it completed"
        )
    if found.phase == FAILED:
        return Verdict(End.CLEARED, MIGRATION_FAILED, f"migration {found.name} failed")
    if found.phase in TARGET_PLACED_PHASES and not any(_live(p) for p in target_pods):
        return Verdict(
            End.CLEARED,
            TARGET_POD_GONE,
            f"the target pod of migration {found.name} is gone before it completed",
        )
    return Verdict(End.KEPT)
