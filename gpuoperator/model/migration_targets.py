"""Migration target pods (docs/design.md §5 "Live migration"): which targets the pod webhook
gates, and the node the placement controller pins a gated target to.

KubeVirt renders a live migration's target pod like a launcher pod of the same VMI (every
VMI label and annotation, the claims label and references included) and labels it
``kubevirt.io/migrationJobUID`` with the UID of its VirtualMachineInstanceMigration. Without
the operator it would schedule past the GPU nodes' dedicated taint only by luck, and run on a
node where no hold keeps its units. So:

* :func:`gated` — a target is gated with the placement gate (and given its classes'
  tolerations) exactly as a launcher pod is, when its VMI has claims that are not all of DRA
  classes: device-plugin classes (``vgpu``, the only ones KubeVirt migrates) keep their
  units through the operator's holds. A target of a VMI without claims, or with claims of
  DRA classes only (kube-scheduler follows the ResourceClaims the pod names), is admitted
  untouched.
* :func:`target_node` — a gated target is pinned to the node of its claims' transient holds
  (``status.migration.targetNode``), once every claim of the VMI carries one whose ``uid``
  equals the pod's ``kubevirt.io/migrationJobUID`` and all name the same node, which is
  neither the VMI's node nor a node a claim is Bound to. Until then it stays gated: the
  migrations controller writes the holds, and KubeVirt deletes a target that stays pending
  too long (the migration then fails, and the VM keeps running on its node).

Choices where docs/design.md is silent:

* A held claim the cache does not know, or a class it does not know, gates the target (fail
  closed): placement waits, and the target is never let loose on a node without a hold.
* A target is never pinned to the VMI's current node nor to a node one of its claims is
  Bound to: a transient hold there would be the source's own units counted twice.

Every function is pure: plain dicts in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuoperator import names
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model import launcher_pods, migrations, objects, references

Obj = dict[str, Any]


def is_target(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is a migration target of a VM with claim references."""
    return launcher_pods.launcher_pod_kind(pod) == "migration-target"


def migration_uid(pod: Mapping[str, Any]) -> str:
    """The UID of the target's migration (its ``kubevirt.io/migrationJobUID`` label)."""
    return str(objects.labels(pod).get(names.MIGRATION_LABEL) or "")


def gated(
    refs: Sequence[references.Reference],
    claims: Mapping[str, Obj],
    classes: Mapping[str, Obj | None],
) -> bool:
    """Whether a migration target whose references are ``refs`` is gated: ``claims`` are the
    namespace's claims by name, ``classes`` the classes the references use by name (``None``:
    not in the cache). Gated when there is a reference and not every claim is of a known DRA
    class."""
    if not refs:
        return False
    if any(isinstance(r, references.HeldRef) and r.claim not in claims for r in refs):
        return True
    used = [classes.get(name) for name in references.class_names(refs, claims)]
    return any(cls is None or not gpuclasses.is_dra(cls) for cls in used)


def target_node(
    pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]], vmi_node: str
) -> tuple[str | None, str]:
    """The node the gated target ``pod`` is pinned to, and ``""``; or ``None`` and why it
    waits. ``claims`` are every claim of its VMI (each Bound and attached to it, which the
    caller checked), ``vmi_node`` the node the VMI runs on (``""``: unknown)."""
    uid = migration_uid(pod)
    if not uid:
        return None, f"the pod carries no {names.MIGRATION_LABEL} label value"
    nodes: dict[str, list[str]] = {}
    sources: set[str] = set()
    for claim in claims:
        name = str(objects.meta(claim).get("name") or "")
        sources.add(gpuclaims.node_name(claim))
        hold = migrations.transient_hold(claim)
        if hold is None:
            return None, (
                f"claim {name} has no transient hold for migration {uid} yet (the migrations "
                "controller chooses the target node and writes it)"
            )
        if hold.uid != uid:
            return None, (
                f"claim {name}'s transient hold is of migration {hold.uid}, not of this "
                f"target's migration {uid}"
            )
        nodes.setdefault(hold.target_node, []).append(name)
    if not nodes:
        return None, "the VM instance has no claim"
    if len(nodes) > 1:
        where = "; ".join(f"{n}: {', '.join(c)}" for n, c in sorted(nodes.items()))
        return None, f"the claims' transient holds name different nodes ({where})"
    [node] = nodes
    if node == vmi_node or node in sources:
        return None, (
            f"the transient holds name node {node}, where the VM instance runs or its claims "
            "are bound; a target is never pinned to the source"
        )
    return node, ""
