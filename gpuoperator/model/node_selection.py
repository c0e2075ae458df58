"""A pod's node selection, matched as kube-scheduler's NodeAffinity plugin matches it, and
what kube-scheduler's refusal of a pinned pod says about its own view of the nodes.

:func:`matches` is the required part of a pod's node selection: every label of
``spec.nodeSelector``, and at least one term of
``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``
(a term's ``matchExpressions`` on the node's labels and its ``matchFields`` on
``metadata.name`` all hold; an empty term matches no node, as the API documents). Preferred
terms only rank nodes, so they never exclude one.

:func:`rejected_for_affinity_alone` reads kube-scheduler's message on a pod it could not
place (``0/N nodes are available: <count> <reason>, ... .``, then what preemption found):
whether node affinity is the only reason any node was rejected. For a pod pinned to one node
by ``matchFields`` (``launcher_pods.pin_and_ungate``), the scheduler's PreFilter keeps only
that node; every other one is "didn't satisfy plugin(s) [NodeAffinity]". If the pinned node
satisfies the pod's node selection as the API shows it (:func:`matches`) and yet affinity is
the only reason, kube-scheduler's view of the node lags behind the API: it does not know the
node yet (its node informer is still catching up, after an API server restart for instance)
or still sees old labels. It retries the pod by itself when the node reaches its cache, so
such a refusal is not the node's word (:func:`scheduler_view_lags`).

Every function is pure and idempotent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

#: The node field a pin selects on (a node's own name, not a label that may differ).
NODE_NAME_FIELD: Final = "metadata.name"
IN: Final = "In"
NOT_IN: Final = "NotIn"
EXISTS: Final = "Exists"
DOES_NOT_EXIST: Final = "DoesNotExist"
GT: Final = "Gt"
LT: Final = "Lt"

#: kube-scheduler's message when its cache holds no node at all.
NO_NODES: Final = "no nodes available to schedule pods"
_FIT: Final = re.compile(r"0/\d+ nodes are available: ")
_NEXT_REASON: Final = re.compile(r", (?=\d+ )")
#: How the scheduler names node affinity: the plugin (nodes PreFilter excluded) or its
#: Filter's reason ("didn't match Pod's node affinity/selector").
_AFFINITY_WORDS: Final = ("NodeAffinity", "node affinity")


def _labels(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("metadata") or {}).get("labels") or {}


def _requirement_holds(requirement: Mapping[str, Any], value: str | None) -> bool:
    """One ``NodeSelectorRequirement`` on a label or field whose value is ``value``
    (``None``: the node has none)."""
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == IN:
        return value is not None and value in values
    if operator == NOT_IN:
        return value is None or value not in values
    if operator == EXISTS:
        return value is not None
    if operator == DOES_NOT_EXIST:
        return value is None
    if operator in (GT, LT) and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == GT else have < bound
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = _labels(node)
    for requirement in expressions:
        key = str(requirement.get("key") or "")
        value = labels.get(key)
        if not _requirement_holds(requirement, None if value is None else str(value)):
            return False
    name = str((node.get("metadata") or {}).get("name") or "")
    return all(
        requirement.get("key") == NODE_NAME_FIELD and _requirement_holds(requirement, name)
        for requirement in fields
    )


def matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``node`` satisfies the required node selection of ``pod`` (``nodeSelector``
    and the required node affinity; see the module docstring)."""
    spec = pod.get("spec") or {}
    labels = _labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if key not in labels or str(labels[key]) != str(value):
            return False
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(_term_matches(term, node) for term in required.get("nodeSelectorTerms") or [])


def rejected_for_affinity_alone(message: str) -> bool:
    """Whether kube-scheduler's unschedulable message names node affinity as the only reason
    it rejected any node (or says it knows no node at all)."""
    if message.strip().startswith(NO_NODES):
        return True
    found = _FIT.search(message)
    if found is None:
        return False
    # The reasons end at the first ". " (what preemption found follows); a reason may hold a
    # dotted taint key, never a dot followed by a space.
    body = message[found.end() :].split(". ", 1)[0].rstrip(".").strip()
    reasons = [r for r in _NEXT_REASON.split(body) if r]
    return bool(reasons) and all(any(w in r for w in _AFFINITY_WORDS) for r in reasons)


def scheduler_view_lags(pod: Mapping[str, Any], node: Mapping[str, Any], message: str) -> bool:
    """Whether kube-scheduler refused ``pod`` on ``node`` only because its own view of the
    node lags behind the API: affinity was its only reason although ``node``, as given,
    satisfies the pod's node selection."""
    return rejected_for_affinity_alone(message) and matches(pod, node)
