"""Placement (``controllers.placement``): pin and ungate in one write when the set is on
one node, waiting while it is not bound, gathering a split set where it fits, a pod pinned
by this replica not judged again while the cache lags, a migration target pinned to its
claims' transient holds' node and nowhere else, and deleted, without unbinding, when that node
refuses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pykube
import pytest

from controllers import placement
from gpuoperator.model import launcher_pods
from gpuoperator.runtime import errors
from harness import objects
from harness import vm_controllers as vm


def test_pod_is_pinned_and_ungated_in_one_write(world: vm.World) -> None:
    vm.bound_set(world)
    pod = world.put_pod(vm.launcher_pod())

    assert world.placement().reconcile(vm.POD) is None

    [write] = world.api.writes()
    verb, kind, name, payload = write
    assert (verb, kind, name) == ("patch", "Pod", vm.POD[1])
    body = payload["body"]
    assert body["metadata"] == {"resourceVersion": pod["metadata"]["resourceVersion"]}
    assert body["spec"]["schedulingGates"] == [{"name": "other.example.com/gate"}]
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
    assert "podAntiAffinity" in body["spec"]["affinity"]  # cached with the gated pod, kept
    assert [c[0] for c in world.api.calls] == ["patch"]  # built from the cache, nothing read
    pinned = world.api.objects[("Pod", vm.NS, vm.POD[1])]
    assert launcher_pods.pinned_node(pinned) == "n1"
    assert not launcher_pods.is_gated(pinned)
    event = world.recorder.events[-1]
    assert (event["reason"], event["kind"], event["name"]) == ("Pinned", "Pod", vm.POD[1])


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        pytest.param(
            lambda w: w.put_claim(vm.claim("hold-a", phase="Pending", attached=vm.OURS)),
            "hold-a is Pending",
            id="pending",
        ),
        pytest.param(
            lambda w: w.put_claim(vm.claim("hold-a", phase="Bound", node="n1", attached=vm.OURS)),
            "vm1-gpu-1 does not exist yet",
            id="template-claim-missing",
        ),
        pytest.param(
            lambda w: w.put_claim(vm.claim("hold-a", phase="Bound", node="n1")),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-not-attached-yet",
        ),
        pytest.param(
            lambda w: w.put_claim(
                vm.claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm1", "uid": "old"})
            ),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-attached-to-an-earlier-vmi-of-this-name",
        ),
        pytest.param(
            lambda w: w.put_claim(
                vm.claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm1"})
            ),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-attachment-without-uid",
        ),
    ],
)
def test_pod_waits_gated_until_every_claim_is_bound(
    world: vm.World, setup: Callable[[vm.World], Any], words: str
) -> None:
    world.put_vmi(vm.vmi())
    setup(world)
    world.put_pod(vm.launcher_pod())
    controller = world.placement()

    assert vm.requeue(controller.reconcile(vm.POD)) == placement.WAIT_RECHECK
    assert vm.requeue(controller.reconcile(vm.POD)) == placement.WAIT_RECHECK

    assert world.api.calls == []  # not even a read of the pod
    assert world.recorder.reasons() == ["WaitingForPlacement"]  # once per message
    assert words in world.recorder.events[0]["message"]


def test_pod_waits_while_a_claim_is_attached_to_another_live_vm(world: vm.World) -> None:
    world.put_vmi(vm.vmi())
    world.put_vmi(vm.vmi(name="vm2", uid="uid-vm2"))
    world.put_claim(
        vm.claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm2", "uid": "uid-vm2"})
    )
    world.put_claim(vm.claim("vm1-gpu-1", count=2, phase="Bound", node="n1", owner_uid=vm.VMI_UID))
    world.put_pod(vm.launcher_pod())

    assert vm.requeue(world.placement().reconcile(vm.POD)) == placement.WAIT_RECHECK
    assert world.api.writes() == []
    assert (
        "attached to VM instance vm2, which still exists; this VM instance waits"
        in (world.recorder.events[-1]["message"])
    )


def test_pod_waits_for_its_own_template_claim_not_an_earlier_vmis(world: vm.World) -> None:
    world.put_vmi(vm.vmi())
    world.put_claim(vm.claim("hold-a", phase="Bound", node="n1"))
    world.put_claim(vm.claim("vm1-gpu-1", count=2, phase="Bound", node="n1", owner_uid="uid-old"))
    world.put_pod(vm.launcher_pod())

    assert vm.requeue(world.placement().reconcile(vm.POD)) == placement.WAIT_RECHECK
    assert world.api.writes() == []


def test_split_set_is_gathered_where_it_fits_then_pinned(world: vm.World) -> None:
    vm.bound_set(world, hold_node="n1", template_node="n2")
    world.put_pod(vm.launcher_pod())
    controller = world.placement()

    assert vm.requeue(controller.reconcile(vm.POD)) == placement.WAIT_RECHECK

    [(verb, _kind, name, moved)] = world.api.writes()
    assert (verb, name) == ("replace_status", "hold-a")  # the smaller share moves
    assert moved["status"]["nodeName"] == "n2"
    assert moved["status"]["phase"] == "Bound"
    assert moved["status"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}
    bound = next(c for c in moved["status"]["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"]) == ("True", "Moved")
    assert vm.free_units(world, "n2") == 1
    assert vm.free_units(world, "n1") == 4
    assert "Moved" in world.recorder.reasons()

    world.sync_claim("hold-a")
    assert controller.reconcile(vm.POD) is None
    assert launcher_pods.pinned_node(world.api.objects[("Pod", vm.NS, vm.POD[1])]) == "n2"


def test_split_set_that_fits_nowhere_waits_gated(world: vm.World) -> None:
    vm.bound_set(world, hold_node="n1", template_node="n2")
    # Fill both nodes: n1 keeps 1 free (needs 2 for the template), n2 keeps 0 (needs 1).
    world.put_claim(vm.claim("big-1", count=2, phase="Bound", node="n1"))
    world.put_claim(vm.claim("big-2", count=1, phase="Bound", node="n1"))
    world.put_claim(vm.claim("big-3", count=2, phase="Bound", node="n2"))
    world.put_pod(vm.launcher_pod())

    assert vm.requeue(world.placement().reconcile(vm.POD)) == placement.WAIT_RECHECK

    assert world.api.writes() == []
    event = world.recorder.events[-1]
    assert (event["type"], event["reason"]) == ("Warning", "WaitingForPlacement")
    assert "different nodes" in event["message"]
    assert f"1 unit of {vm.A10} needed, 0 free" in event["message"]


def test_split_set_is_not_moved_to_a_node_a_claim_refused(world: vm.World) -> None:
    vm.bound_set(world, hold_node="n1", template_node="n2")
    refused = world.caches.claims.store.get((vm.NS, "hold-a"))
    assert refused is not None
    world.put_claim(
        {
            **refused,
            "status": {
                **refused["status"],
                "refusedNodes": [{"nodeName": "n2", "until": "2026-01-01T00:05:00Z"}],
            },
        }
    )
    world.put_pod(vm.launcher_pod())

    world.placement().reconcile(vm.POD)

    # n2 is skipped for hold-a; the template claim moves to n1 instead (n1 has 3 free).
    [(verb, _kind, name, moved)] = world.api.writes()
    assert (verb, name, moved["status"]["nodeName"]) == ("replace_status", "vm1-gpu-1", "n1")


def test_pin_on_a_stale_cache_reads_the_pod_and_pins_it_at_once(world: vm.World) -> None:
    vm.bound_set(world)
    world.put_pod(vm.launcher_pod())
    newer = world.api.stored(pykube.Pod, vm.POD[1], vm.NS)
    assert newer is not None
    newer["metadata"]["labels"]["example.com/changed"] = "yes"
    world.api.add(pykube.Pod, newer)  # the API server is one version ahead of the cache

    assert world.placement().reconcile(vm.POD) is None

    assert [c[0] for c in world.api.calls] == ["patch", "get", "patch"]
    pinned = world.api.objects[("Pod", vm.NS, vm.POD[1])]
    assert launcher_pods.pinned_node(pinned) == "n1"
    assert not launcher_pods.is_gated(pinned)
    assert pinned["metadata"]["labels"]["example.com/changed"] == "yes"


def test_pin_that_loses_a_race_looks_again(world: vm.World) -> None:
    vm.bound_set(world)
    world.put_pod(vm.launcher_pod())
    world.api.refuse[("patch", vm.NS)] = errors.ConflictError(409, "Conflict", "modified")

    assert vm.requeue(world.placement().reconcile(vm.POD)) == placement.RETRY
    assert [c[0] for c in world.api.calls] == ["patch", "get", "patch"]
    assert world.recorder.events == []


def test_a_pinned_pod_is_not_judged_again_while_the_cache_lags(world: vm.World) -> None:
    vm.bound_set(world)
    world.put_pod(vm.launcher_pod())
    controller = world.placement()
    assert controller.reconcile(vm.POD) is None
    calls = len(world.api.calls)

    # A claim's update brings the pod back while the cache still shows it gated.
    assert controller.reconcile(vm.POD) is None
    assert len(world.api.calls) == calls

    # Once the cache has the pinned pod, nothing is remembered of it; a new pod of the
    # same name (another uid) is judged afresh.
    controller.seen_unwatched(vm.POD)
    world.put_pod(vm.launcher_pod() | {"metadata": {**vm.launcher_pod()["metadata"], "uid": "u2"}})
    assert controller.reconcile(vm.POD) is None
    assert len(world.api.calls) == calls + 1


# -- migration targets (docs/design.md §5 "Live migration") -----------------------------------

TARGET = (vm.NS, "virt-launcher-vm1-tgt")


def migrating_set(world: vm.World, holds: dict[str, vm.Obj | None]) -> None:
    """The VM vm1 running on n1 with its set bound there; ``holds`` gives each claim's
    ``status.migration`` (``None``: none)."""
    running = vm.vmi(phase="Running")
    running["status"]["nodeName"] = "n1"
    world.put_vmi(running)
    for name, count, extra in (
        ("hold-a", 1, {"attached": vm.OURS}),
        ("vm1-gpu-1", 2, {"owner_uid": vm.VMI_UID}),
    ):
        hold = holds.get(name)
        status = {"migration": hold} if hold is not None else None
        world.put_claim(
            vm.claim(name, count=count, phase="Bound", node="n1", status=status, **extra)
        )


def hold_on(node: str, uid: str = "mig-1") -> vm.Obj:
    return {"uid": uid, "targetNode": node}


def test_a_gated_target_is_pinned_to_its_transient_holds_node(world: vm.World) -> None:
    migrating_set(world, {"hold-a": hold_on("n2"), "vm1-gpu-1": hold_on("n2")})
    world.put_pod(vm.launcher_pod(name=TARGET[1], migration=True))

    assert world.placement().reconcile(TARGET) is None

    [(verb, kind, name, payload)] = world.api.writes()
    assert (verb, kind, name) == ("patch", "Pod", TARGET[1])
    assert payload["body"]["spec"]["schedulingGates"] == [{"name": "other.example.com/gate"}]
    stored = world.api.objects[("Pod", vm.NS, TARGET[1])]
    assert launcher_pods.pinned_node(stored) == "n2"
    assert not launcher_pods.is_gated(stored)
    event = world.recorder.events[-1]
    assert (event["reason"], event["name"]) == ("Pinned", TARGET[1])
    assert "pinned to node n2, where the transient holds of migration mig-1" in event["message"]
    # The claims are not touched: the source keeps its units until the migration ends.
    for claim in ("hold-a", "vm1-gpu-1"):
        assert world.api.objects[("GPUClaim", vm.NS, claim)]["status"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    ("holds", "words"),
    [
        pytest.param({}, "claim hold-a has no transient hold for migration mig-1", id="none"),
        pytest.param(
            {"hold-a": hold_on("n2")}, "claim vm1-gpu-1 has no transient hold", id="one-of-two"
        ),
        pytest.param(
            {"hold-a": hold_on("n2", "mig-0"), "vm1-gpu-1": hold_on("n2", "mig-0")},
            "is of migration mig-0, not of this target's migration mig-1",
            id="another-migrations",
        ),
        pytest.param(
            {"hold-a": hold_on("n1"), "vm1-gpu-1": hold_on("n1")},
            "never pinned to the source",
            id="the-source-node",
        ),
    ],
)
def test_a_gated_target_waits_gated_until_its_own_transient_holds_exist(
    world: vm.World, holds: dict[str, vm.Obj | None], words: str
) -> None:
    migrating_set(world, holds)
    world.put_pod(vm.launcher_pod(name=TARGET[1], migration=True))
    controller = world.placement()

    assert vm.requeue(controller.reconcile(TARGET)) == placement.WAIT_RECHECK
    assert vm.requeue(controller.reconcile(TARGET)) == placement.WAIT_RECHECK

    assert world.api.calls == []  # nothing written, not even a read
    assert world.recorder.reasons() == ["WaitingForPlacement"]
    assert words in world.recorder.events[0]["message"]


def test_a_target_waits_like_a_launcher_pod_while_a_claim_is_not_the_vms(
    world: vm.World,
) -> None:
    migrating_set(world, {"hold-a": hold_on("n2"), "vm1-gpu-1": hold_on("n2")})
    world.put_claim(
        vm.claim("hold-a", phase="Bound", node="n1", status={"migration": hold_on("n2")})
    )
    world.put_pod(vm.launcher_pod(name=TARGET[1], migration=True))

    assert vm.requeue(world.placement().reconcile(TARGET)) == placement.WAIT_RECHECK
    assert world.api.writes() == []
    assert "claim hold-a is not attached to this VM instance" in world.recorder.events[0]["message"]


def test_a_refused_target_is_deleted_and_its_claims_stay_bound(world: vm.World) -> None:
    migrating_set(world, {"hold-a": hold_on("n2"), "vm1-gpu-1": hold_on("n2")})
    target = world.put_pod(
        vm.launcher_pod(
            name=TARGET[1], migration=True, gated=False, pinned_to="n2", unschedulable=True
        )
    )

    assert world.placement().reconcile(TARGET) is None

    writes = world.api.writes()
    assert writes[0] == (
        "delete",
        "Pod",
        TARGET[1],
        {"uid": f"uid-{TARGET[1]}", "resourceVersion": target["metadata"]["resourceVersion"]},
    )
    statuses = {w[2]: w[3]["status"] for w in writes if w[0] == "replace_status"}
    assert set(statuses) == {"hold-a", "vm1-gpu-1"}
    for status in statuses.values():
        assert (status["phase"], status["nodeName"]) == ("Bound", "n1")
        assert status["refusedNodes"] == [{"nodeName": "n2", "until": "2026-01-01T00:10:00Z"}]
        assert not [c for c in status.get("conditions", []) if c["reason"] == "RefusedByNode"]
    assert vm.free_units(world, "n1") == 1  # the source keeps the VM's 3 units
    vmi_event = world.recorder.events[-1]
    assert vmi_event["kind"] == "VirtualMachineInstance"
    assert "migration mig-1 fails and the VM keeps running on its node" in vmi_event["message"]


def test_claims_and_vmis_map_to_the_watched_launcher_and_target_pods(world: vm.World) -> None:
    world.put_pod(vm.launcher_pod())
    world.put_pod(vm.launcher_pod(name=TARGET[1], migration=True))
    hold = vm.claim("hold-a", attached={"vmi": "vm1"})
    template = vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID)

    assert placement.vmis_of_claim(hold) == {"vm1"}
    assert placement.vmis_of_claim(template) == {"vm1"}
    assert placement.pods_of_vmi(world.caches, vm.NS, "vm1") == [vm.POD, TARGET]
    assert placement.pods_of_vmi(world.caches, vm.NS, "vm2") == []


DRA_CLASS = objects.gpuclass("a10-dra", source={"dra": {"deviceClassName": "a10.example.com"}})
DRA_REFS = [{"claimTemplate": {"className": "a10-dra", "count": 2}}]


def dra_world(world: vm.World, phase: str) -> None:
    world.caches.classes.store.put(DRA_CLASS)
    world.put_vmi(vm.vmi(refs=DRA_REFS))
    node = "n2" if phase == "Bound" else None
    world.put_claim(
        vm.claim(
            "vm1-gpu-0", class_name="a10-dra", count=2, phase=phase, node=node, owner_uid=vm.VMI_UID
        )
    )
    world.put_pod(vm.launcher_pod(refs=DRA_REFS, units=0))


def test_a_pod_on_dra_claims_is_ungated_without_a_pin_once_they_are_bound(
    world: vm.World,
) -> None:
    dra_world(world, "Bound")

    assert world.placement().reconcile(vm.POD) is None

    [write] = world.api.writes()
    verb, kind, name, payload = write
    assert (verb, kind, name) == ("patch", "Pod", vm.POD[1])
    assert payload["body"]["spec"] == {"schedulingGates": [{"name": "other.example.com/gate"}]}
    stored = world.api.objects[("Pod", vm.NS, vm.POD[1])]
    assert not launcher_pods.is_gated(stored)
    assert launcher_pods.pinned_node(stored) is None  # kube-scheduler follows the allocation
    assert world.recorder.reasons() == ["Ungated"]


def test_a_pod_on_a_pending_dra_claim_stays_gated(world: vm.World) -> None:
    dra_world(world, "Pending")

    assert vm.requeue(world.placement().reconcile(vm.POD)) == placement.WAIT_RECHECK
    assert world.api.writes() == []
    assert world.recorder.reasons() == ["WaitingForPlacement"]
