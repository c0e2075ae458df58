"""Which pods the placement controller acts on (``model.launcher_pods``): a gated launcher
or temporary pod waits for its pin; an ungated one kube-scheduler reports Unschedulable may
be rejected by its node, and so may a migration target; pods being deleted, scheduled pods
and pods merely waiting for the gate are none of its business. The pods are spelt out here, field by
field, as KubeVirt and kube-scheduler write them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuoperator.model import launcher_pods

Obj = dict[str, Any]
GATE = "gpu.cozystack.io/placement"


def pod(
    *,
    gated: bool = True,
    reason: str = "SchedulingGated",
    status: str = "False",
    node: str = "",
    deleting: bool = False,
    migration: bool = False,
    ephemeral: bool = False,
) -> Obj:
    labels = {"kubevirt.io": "virt-launcher", "gpu.cozystack.io/claims": "true"}
    if migration:
        labels["kubevirt.io/migrationJobUID"] = "mig-1"
    meta: Obj = {"name": "virt-launcher-vm1-x", "namespace": "t", "labels": labels}
    if ephemeral:
        meta["annotations"] = {"kubevirt.io/ephemeral-provisioning": "true"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: Obj = {"containers": [{"name": "compute"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "other.example.com/gate"}, {"name": GATE}]
    if node:
        spec["nodeName"] = node
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"conditions": [{"type": "PodScheduled", "status": status, "reason": reason}]},
    }


#: An ungated pod kube-scheduler reports unschedulable.
UNPLACED: Obj = {"gated": False, "reason": "Unschedulable"}

NEEDS_PIN = {
    "gated-launcher": pod(),
    "gated-temporary-pod": pod(ephemeral=True),
    "gated-migration-target": pod(migration=True),
}
MAYBE_REJECTED = {
    "unschedulable-launcher": pod(**UNPLACED),
    "unschedulable-temporary-pod": pod(**UNPLACED, ephemeral=True),
    "unschedulable-migration-target": pod(**UNPLACED, migration=True),
}
NEITHER = {
    "ungated-not-yet-judged": pod(gated=False, reason=""),
    "scheduled-condition-true": pod(**UNPLACED, status="True"),
    "bound-to-node": pod(**UNPLACED, node="n1"),
    "gated-being-deleted": pod(deleting=True),
    "unschedulable-being-deleted": pod(**UNPLACED, deleting=True),
    "target-being-deleted": pod(migration=True, deleting=True),
}


@pytest.mark.parametrize(
    ("obj", "gated", "rejected"),
    [pytest.param(p, True, False, id=i) for i, p in NEEDS_PIN.items()]
    + [pytest.param(p, False, True, id=i) for i, p in MAYBE_REJECTED.items()]
    + [pytest.param(p, False, False, id=i) for i, p in NEITHER.items()],
)
def test_which_pods_placement_acts_on(obj: Obj, gated: bool, rejected: bool) -> None:
    before = copy.deepcopy(obj)

    assert launcher_pods.needs_pin(obj) is gated
    assert launcher_pods.maybe_rejected(obj) is rejected
    assert launcher_pods.watched(obj) is (gated or rejected)
    assert obj == before


def test_a_pod_gated_by_others_only_is_not_waiting_for_its_pin() -> None:
    obj = pod()
    obj["spec"]["schedulingGates"] = [{"name": "other.example.com/gate"}]

    assert not launcher_pods.needs_pin(obj)
    assert not launcher_pods.watched(obj)


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param(
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}], True
        ),
        pytest.param(
            [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}], False
        ),
        pytest.param([{"type": "Ready", "status": "False", "reason": "Unschedulable"}], False),
        pytest.param([], False),
        pytest.param(None, False),
    ],
)
def test_unschedulable_is_the_schedulers_word_on_pod_scheduled(
    conditions: list[Obj] | None, expected: bool
) -> None:
    assert launcher_pods.is_unschedulable({"status": {"conditions": conditions}}) is expected


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        pytest.param(
            {
                "labels": {"vm.kubevirt.io/name": "by-label"},
                "ownerReferences": [
                    {
                        "apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstance",
                        "name": "by-owner",
                        "uid": "u1",
                        "controller": True,
                    }
                ],
            },
            "by-owner",
            id="controller-owner-first",
        ),
        pytest.param({"labels": {"vm.kubevirt.io/name": "by-label"}}, "by-label", id="label"),
        pytest.param({"labels": {}}, "", id="neither"),
        pytest.param({}, "", id="no-labels"),
    ],
)
def test_the_vmi_a_pod_names(meta: Obj, expected: str) -> None:
    assert launcher_pods.vmi_name_of({"metadata": meta}) == expected
