"""Gathering a VM's claims on one node (docs/design.md §5 "VMs"): when the claims a launcher pod
waits on are Bound to several nodes, which node they all move to, or why none can take them.

Candidate targets are the nodes the claims are bound to, the one holding most of the set's
units first (then the one holding most claims, then by name, so two replicas decide alike).
The claims on the other nodes move to the first target that

* still exists,
* is eligible for each moving claim's class (the ledger lists the class on the node),
* was not refused by a moving claim (its ``status.refusedNodes``, unexpired), and
* has free units of each resource for all moving claims together (classes may share a
  resource, so their needs add up per resource).

The binder and draining plan with the same figures (:mod:`gpuoperator.model.binding`,
:mod:`gpuoperator.model.draining`); each caller holds the ledger's allocation lock
(``Ledger.allocation_lock``) across its decision and the writes it makes, so no two of
them hand out the same units.

Pure and idempotent: the same claims, node figures, classes and time give the same answer.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuoperator.model import binding, claims, conditions, orders

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Gathering:
    """The outcome of :func:`gather`: the ``target`` and the claims ``moving`` there, or no
    target (``None``) and ``why`` no node of the set fits."""

    target: str | None
    moving: list[Obj]
    why: str = ""


def _units(n: int) -> str:
    return f"{n} unit{'' if n == 1 else 's'}"


def _name(claim: Mapping[str, Any]) -> str:
    return claims.key(claim)[1]


def misfit(
    target: str,
    moving: Iterable[Obj],
    class_free: Mapping[str, int] | None,
    resources: Mapping[str, str],
    now: datetime.datetime,
) -> str | None:
    """Why ``moving`` cannot all move to ``target`` now (``None``: they can).

    ``class_free`` is the target's free units per class it is eligible for (``None``: the
    node is gone), ``resources`` each class's resource name (absent or ``""``: unknown class).
    """
    if class_free is None:
        return "the node is gone"
    need: dict[str, int] = {}
    free: dict[str, int] = {}
    for claim in moving:
        name, class_name = _name(claim), orders.ordered_class(claim)
        until = binding.refused_until(claim, target, now)
        if until is not None:
            return f"claim {name} skips it until {conditions.stamp(until)} (refused)"
        resource = resources.get(class_name, "")
        if not resource:
            return f"class {class_name} of claim {name} is unknown"
        if class_name not in class_free:
            return f"it is not eligible for class {class_name} of claim {name}"
        need[resource] = need.get(resource, 0) + orders.ordered_count(claim)
        free[resource] = class_free[class_name]
    for resource in sorted(need):
        if need[resource] > free[resource]:
            return f"{_units(need[resource])} of {resource} needed, {free[resource]} free"
    return None


def gather(
    bound: Sequence[Obj],
    class_free: Mapping[str, Mapping[str, int] | None],
    resources: Mapping[str, str],
    now: datetime.datetime,
) -> Gathering:
    """Where the Bound claims ``bound`` gather (see the module docstring).

    ``class_free`` maps each node of the set to its free units per eligible class (``None``
    when the node is gone), ``resources`` each class name to its resource name.
    """
    held: dict[str, list[Obj]] = {}
    for claim in bound:
        held.setdefault(claims.node_name(claim), []).append(claim)
    order = sorted(
        held,
        key=lambda n: (-sum(orders.ordered_count(c) for c in held[n]), -len(held[n]), n),
    )
    reasons: list[str] = []
    for target in order:
        moving = [c for c in bound if claims.node_name(c) != target]
        why = misfit(target, moving, class_free.get(target), resources, now)
        if why is None:
            return Gathering(target, moving)
        reasons.append(f"{target}: {why}")
    return Gathering(None, [], "; ".join(reasons))
