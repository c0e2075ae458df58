"""Node rejections (``controllers.node_rejections``): a pinned pod its node rejects is
deleted and the rejection recorded with expiry on the set's claims; the rejection waits
while the node releases GPUs, its lifecycle taints lag or kube-scheduler has not seen it; a
pod placed before its deletion keeps its claims bound; a claim write that loses a race is
recorded on the next look; claims of another live VM are left alone."""

from __future__ import annotations

import copy

import pykube
import pytest

from controllers import node_rejections, placement
from gpuoperator.model import slimming
from harness import objects
from harness import vm_controllers as vm


def refused_world(world: vm.World) -> vm.Obj:
    vm.bound_set(world)
    return world.put_pod(vm.launcher_pod(gated=False, pinned_to="n1", unschedulable=True))


def test_refused_pinned_pod_records_the_refusal_and_is_deleted(world: vm.World) -> None:
    pod = refused_world(world)

    assert world.placement().reconcile(vm.POD) is None

    writes = world.api.writes()
    statuses = {c[2]: c[3]["status"] for c in writes if c[0] == "replace_status"}
    assert set(statuses) == {"hold-a", "vm1-gpu-1"}
    for status in statuses.values():
        assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2026-01-01T00:10:00Z"}]
        assert status["phase"] == "Pending"
        assert "nodeName" not in status
        bound = next(c for c in status["conditions"] if c["type"] == "Bound")
        assert (bound["status"], bound["reason"]) == ("False", "RefusedByNode")
    assert statuses["hold-a"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}
    # The pod went first, as it was read (its UID and resourceVersion as preconditions), and
    # only then were the claims unbound.
    assert writes[0] == (
        "delete",
        "Pod",
        vm.POD[1],
        {"uid": f"uid-{vm.POD[1]}", "resourceVersion": pod["metadata"]["resourceVersion"]},
    )
    assert ("Pod", vm.NS, vm.POD[1]) not in world.api.objects
    # The ledger released n1 at once.
    assert vm.free_units(world, "n1") == 4
    assert world.recorder.reasons().count("RefusedByNode") == 3  # two claims and the VMI
    assert world.recorder.events[-1]["kind"] == "VirtualMachineInstance"


def test_refusal_waits_while_the_node_releases_gpus(world: vm.World) -> None:
    refused_world(world)
    leaving = vm.launcher_pod(name="virt-launcher-vm1-old", gated=False)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    leaving["spec"]["nodeName"] = "n1"
    leaving["status"] = {"phase": "Running"}
    world.put_pod(leaving)
    controller = world.placement()

    wait = vm.requeue(controller.reconcile(vm.POD))
    assert wait is not None
    assert 0 < wait <= node_rejections.SETTLE
    assert world.api.writes() == []

    world.clock.advance(node_rejections.SETTLE)
    assert controller.reconcile(vm.POD) is None
    assert world.api.writes()[0][0] == "delete"


def test_a_refused_pod_the_scheduler_places_before_its_deletion_keeps_its_claims_bound(
    world: vm.World,
) -> None:
    """kube-scheduler retries a refused pod by itself: one placed between the look and the
    deletion runs where its claims are bound, so neither the pod nor the claims are touched."""
    refused_world(world)

    def scheduled_meanwhile(read: vm.Obj) -> None:
        placed = copy.deepcopy(read)
        placed["spec"]["nodeName"] = "n1"
        placed["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        world.api.add(pykube.Pod, placed)

    world.api.after_get[vm.POD[1]] = scheduled_meanwhile
    controller = world.placement()

    assert vm.requeue(controller.reconcile(vm.POD)) == placement.RETRY

    assert [w[0] for w in world.api.writes()] == ["delete"]  # refused by its precondition
    assert world.api.stored(pykube.Pod, vm.POD[1], vm.NS) is not None
    for name in ("hold-a", "vm1-gpu-1"):
        stored = world.api.objects[("GPUClaim", vm.NS, name)]
        assert stored["status"]["phase"] == "Bound"
        assert stored["status"]["nodeName"] == "n1"
        assert "refusedNodes" not in stored["status"]
    assert "RefusedByNode" not in world.recorder.reasons()
    assert vm.free_units(world, "n1") == 1  # the set's 3 units stay held on n1

    # Looked at again, the pod is scheduled: nothing more to do.
    assert controller.reconcile(vm.POD) is None
    assert [w[0] for w in world.api.writes()] == ["delete"]


def test_a_refusal_whose_claim_write_loses_a_race_is_recorded_on_the_next_look(
    world: vm.World,
) -> None:
    refused_world(world)
    world.api.conflict_next.add("replace_status")
    controller = world.placement()

    assert vm.requeue(controller.reconcile(vm.POD)) == placement.RETRY
    assert ("Pod", vm.NS, vm.POD[1]) not in world.api.objects
    world.caches.pods.store.remove(vm.POD)  # the watch delivers the deletion

    assert controller.reconcile(vm.POD) is None

    for name in ("hold-a", "vm1-gpu-1"):
        status = world.api.objects[("GPUClaim", vm.NS, name)]["status"]
        assert status["phase"] == "Pending"
        assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2026-01-01T00:10:00Z"}]
    assert world.recorder.events[-1]["kind"] == "VirtualMachineInstance"
    assert controller.reconcile(vm.POD) is None  # nothing owed any more
    assert world.recorder.reasons().count("RefusedByNode") == 3


def test_refusal_waits_while_the_nodes_lifecycle_taint_lags_behind_its_ready_state(
    world: vm.World,
) -> None:
    refused_world(world)
    lagging = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    world.caches.nodes.store.put(slimming.slim_node(objects.node("n1", 4, taints=[lagging])))
    controller = world.placement()

    wait = vm.requeue(controller.reconcile(vm.POD))
    assert wait is not None
    assert 0 < wait <= node_rejections.SETTLE
    assert world.api.writes() == []

    world.caches.nodes.store.put(slimming.slim_node(objects.node("n1", 4, taints=[])))
    assert controller.reconcile(vm.POD) is None
    assert world.api.writes()[0][0] == "delete"


#: What kube-scheduler said on a launcher pod pinned to a node its cache did not hold yet
#: (its node informer was catching up after an API server restart).
UNSEEN_NODE = (
    "0/7 nodes are available: 7 node(s) didn't satisfy plugin(s) [NodeAffinity]. no new "
    "claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not helpful "
    "for scheduling."
)


def refused_for(world: vm.World, message: str, node_selector: dict[str, str] | None = None) -> None:
    """A pinned launcher pod kube-scheduler refused with ``message``; n1 in the node cache."""
    vm.bound_set(world)
    pod = vm.launcher_pod(gated=False, pinned_to="n1", unschedulable=True)
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    scheduled["message"] = message
    if node_selector is not None:
        pod["spec"]["nodeSelector"] = node_selector
    world.put_pod(pod)
    n1 = objects.node("n1", 4, labels={"kubernetes.io/hostname": "n1", "gpu": "a10"})
    world.caches.nodes.store.put(slimming.slim_node(n1))


def test_refusal_waits_while_the_scheduler_has_not_seen_the_node(world: vm.World) -> None:
    """Node affinity as the scheduler's only reason, on a node that satisfies the pod's node
    selection: the scheduler's cache lacks the node; it places the pod once the node is there."""
    refused_for(world, UNSEEN_NODE)
    controller = world.placement()

    wait = vm.requeue(controller.reconcile(vm.POD))
    assert wait is not None
    assert 0 < wait <= node_rejections.SETTLE
    assert world.api.writes() == []
    assert "RefusedByNode" not in world.recorder.reasons()

    world.clock.advance(node_rejections.SETTLE)
    assert controller.reconcile(vm.POD) is None
    assert world.api.writes()[0][0] == "delete"


@pytest.mark.parametrize(
    ("message", "node_selector"),
    [
        pytest.param(UNSEEN_NODE, {"gpu": "h100"}, id="the-pods-own-node-selector"),
        pytest.param(
            "0/7 nodes are available: 1 Insufficient cpu, 6 node(s) didn't satisfy plugin(s) "
            "[NodeAffinity]. preemption: 0/7 nodes are available: 7 Preemption is not helpful "
            "for scheduling.",
            None,
            id="another-reason",
        ),
    ],
)
def test_a_refusal_the_scheduler_meant_is_taken_at_once(
    world: vm.World, message: str, node_selector: dict[str, str] | None
) -> None:
    refused_for(world, message, node_selector)

    assert world.placement().reconcile(vm.POD) is None

    assert world.api.writes()[0][0] == "delete"
    assert world.recorder.reasons().count("RefusedByNode") == 3


def test_refused_pod_keeps_the_binding_of_a_claim_another_vm_uses(world: vm.World) -> None:
    refused_world(world)
    world.put_vmi(vm.vmi(name="vm2", uid="uid-vm2"))
    world.put_claim(
        vm.claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm2", "uid": "uid-vm2"})
    )

    world.placement().reconcile(vm.POD)

    written = [c[2] for c in world.api.writes() if c[0] == "replace_status"]
    assert written == ["vm1-gpu-1"]


def test_unschedulable_pod_the_operator_did_not_pin_is_left_alone(world: vm.World) -> None:
    vm.bound_set(world)
    world.put_pod(vm.launcher_pod(gated=False, unschedulable=True))

    assert world.placement().reconcile(vm.POD) is None
    assert world.api.writes() == []
