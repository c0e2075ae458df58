"""A pod's required node selection is matched as kube-scheduler's NodeAffinity plugin matches
it, and a refusal naming node affinity alone on a node that matches tells the scheduler's view
of the node lags behind the API."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import node_selection

Obj = dict[str, Any]

NODE: Obj = {"metadata": {"name": "n1", "labels": {"gpu": "a10", "zone": "b", "cores": "16"}}}


def pod(node_selector: dict[str, str] | None = None, terms: list[Obj] | None = None) -> Obj:
    spec: Obj = {}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    return {"spec": spec}


def expr(key: str, operator: str, *values: str) -> Obj:
    out: Obj = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def pin(name: str, operator: str = "In") -> Obj:
    return {"matchFields": [{"key": "metadata.name", "operator": operator, "values": [name]}]}


@pytest.mark.parametrize(
    ("selection", "matched"),
    [
        pytest.param(pod(), True, id="no-selection"),
        pytest.param(pod({"gpu": "a10"}), True, id="node-selector"),
        pytest.param(pod({"gpu": "h100"}), False, id="node-selector-other-value"),
        pytest.param(pod({"rack": "1"}), False, id="node-selector-missing-label"),
        pytest.param(pod(terms=[pin("n1")]), True, id="pinned-here"),
        pytest.param(pod(terms=[pin("n2")]), False, id="pinned-elsewhere"),
        pytest.param(pod(terms=[pin("n2", "NotIn")]), True, id="field-not-in"),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "In", "a10")], **pin("n1")}]),
            True,
            id="expression-and-pin",
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "In", "h100")], **pin("n1")}]),
            False,
            id="expression-fails-the-pinned-term",
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "In", "h100")]}, pin("n1")]),
            True,
            id="terms-are-ored",
        ),
        pytest.param(pod(terms=[{}]), False, id="an-empty-term-matches-nothing"),
        pytest.param(pod(terms=[]), False, id="no-terms-match-nothing"),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("zone", "NotIn", "a")]}]), True, id="not-in"
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("zone", "NotIn", "b")]}]), False, id="not-in-has"
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("rack", "NotIn", "b")]}]),
            True,
            id="not-in-absent",
        ),
        pytest.param(pod(terms=[{"matchExpressions": [expr("gpu", "Exists")]}]), True, id="exists"),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("rack", "Exists")]}]), False, id="exists-absent"
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("rack", "DoesNotExist")]}]),
            True,
            id="does-not-exist",
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "DoesNotExist")]}]),
            False,
            id="does-not-exist-has",
        ),
        pytest.param(pod(terms=[{"matchExpressions": [expr("cores", "Gt", "8")]}]), True, id="gt"),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("cores", "Gt", "16")]}]), False, id="gt-equal"
        ),
        pytest.param(pod(terms=[{"matchExpressions": [expr("cores", "Lt", "32")]}]), True, id="lt"),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "Lt", "32")]}]),
            False,
            id="lt-not-a-number",
        ),
        pytest.param(
            pod(terms=[{"matchExpressions": [expr("gpu", "Near", "a10")]}]),
            False,
            id="unknown-operator",
        ),
        pytest.param(
            pod({"gpu": "a10"}, [pin("n2")]), False, id="selector-and-affinity-both-count"
        ),
    ],
)
def test_a_node_matches_a_pods_required_selection_as_the_scheduler_matches_it(
    selection: Obj, matched: bool
) -> None:
    assert node_selection.matches(selection, NODE) is matched


@pytest.mark.parametrize(
    ("message", "alone"),
    [
        pytest.param(
            "0/7 nodes are available: 7 node(s) didn't satisfy plugin(s) [NodeAffinity]. no new "
            "claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not "
            "helpful for scheduling.",
            True,
            id="node-unknown-to-the-scheduler",
        ),
        pytest.param(
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
            "2 node(s) didn't satisfy plugin(s) [NodeAffinity]. preemption: 0/3 nodes are "
            "available: 3 Preemption is not helpful for scheduling.",
            True,
            id="filter-and-prefilter-affinity",
        ),
        pytest.param(
            "0/20 nodes are available: 1 node(s) had untolerated taint(s), 19 node(s) didn't "
            "satisfy plugin(s) [NodeAffinity]. preemption: 0/20 nodes are available: 20 "
            "Preemption is not helpful for scheduling.",
            False,
            id="a-taint",
        ),
        pytest.param(
            "0/2 nodes are available: 1 node(s) had untolerated taint "
            "{node.kubernetes.io/not-ready: }, 1 node(s) didn't satisfy plugin(s) "
            "[NodeAffinity].",
            False,
            id="a-dotted-taint-key",
        ),
        pytest.param(
            "0/2 nodes are available: 1 Insufficient nvidia.com/A10", False, id="resources"
        ),
        pytest.param("no nodes available to schedule pods", True, id="no-nodes-at-all"),
        pytest.param("", False, id="no-message"),
        pytest.param("something else entirely", False, id="not-a-scheduler-message"),
    ],
)
def test_the_scheduler_message_tells_whether_node_affinity_was_its_only_reason(
    message: str, alone: bool
) -> None:
    assert node_selection.rejected_for_affinity_alone(message) is alone


def test_the_scheduler_view_lags_only_when_the_node_satisfies_the_pods_selection() -> None:
    message = "0/7 nodes are available: 7 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    assert node_selection.scheduler_view_lags(pod(terms=[pin("n1")]), NODE, message)
    assert not node_selection.scheduler_view_lags(pod({"gpu": "h100"}, [pin("n1")]), NODE, message)
    assert not node_selection.scheduler_view_lags(
        pod(terms=[pin("n1")]), NODE, "0/7 nodes are available: 1 Insufficient cpu."
    )
