"""Drain-aware holds (docs/design.md §5 "Draining"): what becomes of the holds on a cordoned node.

A hoster cordons a node for maintenance. Each claim Bound to it is one of:

* **movable** — a hold of a stopped VM: Bound, serving no VM instance (no attachment, not a
  template claim), not being deleted. It is moved to another node the binding model would
  bind it to now (``binding.candidates``: eligible for its class, ``free >= count``, not in
  its unexpired ``refusedNodes``; the cordoned node itself is not eligible), chosen by the
  ``placementPolicy`` (``binding.choose``). Holds are considered in order of creation, so
  the oldest moves first when room is short.
* **migrating** — serving a running VM instance that live-migrates (docs/design.md §5
  "Live migration"): its ``spec.evictionStrategy`` is ``LiveMigrate``, or it sets none and
  the KubeVirt CR's ``spec.configuration.evictionStrategy`` is; and it is a VM that
  migrates at all (``model.migrations.refusal``: every claim of the VMI exists, is Bound to
  its node and is of a ``vgpu`` class; KubeVirt migrates mediated devices, not passthrough
  functions, and DRA classes do not migrate yet). The drain starts a
  VirtualMachineInstanceMigration for the VM instead of reporting it (:func:`migration_refusal`
  says why a VM does not qualify, :func:`migration_object` is the migration created).
* **blocking** — serving a VM instance that does not live-migrate (attached, or a template
  claim owned by its VMI): its VM blocks the drain until the tenant stops it; the claim is
  left as it is (a VM whose pod has not started yet is re-placed by placement when the
  cordoned node refuses its pinned pod).
* **releasing** — being deleted: its units go with it.

A movable hold that fits nowhere stays where it is and is reported, with why.

Migrations in flight (:func:`in_flight`): a migration is unfinished until its phase is
``Succeeded`` or ``Failed``; it is in flight on the node its VM instance runs on (the source)
and on the node its claims' transient holds name (the target).

Choices where docs/design.md is silent:

* A move goes before claims waiting in the binder's queue: the hold was granted earlier,
  and the move only keeps it.
* A hold with an attachment whose VM instance is gone is left alone until the attachments
  controller clears the attachment (the claim's update brings the node back).
* A VM instance whose launcher pod does not run (phase neither ``Scheduled`` nor
  ``Running``, ``gpu_hours.RUNNING_PHASES``) does not migrate: KubeVirt migrates running VMs
  only; it blocks as before.
* A VM instance whose claims' references cannot be read does not migrate (the migration
  would run without holds for every unit).

Every function is pure and idempotent.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import (
    capacity,
    eligibility,
    gpu_hours,
    migrations,
    objects,
    orders,
    references,
    templates,
)
from gpuoperator.model import claims as gpuclaims

Obj = dict[str, Any]
Key = capacity.Key

#: The claim condition reporting a hold that cannot leave its cordoned node.
CONDITION: Final = "NodeCordoned"
#: The reason of a hold that stays (a move's is ``claim_states.MOVED``).
CANNOT_MOVE: Final = "CannotMove"
#: The condition's reason (and the Events' on the claims and the node) while the VM a claim
#: serves live-migrates off the cordoned node.
DRAIN_MIGRATING: Final = "DrainMigrating"
#: The condition's reason while the VM waits for another migration off the node to end.
MIGRATION_QUEUED: Final = "DrainMigrationQueued"


class Role(enum.StrEnum):
    MOVABLE = "Movable"
    MIGRATING = "Migrating"
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


def hold(
    claim: Mapping[str, Any], vmi: Mapping[str, Any] | None, *, migrates: bool = False
) -> Hold:
    """What a drain does with ``claim``; ``vmi`` is the cached VM instance named by
    :func:`gpu_hours.served_vmi_name` (``None`` when there is none), ``migrates`` whether
    that VM live-migrates off the node (:func:`migration_refusal` found nothing)."""
    meta = _mapping(claim.get("metadata"))
    key = gpuclaims.key(claim)
    cls, count = orders.ordered_class(claim), orders.ordered_count(claim)
    if meta.get("deletionTimestamp"):
        return Hold(key, cls, count, Role.RELEASING)
    served = gpu_hours.served_vmi_name(claim)
    if served:
        running = gpu_hours.state_of(claim, vmi) is gpu_hours.State.IN_USE
        role = Role.MIGRATING if migrates and running else Role.BLOCKING
        return Hold(key, cls, count, role, served, running)
    return Hold(key, cls, count, Role.MOVABLE)


def holds_on(
    node_name: str,
    claims: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
    migrating: Collection[Key] = (),
) -> list[Hold]:
    """The holds bound to ``node_name``, in order of creation; ``vmis`` are the cached VM
    instances by ``(namespace, name)``, ``migrating`` those of them that live-migrate off
    the node (:func:`migrating_vmis`)."""
    bound = sorted(
        (c for c in claims if gpuclaims.is_bound_to(c, node_name)), key=orders.creation_order
    )
    out = []
    for claim in bound:
        ns = str(_mapping(claim.get("metadata")).get("namespace") or "")
        served = (ns, gpu_hours.served_vmi_name(claim))
        out.append(hold(claim, vmis.get(served), migrates=served in migrating))
    return out


# ---- live migration (docs/design.md §5 "Live migration") -----------------------------------


def eviction_strategy(vmi: Mapping[str, Any], kubevirt: Mapping[str, Any] | None) -> str:
    """The VMI's ``spec.evictionStrategy``, else the KubeVirt CR's
    ``spec.configuration.evictionStrategy`` (``""``: neither sets one)."""
    own = _mapping(vmi.get("spec")).get("evictionStrategy")
    if isinstance(own, str) and own:
        return own
    configuration = _mapping(_mapping((kubevirt or {}).get("spec")).get("configuration"))
    found = configuration.get("evictionStrategy")
    return found if isinstance(found, str) else ""


def migration_refusal(
    vmi: Mapping[str, Any] | None,
    kubevirt: Mapping[str, Any] | None,
    node_name: str,
    claim_of: Callable[[Key], Mapping[str, Any] | None],
    classes: Mapping[str, Mapping[str, Any]],
) -> str:
    """Why the VM instance ``vmi`` does not live-migrate off the cordoned node ``node_name``
    (``""``: it does). ``claim_of`` reads a claim by ``(namespace, name)`` (the ledger's
    view), ``classes`` are the classes by name."""
    if vmi is None:
        return "its VM instance is not known"
    meta = _mapping(vmi.get("metadata"))
    status = _mapping(vmi.get("status"))
    if meta.get("deletionTimestamp"):
        return "its VM instance is being deleted"
    if status.get("phase") not in gpu_hours.RUNNING_PHASES:
        phase = status.get("phase") or "in no phase"
        return f"its VM instance is {phase}: only a running VM instance migrates"
    if status.get("nodeName") != node_name:
        return f"its VM instance runs on {status.get('nodeName') or 'no node'}"
    strategy = eviction_strategy(vmi, kubevirt)
    if strategy != names.EVICTION_STRATEGY_LIVE_MIGRATE:
        return (
            f"evictionStrategy is {strategy or 'not set'} (on the VM instance, or the KubeVirt "
            f"CR's spec.configuration where it sets none), not "
            f"{names.EVICTION_STRATEGY_LIVE_MIGRATE}"
        )
    try:
        refs = references.from_object(dict(vmi))
    except references.AnnotationError as exc:
        return str(exc)
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    claim_names = templates.claim_names(name, refs)
    claims = {n: dict(c) for n in claim_names if (c := claim_of((ns, n))) is not None}
    found = {n: classes.get(orders.ordered_class(c)) for n, c in claims.items()}
    # Which VMs migrate at all is the migrations model's rule (the claims' classes, nodes).
    return migrations.refusal(
        vmi, claim_names, claims, {n: dict(c) if c is not None else None for n, c in found.items()}
    )


def migrating_vmis(
    node_name: str,
    claims: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
    kubevirt: Mapping[str, Any] | None,
    claim_of: Callable[[Key], Mapping[str, Any] | None],
    classes: Mapping[str, Mapping[str, Any]],
) -> set[Key]:
    """The VM instances (``(namespace, name)``) served by ``claims`` bound to ``node_name``
    that live-migrate off it (:func:`migration_refusal`)."""
    out: set[Key] = set()
    for claim in claims:
        if not gpuclaims.is_bound_to(claim, node_name):
            continue
        served = gpu_hours.served_vmi_name(claim)
        key = (str(_mapping(claim.get("metadata")).get("namespace") or ""), served)
        if not served or key in out:
            continue
        if not migration_refusal(vmis.get(key), kubevirt, node_name, claim_of, classes):
            out.add(key)
    return out


@dataclasses.dataclass(frozen=True)
class InFlight:
    """An unfinished migration touching a node: its key, the VM instance it moves, that VM's
    claims, the source and target nodes (``""``: not chosen yet) and when it was made."""

    key: Key
    vmi: Key
    claims: tuple[str, ...]
    source: str
    target: str
    since: str


def in_flight(
    node_name: str,
    migrations_: Iterable[Mapping[str, Any]],
    vmis: Mapping[Key, Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
) -> list[InFlight]:
    """The unfinished migrations (``model.migrations.Migration.finished``) with ``node_name``
    as their source (the node their VM
    instance runs on) or their target (the node their claims' transient holds name), oldest
    first; ``claims`` are the claims that may serve their VMs (others are skipped)."""
    holds: dict[Key, list[tuple[str, migrations.TransientHold | None]]] = {}
    for claim in claims:
        vmi_name = gpu_hours.served_vmi_name(claim)
        if vmi_name:
            ns, name = gpuclaims.key(claim)
            holds.setdefault((ns, vmi_name), []).append((name, migrations.transient_hold(claim)))
    out = []
    for obj in migrations_:
        migration = migrations.migration(obj)
        if migration is None or migration.finished:
            continue
        meta = objects.meta(obj)
        uid = migration.uid
        vmi_key = (migration.namespace, migration.vmi_name)
        source = str(_mapping(_mapping(vmis.get(vmi_key)).get("status")).get("nodeName") or "")
        served = holds.get(vmi_key, [])
        targets = {h.target_node for _, h in served if h is not None and h.uid == uid}
        target = targets.pop() if len(targets) == 1 else ""
        if node_name not in (source, target):
            continue
        out.append(
            InFlight(
                key=(vmi_key[0], str(meta.get("name") or "")),
                vmi=vmi_key,
                claims=tuple(sorted(name for name, _ in served)),
                source=source,
                target=target,
                since=str(meta.get("creationTimestamp") or ""),
            )
        )
    return sorted(out, key=lambda f: (f.since, f.key))


def migration_object(namespace: str, vmi_name: str, node_name: str) -> Obj:
    """The VirtualMachineInstanceMigration the drain of ``node_name`` creates for the VM
    instance ``vmi_name``: named by the API server after the VMI, labelled with the operator
    as its creator, annotated with the drained node."""
    return {
        "apiVersion": names.KUBEVIRT_API_VERSION,
        "kind": names.VMIM_KIND,
        "metadata": {
            # The API server cuts a generateName base to fit; the suffix keeps names unique.
            "generateName": f"{vmi_name[:40]}-drain-",
            "namespace": namespace,
            "labels": {names.MANAGED_BY_LABEL: names.OPERATOR_NAME},
            "annotations": {names.DRAINED_NODE_ANNOTATION: node_name},
        },
        "spec": {"vmiName": vmi_name},
    }


def migrating_message(node_name: str, vmi: Key, migration: str) -> str:
    return (
        f"node {node_name} is cordoned; VM {vmi[0]}/{vmi[1]} live-migrates off it "
        f"(VirtualMachineInstanceMigration {migration}), and the claim moves with it"
    )


def queued_message(node_name: str, vmi: Key, other: InFlight) -> str:
    return (
        f"node {node_name} is cordoned; VM {vmi[0]}/{vmi[1]} live-migrates off it once "
        f"migration {other.key[0]}/{other.key[1]} of VM {other.vmi[1]} has ended (one "
        "migration at a time per node)"
    )


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
