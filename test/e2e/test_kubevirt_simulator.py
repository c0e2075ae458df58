"""The KubeVirt stand-in on the real control plane: the launcher pod it creates is placed by
the real kube-scheduler on a simulated GPU node, kwok runs it, and the VMI mirrors it; a
deleted pod fails its VMI; a GPU the KubeVirt CR does not permit gets no pod. Live
migrations: a VMI without GPUs moves to another node; a target pod that cannot schedule
fails its migration after the timeout; a migration deleted before it ends aborts; a VMI
KubeVirt would not migrate fails its migration at once. VirtualMachines start and stop
their VMI by their run strategy."""

from __future__ import annotations

import json
import threading
from typing import Any

import pykube
import pytest

from gpuoperator.kinds import (
    KubeVirt,
    VirtualMachine,
    VirtualMachineInstance,
    VirtualMachineInstanceMigration,
)
from harness.claims import event_messages
from harness.kubevirt import KubeVirtSimulator
from harness.waiting import wait_for

Obj = dict[str, Any]

A10 = "nvidia.com/GA102GL_A10"
L40S = "nvidia.com/L40S-24Q"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def namespace(hoster_namespace: str) -> str:
    """The stand-in's VMIs name GPUs raw (``gpus[].deviceName``), which the admission policies
    allow outside exempt namespaces only for resources no class names; other modules' classes
    name these, so this module runs in the test cluster's exempt hoster namespace."""
    return hoster_namespace


def ready_for_pods(api: pykube.HTTPClient, namespace: str) -> None:
    """Pods need the namespace's ``default`` ServiceAccount, which kube-controller-manager
    makes a moment after the namespace."""
    wait_for(
        f"the default ServiceAccount in {namespace}",
        lambda: pykube.ServiceAccount.objects(api, namespace=namespace).get_or_none(name="default"),
    )


def create_vmi(
    api: pykube.HTTPClient,
    namespace: str,
    name: str,
    gpus: list[str],
    **spec: Any,
) -> Obj:
    metadata: Obj = {"name": name, "namespace": namespace}
    for key in ("labels", "annotations"):
        if key in spec:
            metadata[key] = spec.pop(key)
    obj = VirtualMachineInstance(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": metadata,
            "spec": {
                "domain": {
                    "devices": {
                        "gpus": [
                            {"name": f"gpu{i}", "deviceName": device}
                            for i, device in enumerate(gpus)
                        ]
                    },
                    "resources": {"requests": {"memory": "1Gi"}},
                },
                **spec,
            },
        },
    )
    obj.create()
    return dict(obj.obj)


def vmi_status(api: pykube.HTTPClient, namespace: str, name: str) -> Obj:
    obj = VirtualMachineInstance.objects(api, namespace=namespace).get(name=name)
    return dict(obj.obj.get("status") or {})


def launcher_pods(api: pykube.HTTPClient, namespace: str, vmi: str | None = None) -> list[Obj]:
    selector = {"kubevirt.io": "virt-launcher"}
    if vmi is not None:
        selector["vm.kubevirt.io/name"] = vmi
    query = pykube.Pod.objects(api, namespace=namespace).filter(selector=selector)
    return [dict(p.obj) for p in query.iterator()]


def one_launcher_pod(api: pykube.HTTPClient, namespace: str, vmi: str) -> Obj:
    pods = wait_for(
        f"the launcher pod of {vmi}",
        lambda: launcher_pods(api, namespace, vmi),
        until=lambda pods: len(pods) > 0,
    )
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def pod_phase(api: pykube.HTTPClient, namespace: str, name: str) -> Obj:
    return dict(pykube.Pod.objects(api, namespace=namespace).get(name=name).obj)


def phase_is(phase: str) -> Any:
    return lambda status: status.get("phase") == phase


def settled(simulator: KubeVirtSimulator) -> None:
    """Wait until the simulator has acted on everything in the cluster now."""
    simulator.settle()


def test_a_gpu_vmi_gets_a_launcher_pod_that_runs_on_an_a10_node(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    vmi = create_vmi(
        api,
        namespace,
        "vm-a10",
        [A10, A10],
        tolerations=[GPU_TOLERATION],
        labels={"app": "web"},
        annotations={"note": "kept", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
    )
    uid = vmi["metadata"]["uid"]

    pod = one_launcher_pod(api, namespace, "vm-a10")
    meta = pod["metadata"]
    assert meta["name"].startswith("virt-launcher-vm-a10-")
    assert meta["labels"] == {
        "app": "web",
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": uid,
        "vm.kubevirt.io/name": "vm-a10",
    }
    assert meta["annotations"] == {"note": "kept", "kubevirt.io/domain": "vm-a10"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "name": "vm-a10",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    compute = pod["spec"]["containers"][0]
    assert compute["name"] == "compute"
    assert compute["resources"]["requests"] == {A10: "2", "memory": "1Gi"}
    assert compute["resources"]["limits"] == {A10: "2"}
    assert GPU_TOLERATION in pod["spec"]["tolerations"]

    running = wait_for(
        "the launcher pod to run",
        lambda: pod_phase(api, namespace, meta["name"]),
        until=lambda p: p.get("status", {}).get("phase") == "Running",
    )
    node = running["spec"]["nodeName"]
    assert node.startswith("a10-"), node

    status = wait_for(
        "the VMI to be Scheduled",
        lambda: vmi_status(api, namespace, "vm-a10"),
        phase_is("Scheduled"),
    )
    assert status["nodeName"] == node
    settled(kubevirt)
    assert [p["metadata"]["name"] for p in launcher_pods(api, namespace)] == [meta["name"]]


def test_deleting_a_pod_that_never_ran_fails_the_vmi_for_good(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    create_vmi(
        api,
        namespace,
        "vm-stuck",
        [A10],
        tolerations=[GPU_TOLERATION],
        nodeSelector={"gpuoperator.test/no-such-node": "true"},
    )
    pod = one_launcher_pod(api, namespace, "vm-stuck")
    wait_for(
        "the VMI to be Scheduling",
        lambda: vmi_status(api, namespace, "vm-stuck"),
        phase_is("Scheduling"),
    )
    assert pod_phase(api, namespace, pod["metadata"]["name"])["status"]["phase"] == "Pending"

    pykube.Pod(api, pod).delete()
    status = wait_for(
        "the VMI to fail",
        lambda: vmi_status(api, namespace, "vm-stuck"),
        phase_is("Failed"),
    )
    assert "nodeName" not in status
    settled(kubevirt)
    assert launcher_pods(api, namespace) == [], "a Failed VMI must get no new pod"
    assert vmi_status(api, namespace, "vm-stuck")["phase"] == "Failed"


def test_deleting_a_running_pod_fails_the_vmi(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    create_vmi(api, namespace, "vm-ran", [A10], tolerations=[GPU_TOLERATION])
    pod = one_launcher_pod(api, namespace, "vm-ran")
    scheduled = wait_for(
        "the VMI to be Scheduled",
        lambda: vmi_status(api, namespace, "vm-ran"),
        phase_is("Scheduled"),
    )

    pykube.Pod(api, pod).delete()
    status = wait_for(
        "the VMI to fail",
        lambda: vmi_status(api, namespace, "vm-ran"),
        phase_is("Failed"),
    )
    assert status["nodeName"] == scheduled["nodeName"]
    settled(kubevirt)
    assert launcher_pods(api, namespace) == [], "a Failed VMI must get no new pod"


def test_a_gpu_the_kubevirt_cr_does_not_permit_gets_no_pod(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    # Cluster-wide in effect although namespaced: deleted at the end whatever happens.
    config = KubeVirt(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": namespace},
            "spec": {
                "configuration": {
                    "permittedHostDevices": {
                        "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": A10}]
                    }
                }
            },
        },
    )
    config.create()
    try:
        settled(kubevirt)  # the simulator has read the table
        create_vmi(api, namespace, "vm-l40s", [L40S], tolerations=[GPU_TOLERATION])
        create_vmi(api, namespace, "vm-a10", [A10], tolerations=[GPU_TOLERATION])

        status = wait_for(
            "the refusal on vm-l40s",
            lambda: vmi_status(api, namespace, "vm-l40s"),
            lambda s: any(c["type"] == "Synchronized" for c in s.get("conditions", [])),
        )
        assert status["phase"] == "Pending"
        [condition] = status["conditions"]
        assert condition["status"] == "False"
        assert condition["reason"] == "FailedCreate"
        assert condition["message"] == (
            f"GPU {L40S} is not permitted in permittedHostDevices configuration"
        )
        one_launcher_pod(api, namespace, "vm-a10")  # a permitted GPU is served meanwhile
        settled(kubevirt)
        assert launcher_pods(api, namespace, "vm-l40s") == []
    finally:
        config.delete()

    # The table is gone, so everything is permitted: the refused VMI now gets its pod.
    pod = one_launcher_pod(api, namespace, "vm-l40s")
    status = wait_for(
        "vm-l40s to be Scheduled",
        lambda: vmi_status(api, namespace, "vm-l40s"),
        phase_is("Scheduled"),
    )
    assert status["nodeName"].startswith("l40s-"), status
    assert not status.get("conditions"), status
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {L40S: "1"}


@pytest.mark.parametrize("table", [{}, {"mediatedDevices": []}])
def test_an_empty_permitted_table_permits_no_gpu(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator, table: Obj
) -> None:
    ready_for_pods(api, namespace)
    config = KubeVirt(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": namespace},
            "spec": {"configuration": {"permittedHostDevices": table}},
        },
    )
    config.create()
    try:
        settled(kubevirt)
        create_vmi(api, namespace, "vm-a10", [A10], tolerations=[GPU_TOLERATION])
        status = wait_for(
            "the refusal on vm-a10",
            lambda: vmi_status(api, namespace, "vm-a10"),
            lambda s: bool(s.get("conditions")),
        )
        assert status["conditions"][0]["message"] == (
            f"GPU {A10} is not permitted in permittedHostDevices configuration"
        )
        assert launcher_pods(api, namespace) == []
    finally:
        config.delete()


def test_each_vmi_gets_one_pod_however_many_events_arrive_meanwhile(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    """Label writes from several threads while the VMIs are being launched: every write is
    a VMI event that queues the VMI again, before and after its pod appears."""
    ready_for_pods(api, namespace)
    vmis = [f"vm-busy-{i}" for i in range(6)]

    def touch(worker: int) -> None:
        client = pykube.HTTPClient(api.config, timeout=30)
        for round_ in range(5):
            for name in vmis:
                obj = VirtualMachineInstance.objects(client, namespace=namespace).get(name=name)
                obj.obj["metadata"].setdefault("labels", {})[f"touch-{worker}"] = str(round_)
                try:
                    obj.update()
                except pykube.exceptions.HTTPError as exc:
                    if exc.code != 409:  # another writer was first: an event all the same
                        raise

    for name in vmis:
        create_vmi(api, namespace, name, [A10], tolerations=[GPU_TOLERATION])
    writers = [threading.Thread(target=touch, args=(w,)) for w in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert not any(w.is_alive() for w in writers)
    for name in vmis:
        wait_for(
            f"{name} to be Scheduled",
            lambda name=name: vmi_status(api, namespace, name),  # type: ignore[misc]
            phase_is("Scheduled"),
        )
    settled(kubevirt)
    owners = sorted(
        p["metadata"]["labels"]["vm.kubevirt.io/name"] for p in launcher_pods(api, namespace)
    )
    assert owners == sorted(vmis)


def test_a_pod_event_alone_moves_its_vmi(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    """A pod no scheduler serves is bound by hand: only the pod changes (bound, then
    Running by kwok), and the VMI follows it to Scheduled on that node."""
    ready_for_pods(api, namespace)
    create_vmi(
        api,
        namespace,
        "vm-bound-by-hand",
        [A10],
        tolerations=[GPU_TOLERATION],
        schedulerName="no-such-scheduler",
    )
    pod = one_launcher_pod(api, namespace, "vm-bound-by-hand")
    wait_for(
        "the VMI to be Scheduling",
        lambda: vmi_status(api, namespace, "vm-bound-by-hand"),
        phase_is("Scheduling"),
    )
    node = next(n.name for n in pykube.Node.objects(api).iterator() if n.name.startswith("a10-"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    response = api.post(
        url=f"pods/{pod['metadata']['name']}/binding",
        namespace=namespace,
        data=json.dumps(binding),
    )
    api.raise_for_status(response)
    status = wait_for(
        "the VMI to be Scheduled",
        lambda: vmi_status(api, namespace, "vm-bound-by-hand"),
        phase_is("Scheduled"),
    )
    assert status["nodeName"] == node


# ---- live migration ---------------------------------------------------------------------

#: The two A10 nodes of the test cluster's profile: a VMI kept to them has one node to move to.
A10_NODES = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A10"}}


def on_node(node: str) -> Obj:
    """A VMI's affinity to exactly one node, which its migration's target pod inherits."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def running_vmi(
    api: pykube.HTTPClient, namespace: str, name: str, gpus: list[str], **spec: Any
) -> Obj:
    """A VMI once it is Scheduled (the stand-in's running), with its launcher pod."""
    create_vmi(api, namespace, name, gpus, tolerations=[GPU_TOLERATION], **spec)
    wait_for(
        f"{name} to be Scheduled", lambda: vmi_status(api, namespace, name), phase_is("Scheduled")
    )
    return running_vmi_obj(api, namespace, name)


def running_vmi_obj(api: pykube.HTTPClient, namespace: str, name: str) -> Obj:
    return dict(VirtualMachineInstance.objects(api, namespace=namespace).get(name=name).obj)


def migrate(
    api: pykube.HTTPClient, namespace: str, vmi: str, name: str = "", **annotations: str
) -> Obj:
    obj = VirtualMachineInstanceMigration(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {
                "name": name or f"migrate-{vmi}",
                "namespace": namespace,
                "annotations": annotations,
            },
            "spec": {"vmiName": vmi},
        },
    )
    obj.create()
    return dict(obj.obj)


def migration(api: pykube.HTTPClient, namespace: str, name: str) -> Obj | None:
    found = VirtualMachineInstanceMigration.objects(api, namespace=namespace).get_or_none(name=name)
    return dict(found.obj) if found is not None else None


def migration_phase(api: pykube.HTTPClient, namespace: str, name: str) -> str:
    found = migration(api, namespace, name)
    return str(((found or {}).get("status") or {}).get("phase") or "")


def target_pods(api: pykube.HTTPClient, namespace: str, uid: str) -> list[Obj]:
    query = pykube.Pod.objects(api, namespace=namespace).filter(
        selector={"kubevirt.io/migrationJobUID": uid}
    )
    return [dict(p.obj) for p in query.iterator()]


def test_a_vmi_without_gpus_migrates_to_another_node(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    vmi = running_vmi(api, namespace, "vm-mover", [], **A10_NODES)
    uid = vmi["metadata"]["uid"]
    source = vmi["status"]["nodeName"]
    [source_pod] = launcher_pods(api, namespace, "vm-mover")

    job = migrate(api, namespace, "vm-mover")
    job_uid = job["metadata"]["uid"]
    wait_for(
        "the migration to succeed",
        lambda: migration_phase(api, namespace, job["metadata"]["name"]),
        until=lambda phase: phase in ("Succeeded", "Failed"),
        timeout=60,
    )
    done = migration(api, namespace, job["metadata"]["name"])
    assert done is not None and done["status"]["phase"] == "Succeeded"
    assert [t["phase"] for t in done["status"]["phaseTransitionTimestamps"]] == [
        "Pending",
        "Scheduling",
        "Scheduled",
        "PreparingTarget",
        "TargetReady",
        "Running",
        "Succeeded",
    ]

    moved = running_vmi_obj(api, namespace, "vm-mover")
    state = moved["status"]["migrationState"]
    target = state["targetNode"]
    assert target != source and target.startswith("a10-"), state
    assert moved["status"]["nodeName"] == target
    assert moved["status"]["phase"] == "Scheduled"
    assert moved["metadata"]["labels"]["kubevirt.io/nodeName"] == target
    assert state["migrationUid"] == job_uid
    assert state["sourceNode"] == source
    assert state["sourcePod"] == source_pod["metadata"]["name"]
    assert state["completed"] is True and not state.get("failed")
    assert state["startTimestamp"] <= state["endTimestamp"]
    assert done["status"]["migrationState"]["targetPod"] == state["targetPod"]

    # The source pod went; the target pod is now the VMI's one launcher pod.
    wait_for(
        "the source pod gone",
        lambda: launcher_pods(api, namespace, "vm-mover"),
        until=lambda pods: len(pods) == 1,
    )
    settled(kubevirt)
    [pod] = launcher_pods(api, namespace, "vm-mover")
    assert pod["metadata"]["name"] == state["targetPod"]
    assert pod["spec"]["nodeName"] == target
    assert pod["metadata"]["labels"]["kubevirt.io/migrationJobUID"] == job_uid
    assert pod["metadata"]["annotations"]["kubevirt.io/migrationJobName"] == job["metadata"]["name"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
    assert pod["spec"]["affinity"]["podAntiAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": "kubevirt.io/created-by", "operator": "In", "values": [uid]}
                    ]
                },
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
    assert event_messages(api, namespace, job["metadata"]["name"], "SuccessfulMigration") == [
        "Source node reported migration succeeded"
    ]


def test_a_target_that_cannot_schedule_fails_the_migration_after_the_timeout(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    vmi = running_vmi(api, namespace, "vm-pinned", [], affinity=on_node("cpu-0"))
    [source_pod] = launcher_pods(api, namespace, "vm-pinned")
    # Its target pod may go only to cpu-0, where the anti-affinity to the VMI's pod keeps
    # it out: unschedulable, so KubeVirt's per-migration timeout ends it.
    job = migrate(
        api, namespace, "vm-pinned", **{"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "3"}
    )
    name, job_uid = job["metadata"]["name"], job["metadata"]["uid"]
    wait_for(
        "the target pod",
        lambda: target_pods(api, namespace, job_uid),
        until=lambda pods: len(pods) == 1,
    )
    wait_for(
        "the migration to fail",
        lambda: migration_phase(api, namespace, name),
        until=lambda phase: phase in ("Succeeded", "Failed"),
        timeout=60,
    )
    assert migration_phase(api, namespace, name) == "Failed"
    wait_for(
        "the target pod gone",
        lambda: target_pods(api, namespace, job_uid),
        until=lambda pods: pods == [],
    )
    assert event_messages(api, namespace, name, "migrationTargetPodUnschedulable")
    [deleted] = event_messages(api, namespace, name, "SuccessfulDelete")
    assert deleted.startswith(f"unschedulable pod {namespace}/virt-launcher-vm-pinned-")
    assert deleted.endswith(" timeout period exceeded")
    assert event_messages(api, namespace, name, "FailedMigration") == [
        "Migration target pod was removed during active migration."
    ]
    # The VM runs on where it was, and was never handed off (KubeVirt writes the VMI's
    # migrationState only once the target pod runs).
    settled(kubevirt)
    status = vmi_status(api, namespace, "vm-pinned")
    assert status["phase"] == "Scheduled" and status["nodeName"] == "cpu-0"
    assert "migrationState" not in status
    assert [p["metadata"]["name"] for p in launcher_pods(api, namespace, "vm-pinned")] == [
        source_pod["metadata"]["name"]
    ]
    assert vmi["status"]["nodeName"] == "cpu-0"


def test_a_migration_deleted_before_it_ends_aborts(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator
) -> None:
    ready_for_pods(api, namespace)
    running_vmi(api, namespace, "vm-stays", [], affinity=on_node("cpu-0"))
    [source_pod] = launcher_pods(api, namespace, "vm-stays")
    job = migrate(api, namespace, "vm-stays")  # the default timeouts: minutes
    name, job_uid = job["metadata"]["name"], job["metadata"]["uid"]
    wait_for(
        "the migration Scheduling",
        lambda: migration_phase(api, namespace, name),
        until=lambda phase: phase == "Scheduling",
    )
    [target] = target_pods(api, namespace, job_uid)
    assert target["status"]["phase"] == "Pending"

    VirtualMachineInstanceMigration(api, job).delete()
    wait_for(
        "the target pod gone",
        lambda: target_pods(api, namespace, job_uid),
        until=lambda pods: pods == [],
    )
    settled(kubevirt)
    status = vmi_status(api, namespace, "vm-stays")
    assert status["phase"] == "Scheduled" and status["nodeName"] == "cpu-0"
    assert [p["metadata"]["name"] for p in launcher_pods(api, namespace, "vm-stays")] == [
        source_pod["metadata"]["name"]
    ]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([A10], "VMI specifies a GPU but feature gate VGPULiveMigration is not enabled"),
        ([A10, A10], "VMI specifies too many GPUs"),
    ],
)
def test_a_vmi_with_passthrough_gpus_is_not_migrated(
    api: pykube.HTTPClient,
    namespace: str,
    kubevirt: KubeVirtSimulator,
    gpus: list[str],
    message: str,
) -> None:
    ready_for_pods(api, namespace)
    running_vmi(api, namespace, "vm-gpu", gpus)
    job = migrate(api, namespace, "vm-gpu")
    name = job["metadata"]["name"]
    wait_for(
        "the migration to fail",
        lambda: migration_phase(api, namespace, name),
        until=lambda phase: phase != "",
    )
    assert migration_phase(api, namespace, name) == "Failed"
    assert event_messages(api, namespace, name, "FailedMigration") == [
        f"Cannot migrate VMI, Reason: HostDeviceNotLiveMigratable, Message: {message}"
    ]
    settled(kubevirt)
    assert target_pods(api, namespace, job["metadata"]["uid"]) == []
    assert "migrationState" not in vmi_status(api, namespace, "vm-gpu")


# ---- VirtualMachines --------------------------------------------------------------------


def vm_status(api: pykube.HTTPClient, namespace: str, name: str) -> Obj:
    found = VirtualMachine.objects(api, namespace=namespace).get(name=name).obj
    return dict(found.get("status") or {})


@pytest.mark.parametrize(
    ("run", "halt"),
    [
        ({"runStrategy": "Always"}, {"runStrategy": "Halted"}),
        ({"running": True}, {"running": False}),
    ],
    ids=["runStrategy", "running"],
)
def test_a_virtual_machine_starts_and_stops_its_vmi(
    api: pykube.HTTPClient, namespace: str, kubevirt: KubeVirtSimulator, run: Obj, halt: Obj
) -> None:
    ready_for_pods(api, namespace)
    vm = VirtualMachine(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": "vm-web", "namespace": namespace},
            "spec": {
                **run,
                "template": {
                    "metadata": {"labels": {"app": "web"}, "annotations": {"note": "kept"}},
                    "spec": {
                        "domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}},
                        "tolerations": [GPU_TOLERATION],
                    },
                },
            },
        },
    )
    vm.create()
    status = wait_for(
        "the VM Running",
        lambda: vm_status(api, namespace, "vm-web"),
        until=lambda s: s.get("printableStatus") == "Running",
    )
    assert status["ready"] is True and status["created"] is True
    vmi = VirtualMachineInstance.objects(api, namespace=namespace).get(name="vm-web").obj
    assert vmi["metadata"]["labels"] == {"app": "web"}
    assert vmi["metadata"]["annotations"] == {"note": "kept"}
    assert vmi["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "name": "vm-web",
            "uid": vm.obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert vmi["spec"]["tolerations"] == [GPU_TOLERATION]
    assert vmi["status"]["phase"] == "Scheduled"

    vm.reload()
    vm.obj["spec"].update(halt)
    vm.update()
    wait_for(
        "the VMI gone",
        lambda: VirtualMachineInstance.objects(api, namespace=namespace).get_or_none(name="vm-web"),
        until=lambda v: v is None,
    )
    status = wait_for(
        "the VM Stopped",
        lambda: vm_status(api, namespace, "vm-web"),
        until=lambda s: s.get("printableStatus") == "Stopped",
    )
    assert status["ready"] is False and status["created"] is False
    settled(kubevirt)
    assert (
        VirtualMachineInstance.objects(api, namespace=namespace).get_or_none(name="vm-web") is None
    ), "a halted VM gets no new VMI"
