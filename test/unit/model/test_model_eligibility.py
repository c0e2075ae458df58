"""Node eligibility follows the scheduler's taint rules (docs/design.md §5 "Capacity"): Ready, not
cordoned, every NoSchedule/NoExecute taint tolerated; only the three taints Ready and cordon
decide are skipped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import eligibility
from harness import objects

Obj = dict[str, Any]


def taint(key: str, value: str | None = None, effect: str = "NoSchedule") -> Obj:
    out: Obj = {"key": key, "effect": effect}
    if value is not None:
        out["value"] = value
    return out


def node(
    *,
    ready: str | None = "True",
    unschedulable: bool = False,
    taints: list[Obj] | None = None,
    name: str = "n1",
) -> Obj:
    return objects.node(name, {}, ready=ready, cordoned=unschedulable, taints=taints or None)


def gpu_class(tolerations: list[Obj] | None = None) -> Obj:
    return objects.gpuclass(resource="x.io/g", tolerations=tolerations)


GPU_TAINT = taint("nvidia.com/gpu", "present")


@pytest.mark.parametrize(
    ("toleration", "taint_", "expected"),
    [
        pytest.param({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT, True, id="exists"),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"},
            GPU_TAINT,
            True,
            id="equal-same-value",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "value": "present"},
            GPU_TAINT,
            True,
            id="operator-defaults-to-equal",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "value": "absent"},
            GPU_TAINT,
            False,
            id="default-equal-other-value",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
            GPU_TAINT,
            False,
            id="equal-other-value",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal"},
            GPU_TAINT,
            False,
            id="equal-empty-value-vs-value",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal"},
            taint("nvidia.com/gpu"),
            True,
            id="equal-empty-value-vs-no-value",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": ""},
            taint("nvidia.com/gpu", None),
            True,
            id="empty-and-missing-value-are-equal",
        ),
        pytest.param({"key": "other", "operator": "Exists"}, GPU_TAINT, False, id="other-key"),
        pytest.param({"operator": "Exists"}, GPU_TAINT, True, id="empty-key-exists-matches-all"),
        pytest.param(
            {"key": "", "operator": "Exists", "effect": "NoExecute"},
            GPU_TAINT,
            False,
            id="empty-key-exists-other-effect",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            GPU_TAINT,
            True,
            id="same-effect",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
            GPU_TAINT,
            False,
            id="other-effect",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": ""},
            taint("nvidia.com/gpu", "present", "NoExecute"),
            True,
            id="empty-effect-matches-all",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"},
            GPU_TAINT,
            False,
            id="prefer-does-not-tolerate-noschedule",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Lt", "value": "present"},
            GPU_TAINT,
            False,
            id="unknown-operator-tolerates-nothing",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "exists"},
            GPU_TAINT,
            False,
            id="operator-is-case-sensitive",
        ),
    ],
)
def test_toleration_tolerates(toleration: Obj, taint_: Obj, expected: bool) -> None:
    assert eligibility.toleration_tolerates(toleration, taint_) is expected


@pytest.mark.parametrize(
    ("taints", "tolerations", "expected"),
    [
        pytest.param([], [], [], id="no-taints"),
        pytest.param([GPU_TAINT], [], [GPU_TAINT], id="noschedule-counts"),
        pytest.param(
            [taint("dedicated", "x", "NoExecute")],
            [],
            [taint("dedicated", "x", "NoExecute")],
            id="noexecute-counts",
        ),
        pytest.param([taint("soft", None, "PreferNoSchedule")], [], [], id="prefer-ignored"),
        pytest.param([taint("node.kubernetes.io/unschedulable")], [], [], id="skip-unschedulable"),
        pytest.param(
            [taint("node.kubernetes.io/not-ready", None, "NoExecute")],
            [],
            [],
            id="skip-not-ready",
        ),
        pytest.param(
            [taint("node.kubernetes.io/unreachable", None, "NoExecute")],
            [],
            [],
            id="skip-unreachable",
        ),
        pytest.param(
            [taint("node.kubernetes.io/disk-pressure")],
            [],
            [taint("node.kubernetes.io/disk-pressure")],
            id="disk-pressure-counts",
        ),
        pytest.param(
            [taint("node.kubernetes.io/memory-pressure")],
            [],
            [taint("node.kubernetes.io/memory-pressure")],
            id="memory-pressure-counts",
        ),
        pytest.param(
            [taint("node.kubernetes.io/network-unavailable")],
            [],
            [taint("node.kubernetes.io/network-unavailable")],
            id="network-unavailable-counts",
        ),
        pytest.param(
            [taint("node.kubernetes.io/unschedulable-not")],
            [],
            [taint("node.kubernetes.io/unschedulable-not")],
            id="skip-is-exact",
        ),
        pytest.param(
            [GPU_TAINT, taint("b"), taint("a")],
            [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            [taint("b"), taint("a")],
            id="node-order-kept",
        ),
        pytest.param(
            [GPU_TAINT, taint("b")],
            [{"operator": "Exists"}],
            [],
            id="wildcard-tolerates-all",
        ),
    ],
)
def test_untolerated_taints(taints: list[Obj], tolerations: list[Obj], expected: list[Obj]) -> None:
    assert eligibility.untolerated_taints(taints, tolerations) == expected


@pytest.mark.parametrize(
    ("node_", "ready"),
    [
        pytest.param(node(ready="True"), True, id="true"),
        pytest.param(node(ready="False"), False, id="false"),
        pytest.param(node(ready="Unknown"), False, id="unknown"),
        pytest.param(node(ready=None), False, id="no-condition"),
        pytest.param({"metadata": {"name": "n"}}, False, id="no-status"),
        pytest.param(
            {"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}},
            False,
            id="other-condition",
        ),
    ],
)
def test_node_ready(node_: Obj, ready: bool) -> None:
    assert eligibility.node_ready(node_) is ready


@pytest.mark.parametrize(
    ("node_", "cordoned", "schedulable"),
    [
        pytest.param(node(), False, True, id="ready-uncordoned"),
        pytest.param(node(unschedulable=True), True, False, id="cordoned"),
        pytest.param(node(ready="False"), False, False, id="not-ready"),
        pytest.param({"spec": {"unschedulable": False}}, False, False, id="explicit-false"),
    ],
)
def test_node_cordoned_and_schedulable(node_: Obj, cordoned: bool, schedulable: bool) -> None:
    assert eligibility.node_cordoned(node_) is cordoned
    assert eligibility.node_schedulable(node_) is schedulable


NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
CORDON_TAINT = "node.kubernetes.io/unschedulable"


@pytest.mark.parametrize(
    ("node_", "lagging"),
    [
        pytest.param(
            node(taints=[taint(NOT_READY_TAINT)]), [NOT_READY_TAINT], id="ready-not-ready"
        ),
        pytest.param(
            node(taints=[taint(UNREACHABLE_TAINT, effect="NoExecute")]),
            [UNREACHABLE_TAINT],
            id="ready-unreachable",
        ),
        pytest.param(node(taints=[taint(CORDON_TAINT)]), [CORDON_TAINT], id="uncordoned"),
        pytest.param(node(ready="False", taints=[taint(NOT_READY_TAINT)]), [], id="not-ready"),
        pytest.param(node(ready="Unknown", taints=[taint(UNREACHABLE_TAINT)]), [], id="unknown"),
        pytest.param(node(unschedulable=True, taints=[taint(CORDON_TAINT)]), [], id="cordoned"),
        pytest.param(
            node(taints=[taint(NOT_READY_TAINT, effect="PreferNoSchedule")]), [], id="preference"
        ),
        pytest.param(node(taints=[taint("gpu.example.com/dedicated")]), [], id="other-taint"),
        pytest.param(node(), [], id="no-taints"),
    ],
)
def test_lagging_taints_are_the_lifecycle_taints_the_nodes_state_no_longer_calls_for(
    node_: Obj, lagging: list[str]
) -> None:
    assert eligibility.lagging_taints(node_) == lagging


@pytest.mark.parametrize(
    ("node_", "tolerations", "reasons"),
    [
        pytest.param(node(), None, [], id="plain-node-eligible"),
        pytest.param(node(ready="False"), None, ["NotReady"], id="not-ready"),
        pytest.param(node(unschedulable=True), None, ["Cordoned"], id="cordoned"),
        pytest.param(
            node(taints=[GPU_TAINT]),
            None,
            ["taint nvidia.com/gpu=present:NoSchedule not tolerated"],
            id="gpu-taint-untolerated",
        ),
        pytest.param(
            node(taints=[GPU_TAINT]),
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            [],
            id="gpu-taint-tolerated",
        ),
        pytest.param(
            node(taints=[taint("dedicated", None, "NoExecute")]),
            None,
            ["taint dedicated:NoExecute not tolerated"],
            id="taint-without-value",
        ),
        pytest.param(
            node(
                ready="Unknown",
                unschedulable=True,
                taints=[
                    taint("node.kubernetes.io/unreachable", None, "NoExecute"),
                    taint("node.kubernetes.io/unschedulable"),
                    taint("node.kubernetes.io/disk-pressure"),
                    GPU_TAINT,
                ],
            ),
            [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            [
                "NotReady",
                "Cordoned",
                "taint node.kubernetes.io/disk-pressure:NoSchedule not tolerated",
            ],
            id="all-reasons-in-order",
        ),
    ],
)
def test_eligibility(node_: Obj, tolerations: list[Obj] | None, reasons: list[str]) -> None:
    cls = gpu_class(tolerations)
    assert eligibility.reasons(node_, cls) == reasons
    assert eligibility.is_eligible(node_, cls) is (not reasons)


def test_ineligibility_reasons_are_the_user_facing_words() -> None:
    assert eligibility.Ineligibility.NOT_READY.value == "NotReady"
    assert eligibility.Ineligibility.CORDONED.value == "Cordoned"
    assert eligibility.reasons(node(ready="False", unschedulable=True), gpu_class()) == [
        eligibility.Ineligibility.NOT_READY.value,
        eligibility.Ineligibility.CORDONED.value,
    ]


# -- properties ----------------------------------------------------------------------------

KEYS = ["nvidia.com/gpu", "dedicated", "node.kubernetes.io/disk-pressure", ""]
VALUES = ["", "present", "x"]
EFFECTS = ["NoSchedule", "NoExecute", "PreferNoSchedule"]

taints_st = st.builds(
    lambda k, v, e: {"key": k or "k", "value": v, "effect": e},
    st.sampled_from(KEYS),
    st.sampled_from(VALUES),
    st.sampled_from(EFFECTS),
)
tolerations_st = st.builds(
    lambda k, op, v, e: {
        "key": k,
        "operator": op,
        "value": "" if op == "Exists" else v,
        "effect": e,
    },
    st.sampled_from(KEYS),
    st.sampled_from(["Exists", "Equal", ""]),
    st.sampled_from(VALUES),
    st.sampled_from([*EFFECTS, ""]),
)
nodes_st = st.builds(
    lambda name, ready, cordoned, taints: node(
        name=name, ready=ready, unschedulable=cordoned, taints=taints
    ),
    st.sampled_from(["n1", "n2", "n3"]),
    st.sampled_from(["True", "False", None]),
    st.booleans(),
    st.lists(taints_st, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(nodes_st, max_size=6),
    st.lists(tolerations_st, max_size=3),
    tolerations_st,
)
def test_a_toleration_added_never_makes_fewer_nodes_eligible(
    nodes: list[Obj], tolerations: list[Obj], added: Obj
) -> None:
    before = [eligibility.is_eligible(n, gpu_class(tolerations)) for n in nodes]
    after = [eligibility.is_eligible(n, gpu_class([*tolerations, added])) for n in nodes]
    assert all(a or not b for b, a in zip(before, after, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(taints_st, max_size=4), st.lists(tolerations_st, max_size=3))
def test_untolerated_taints_are_exactly_the_counted_taints_no_toleration_matches(
    taints: list[Obj], tolerations: list[Obj]
) -> None:
    untolerated = eligibility.untolerated_taints(taints, tolerations)
    for t in taints:
        counted = t["effect"] in ("NoSchedule", "NoExecute")
        tolerated = any(eligibility.toleration_tolerates(tol, t) for tol in tolerations)
        assert (t in untolerated) is (counted and not tolerated)
