"""Why a node's rejection of a pinned launcher pod may still pass (``model.node_rejections``):
lagging lifecycle taints first, then a lagging scheduler, then pods still releasing the
claims' GPUs on the node; nothing of the kind means the rejection is the node's last word.
Nodes and pods are spelt out here as the API shows them."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import pytest

from gpuoperator.model import claims, node_rejections

Obj = dict[str, Any]
A10 = "nvidia.com/GA102GL_A10"
AFFINITY_ONLY = (
    "0/7 nodes are available: 7 node(s) didn't satisfy plugin(s) [NodeAffinity]. no new "
    "claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not helpful "
    "for scheduling."
)
NO_ROOM = f"0/2 nodes are available: 2 Insufficient {A10}."


def node(*, ready: bool = True, taints: Iterable[str] = (), labels: Obj | None = None) -> Obj:
    return {
        "metadata": {"name": "n1", "labels": labels or {"kubernetes.io/hostname": "n1"}},
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(*, selector: Obj | None = None, message: str = "") -> Obj:
    spec: Obj = {"containers": [{"name": "compute"}]}
    if selector is not None:
        spec["nodeSelector"] = selector
    return {
        "metadata": {"name": "virt-launcher-vm1-x", "namespace": "t"},
        "spec": spec,
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ]
        },
    }


def leaving(name: str, resource: str = A10, *, deleting: bool = True, done: bool = False) -> Obj:
    meta: Obj = {"name": name, "namespace": "t"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {resource: "1"}}}],
        },
        "status": {"phase": "Succeeded" if done else "Running"},
    }


def test_a_ready_node_still_tainted_not_ready_defers_the_rejection() -> None:
    why = node_rejections.deferral(
        pod(message=NO_ROOM), NO_ROOM, node(taints=["node.kubernetes.io/not-ready"]), set(), []
    )

    assert why is not None
    assert (why.reason, why.fields) == (
        "NodeTaintsLag",
        {"taints": ["node.kubernetes.io/not-ready"]},
    )


def test_a_node_not_ready_is_not_lagging_behind_its_taint() -> None:
    assert (
        node_rejections.taints_lag(node(ready=False, taints=["node.kubernetes.io/not-ready"]))
        is None
    )
    assert node_rejections.taints_lag(None) is None


def test_a_rejection_for_affinity_alone_on_a_matching_node_waits_for_the_scheduler() -> None:
    why = node_rejections.deferral(pod(message=AFFINITY_ONLY), AFFINITY_ONLY, node(), set(), [])

    assert why is not None
    assert (why.reason, why.fields) == ("SchedulerViewLags", {"scheduler": AFFINITY_ONLY})


def test_a_rejection_for_the_pods_own_node_selection_is_taken() -> None:
    selector = {"zone": "b"}

    assert (
        node_rejections.deferral(pod(selector=selector), AFFINITY_ONLY, node(), set(), []) is None
    )
    assert node_rejections.scheduler_view_lags(pod(), None, AFFINITY_ONLY) is None


def test_pods_still_releasing_the_claims_resource_defer_the_rejection() -> None:
    pods = [
        leaving("old-launcher"),
        leaving("other-resource", "nvidia.com/other"),
        leaving("running", deleting=False),
        leaving("terminated", done=True),
    ]
    before = copy.deepcopy(pods)

    why = node_rejections.deferral(pod(), NO_ROOM, node(), {A10}, pods)

    assert why is not None
    assert (why.reason, why.fields) == ("NodeReleasing", {"pods": ["t/old-launcher"]})
    assert pods == before


def test_lagging_taints_are_named_before_pods_releasing() -> None:
    why = node_rejections.deferral(
        pod(), NO_ROOM, node(taints=["node.kubernetes.io/unschedulable"]), {A10}, [leaving("p")]
    )

    assert why is not None and why.reason == "NodeTaintsLag"


def test_a_rejection_nothing_explains_is_the_nodes_last_word() -> None:
    assert node_rejections.deferral(pod(), NO_ROOM, node(), {A10}, [leaving("p", "x/y")]) is None


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(pod(message=NO_ROOM), NO_ROOM, id="message"),
        pytest.param(pod(), "", id="empty"),
        pytest.param(
            {"status": {"conditions": [{"type": "Ready", "message": "x"}]}}, "", id="other"
        ),
        pytest.param({}, "", id="no-status"),
    ],
)
def test_what_the_scheduler_said(obj: Obj, expected: str) -> None:
    assert node_rejections.said(obj) == expected


def attached(name: str, uid: str = "") -> Obj:
    return {"metadata": {"name": "hold"}, "status": {"attachment": {"vmi": name, "uid": uid}}}


@pytest.mark.parametrize(
    ("claim", "vmis", "expected"),
    [
        pytest.param(attached("vm2", "u2"), {"vm2": "u2"}, "vm2", id="other-live"),
        pytest.param(attached("vm2"), {"vm2": "u9"}, "vm2", id="other-live-without-uid"),
        pytest.param(attached("vm2", "u2"), {"vm2": "u3"}, "", id="other-replaced"),
        pytest.param(attached("vm2", "u2"), {}, "", id="other-gone"),
        pytest.param(attached("vm1", "u0"), {"vm1": "u1"}, "", id="this-vmis-name"),
        pytest.param({"metadata": {"name": "hold"}}, {"vm2": "u2"}, "", id="not-attached"),
    ],
)
def test_another_live_user_of_a_claim(claim: Obj, vmis: dict[str, str], expected: str) -> None:
    def find(name: str) -> Obj | None:
        uid = vmis.get(name)
        return None if uid is None else {"metadata": {"name": name, "uid": uid}}

    assert claims.other_live_user(claim, "vm1", find) == expected
