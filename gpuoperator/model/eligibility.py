"""Node eligibility for a class (docs/design.md §5 "Capacity"): taints and tolerations matched as
kube-scheduler and kubelet match them.

A node is eligible for a class when it is Ready, not cordoned, and every ``NoSchedule`` and
``NoExecute`` taint on it is tolerated by the class's tolerations: those are the tolerations
the pod webhook copies onto the class's launcher pods, so a node eligible here is one the
scheduler will accept the pinned pod on (as far as taints go). ``PreferNoSchedule`` only
steers the scheduler, so it never makes a node ineligible.

Three taints are skipped: ``node.kubernetes.io/unschedulable``, ``not-ready`` and
``unreachable``. The node lifecycle controller derives them from the Ready condition and
``spec.unschedulable``, which this module reads directly, so counting them too would only
restate "NotReady"/"Cordoned" (and lag behind them). Every other taint counts, including the
other ``node.kubernetes.io/*`` ones such as ``disk-pressure``: the scheduler refuses an
untolerating pod there, so a hold on such a node could not start.

Nodes are the slim dicts of :func:`gpuoperator.model.slimming.slim_node`. Every function is
pure and idempotent.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Final

from gpuoperator.model import classes

Obj = dict[str, Any]

NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"
#: Taint effects that keep a pod off a node; PreferNoSchedule is only a preference.
COUNTED_EFFECTS: Final = frozenset({NO_SCHEDULE, NO_EXECUTE})
#: Taints that Ready and cordon already decide (see the module docstring).
SKIPPED_TAINT_KEYS: Final = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)

EXISTS: Final = "Exists"
EQUAL: Final = "Equal"


class Ineligibility(enum.StrEnum):
    """Why a node is not eligible for a class; the values are the reasons users read."""

    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    UNTOLERATED_TAINT = "UntoleratedTaint"


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def toleration_tolerates(toleration: Obj, taint: Obj) -> bool:
    """Whether one toleration tolerates one taint, exactly as ``v1.Toleration.ToleratesTaint``.

    An empty toleration effect matches every effect; an empty key matches every key (the API
    allows an empty key only with ``Exists``); the operator defaults to ``Equal``, which
    compares values, while ``Exists`` ignores them; an unknown operator tolerates nothing.
    """
    effect = _str(toleration.get("effect"))
    if effect and effect != _str(taint.get("effect")):
        return False
    key = _str(toleration.get("key"))
    if key and key != _str(taint.get("key")):
        return False
    operator = _str(toleration.get("operator")) or EQUAL
    if operator == EXISTS:
        return True
    if operator == EQUAL:
        return _str(toleration.get("value")) == _str(taint.get("value"))
    return False


def untolerated_taints(taints: Iterable[Obj], tolerations: Iterable[Obj]) -> list[Obj]:
    """The ``NoSchedule``/``NoExecute`` taints no toleration tolerates, in the node's order,
    skipping the taints Ready and cordon decide (:data:`SKIPPED_TAINT_KEYS`)."""
    tolerations = list(tolerations)
    return [
        taint
        for taint in taints
        if _str(taint.get("effect")) in COUNTED_EFFECTS
        and _str(taint.get("key")) not in SKIPPED_TAINT_KEYS
        and not any(toleration_tolerates(t, taint) for t in tolerations)
    ]


def lagging_taints(node: Obj) -> list[str]:
    """The keys of the ``NoSchedule``/``NoExecute`` taints of :data:`SKIPPED_TAINT_KEYS` the
    node still carries although its Ready condition and ``spec.unschedulable`` no longer call
    for them: the node lifecycle controller has yet to remove them (a node that just became
    Ready or was uncordoned). The scheduler refuses an untolerating pod there until then, so a
    refusal seen meanwhile is not the node's last word."""
    wanted = set()
    if not node_ready(node):
        wanted |= {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    if node_cordoned(node):
        wanted.add("node.kubernetes.io/unschedulable")
    taints = (node.get("spec") or {}).get("taints") or []
    return [
        _str(taint.get("key"))
        for taint in taints
        if _str(taint.get("effect")) in COUNTED_EFFECTS
        and _str(taint.get("key")) in SKIPPED_TAINT_KEYS - wanted
    ]


def node_name(node: Obj) -> str:
    """The node's name (``metadata.name``), ``""`` when absent."""
    meta = node.get("metadata")
    return _str(meta.get("name")) if isinstance(meta, dict) else ""


def node_ready(node: Obj) -> bool:
    """Whether the node's ``Ready`` condition is ``"True"``; a node without one is not Ready
    (``Unknown`` after the node stops reporting is not Ready either)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_cordoned(node: Obj) -> bool:
    """Whether the node is cordoned (``spec.unschedulable``)."""
    return bool((node.get("spec") or {}).get("unschedulable"))


def node_schedulable(node: Obj) -> bool:
    """Ready and not cordoned: GPUNode's ``Schedulable`` condition."""
    return node_ready(node) and not node_cordoned(node)


def taint_text(taint: Obj) -> str:
    """A taint as kubectl prints it: ``key=value:Effect``, or ``key:Effect`` without value."""
    key = _str(taint.get("key"))
    value = _str(taint.get("value"))
    effect = _str(taint.get("effect"))
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def reasons(node: Obj, cls: Obj) -> list[str]:
    """Why ``node`` is NOT eligible for ``cls``, in human-readable reasons; empty = eligible.

    Reasons come in a stable order: ``NotReady``, ``Cordoned``, then one
    ``taint <key=value:Effect> not tolerated`` per untolerated taint in the node's order.
    Whether the node serves the class's resource is not judged here (that is a matter of
    figures, see :mod:`gpuoperator.model.capacity`).
    """
    reasons: list[str] = []
    if not node_ready(node):
        reasons.append(Ineligibility.NOT_READY.value)
    if node_cordoned(node):
        reasons.append(Ineligibility.CORDONED.value)
    taints = (node.get("spec") or {}).get("taints") or []
    reasons.extend(
        f"taint {taint_text(taint)} not tolerated"
        for taint in untolerated_taints(taints, classes.tolerations(cls))
    )
    return reasons


def is_eligible(node: Obj, cls: Obj) -> bool:
    """Whether ``node`` is eligible for ``cls`` (:func:`reasons` finds none)."""
    return not reasons(node, cls)
