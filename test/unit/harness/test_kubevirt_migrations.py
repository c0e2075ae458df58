"""The KubeVirt stand-in's pure decisions for live migrations and VirtualMachines: which VMIs
KubeVirt would migrate, the target pod it renders, each step of a migration (phases, the
VMI's migrationState, timeouts, cancel) and what a VirtualMachine's run strategy asks.

The migration is driven here by a small loop that applies each step to plain dicts, as the
simulator's shell applies it to the API server; the expected phases, fields and messages are
written out, not computed."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from harness import kubevirt as kv
from harness import objects

A10 = "nvidia.com/GA102GL_A10"
L40S = "nvidia.com/L40S-24Q"
VMI_UID = "uid-vmi"
JOB_UID = "uid-job"
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC).timestamp()

Obj = dict[str, Any]


def a_vmi(gpus: list[Obj] | None = None, *, phase: str = "Scheduled", node: str = "n1") -> Obj:
    obj = objects.vmi(
        "vm-a", namespace="tenant", uid=VMI_UID, rv="10", devices={"gpus": gpus} if gpus else None
    )
    obj["status"] = {"phase": phase, "nodeName": node}
    return obj


def a_migration(**annotations: str) -> Obj:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": {
            "name": "job",
            "namespace": "tenant",
            "uid": JOB_UID,
            "annotations": annotations,
            "creationTimestamp": "2026-01-01T12:00:00Z",
        },
        "spec": {"vmiName": "vm-a"},
    }


def kubevirt_cr(gates: list[str], mediated: list[str]) -> Obj:
    return {
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {
            "configuration": {
                "developerConfiguration": {"featureGates": gates},
                "permittedHostDevices": {
                    "mediatedDevices": [
                        {"mdevNameSelector": "NVIDIA L40S-24Q", "resourceName": r} for r in mediated
                    ]
                },
            }
        },
    }


def pod(
    name: str,
    *,
    node: str | None,
    phase: str,
    created: str = "2026-01-01T12:00:00Z",
    job: str | None = None,
    unschedulable: bool = False,
) -> Obj:
    labels = {
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": VMI_UID,
        "vm.kubevirt.io/name": "vm-a",
    }
    if job:
        labels["kubevirt.io/migrationJobUID"] = job
    obj = objects.pod(
        name,
        namespace="tenant",
        node_name=node,
        phase=phase,
        labels=labels,
        owners=[
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": "vm-a",
                "uid": VMI_UID,
                "controller": True,
            }
        ],
    )
    obj["metadata"]["creationTimestamp"] = created
    if unschedulable:
        obj["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        ]
    return obj


# ---- which VMIs migrate ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "kubevirts", "message"),
    [
        ({}, [], None),
        (
            {"hostDevices": [{"name": "h", "deviceName": A10}]},
            [],
            "VMI specifies non-migratable generic PCI host device",
        ),
        (
            {"gpus": [{"name": "a", "deviceName": L40S}, {"name": "b", "deviceName": L40S}]},
            [kubevirt_cr(["VGPULiveMigration"], [L40S])],
            "VMI specifies too many GPUs",
        ),
        (
            {"gpus": [{"name": "a", "deviceName": L40S}]},
            [kubevirt_cr([], [L40S])],
            "VMI specifies a GPU but feature gate VGPULiveMigration is not enabled",
        ),
        (
            {"gpus": [{"name": "a", "deviceName": A10}]},
            [kubevirt_cr(["VGPULiveMigration"], [L40S])],
            "VMI specifies non-migratable GPU device",
        ),
        (
            {"gpus": [{"name": "a", "claimName": "c", "requestName": "r"}]},
            [kubevirt_cr(["VGPULiveMigration"], [L40S])],
            "VMI specifies non-migratable GPU device",
        ),
        (
            {"gpus": [{"name": "a", "deviceName": L40S}]},
            [kubevirt_cr(["VGPULiveMigration"], [L40S])],
            None,
        ),
    ],
    ids=["no-devices", "host-device", "two-gpus", "no-gate", "passthrough", "dra", "vgpu"],
)
def test_live_migratable_follows_kubevirts_host_device_rules(
    devices: Obj, kubevirts: list[Obj], message: str | None
) -> None:
    obj = a_vmi()
    obj["spec"]["domain"] = {"devices": devices}
    found = kv.live_migratable(obj, kubevirts)
    if message is None:
        assert found is None
    else:
        assert found == kv.SyncError("HostDeviceNotLiveMigratable", message)


# ---- the target pod ----------------------------------------------------------------------


def test_the_target_pod_is_the_launcher_pod_with_the_job_and_anti_affinity() -> None:
    obj = a_vmi([{"name": "a", "deviceName": L40S}])
    keep = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                ]
            }
        }
    }
    obj["spec"]["affinity"] = copy.deepcopy(keep)
    target = kv.render_target_pod(obj, a_migration(), None)
    launcher = kv.render_launcher_pod(obj, None)
    assert isinstance(target, dict) and isinstance(launcher, dict)
    assert target["metadata"]["labels"] == {
        **launcher["metadata"]["labels"],
        "kubevirt.io/migrationJobUID": JOB_UID,
    }
    assert target["metadata"]["annotations"] == {
        **launcher["metadata"]["annotations"],
        "kubevirt.io/migrationJobName": "job",
    }
    assert target["spec"]["containers"] == launcher["spec"]["containers"]
    assert target["spec"]["affinity"] == {
        **keep,
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": "kubevirt.io/created-by", "operator": "In", "values": [VMI_UID]}
                        ]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }
    assert obj["spec"]["affinity"] == keep, "the VMI is not changed"


def test_a_gpu_not_permitted_gets_no_target_pod_either() -> None:
    obj = a_vmi([{"name": "a", "deviceName": L40S}])
    refused = kv.render_target_pod(obj, a_migration(), frozenset({A10}))
    assert refused == kv.SyncError(
        "FailedCreate", f"GPU {L40S} is not permitted in permittedHostDevices configuration"
    )


def test_the_vmis_pod_is_the_one_on_its_node_not_the_target() -> None:
    obj = a_vmi()
    source = pod(
        "virt-launcher-vm-a-src", node="n1", phase="Running", created="2026-01-01T11:00:00Z"
    )
    target = pod("virt-launcher-vm-a-dst", node="n2", phase="Running", job=JOB_UID)
    assert kv.find_launcher_pod(obj, [source, target]) is source
    assert kv.target_pod(obj, JOB_UID, [source, target]) is target
    assert kv.target_pod(obj, "another-job", [source, target]) is None


# ---- a migration, step by step -----------------------------------------------------------


class World:
    """A VMI, its pods and one migration as plain dicts; ``step`` applies one
    ``migration_step`` the way the simulator's shell does."""

    def __init__(self, vmi: Obj, migration: Obj, kubevirts: list[Obj] | None = None) -> None:
        self.vmi: Obj | None = vmi
        self.migration = migration
        self.kubevirts = kubevirts or []
        self.pods = {
            "virt-launcher-vm-a-src": pod(
                "virt-launcher-vm-a-src", node="n1", phase="Running", created="2026-01-01T11:00:00Z"
            )
        }
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.created = 0

    def step(self, now: float = T0, **kw: Any) -> kv.MigrationStep:
        step = kv.migration_step(
            self.migration,
            self.vmi,
            list(self.pods.values()),
            kubevirts=self.kubevirts,
            now=now,
            **kw,
        )
        if step.vmi is not None:
            assert self.vmi is not None
            self.vmi["status"] = step.vmi["status"]
            self.vmi["metadata"]["labels"] = step.vmi["labels"]
        if step.create_target:
            assert self.vmi is not None
            rendered = kv.render_target_pod(self.vmi, self.migration, None)
            assert isinstance(rendered, dict)
            self.created += 1
            name = f"virt-launcher-vm-a-t{self.created}"
            self.pods[name] = pod(name, node=None, phase="Pending", job=JOB_UID)
        self.migration["status"] = step.status
        self.events += step.events
        for name in step.delete_pods:
            self.deleted.append(name)
            self.pods.pop(name, None)
        return step

    def run_target(self, node: str = "n2") -> None:
        name = f"virt-launcher-vm-a-t{self.created}"
        self.pods[name] = pod(name, node=node, phase="Running", job=JOB_UID)

    @property
    def phase(self) -> str:
        return str((self.migration.get("status") or {}).get("phase") or "")

    def state(self) -> Obj:
        assert self.vmi is not None
        return dict(self.vmi["status"].get("migrationState") or {})


def test_a_migration_runs_through_kubevirts_phases_and_moves_the_vmi() -> None:
    w = World(a_vmi(), a_migration())
    w.step()
    assert w.phase == "Pending" and w.created == 0
    w.step()
    assert w.created == 1 and w.phase == "Pending", "the target pod first, then Scheduling"
    w.step()
    assert w.phase == "Scheduling"
    w.step()
    assert w.phase == "Scheduling", "the target pod does not run yet"
    w.run_target("n2")
    w.step()
    assert w.phase == "Scheduled"
    w.step()  # the hand-off
    assert w.state() == {
        "migrationUid": JOB_UID,
        "sourceNode": "n1",
        "targetNode": "n2",
        "targetPod": "virt-launcher-vm-a-t1",
        "sourcePod": "virt-launcher-vm-a-src",
    }
    for _ in range(6):
        if w.phase == "Succeeded":
            break
        w.step(now=T0 + 1)
    assert w.phase == "Succeeded"
    assert [t["phase"] for t in w.migration["status"]["phaseTransitionTimestamps"]] == [
        "Pending",
        "Scheduling",
        "Scheduled",
        "PreparingTarget",
        "TargetReady",
        "Running",
        "Succeeded",
    ]
    assert w.vmi is not None
    assert w.vmi["status"]["nodeName"] == "n2"
    assert w.vmi["status"]["phase"] == "Scheduled"
    assert w.vmi["metadata"]["labels"]["kubevirt.io/nodeName"] == "n2"
    state = w.state()
    assert state["completed"] is True and "failed" not in state
    assert state["startTimestamp"] == "2026-01-01T12:00:01Z"
    assert state["endTimestamp"] == "2026-01-01T12:00:01Z"
    assert w.migration["status"]["migrationState"] == state
    assert w.deleted == ["virt-launcher-vm-a-src"], "the source pod goes, after the move"
    assert w.events == [
        ("Normal", "SuccessfulMigration", "Source node reported migration succeeded")
    ]
    before = copy.deepcopy(w.migration)
    assert w.step(now=T0 + 2).status == before["status"], "a final migration stays as it is"


def test_an_unschedulable_target_is_deleted_after_the_annotated_timeout() -> None:
    w = World(a_vmi(), a_migration(**{"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "3"}))
    for _ in range(3):
        w.step()
    assert w.phase == "Scheduling"
    w.pods["virt-launcher-vm-a-t1"] = pod(
        "virt-launcher-vm-a-t1", node=None, phase="Pending", job=JOB_UID, unschedulable=True
    )
    waiting = w.step(now=T0 + 2)
    assert waiting.recheck_after == 1 and waiting.delete_pods == ()
    timed_out = w.step(now=T0 + 3)
    assert timed_out.delete_pods == ("virt-launcher-vm-a-t1",)
    assert w.events[-1] == (
        "Normal",
        "SuccessfulDelete",
        "unschedulable pod tenant/virt-launcher-vm-a-t1 timeout period exceeded",
    )
    assert w.events[0][:2] == ("Warning", "migrationTargetPodUnschedulable")
    w.step(now=T0 + 4)
    assert w.phase == "Failed"
    assert w.events[-1] == (
        "Warning",
        "FailedMigration",
        "Migration target pod was removed during active migration.",
    )
    assert w.state() == {}, "never handed off: the VMI's migrationState is not written"
    assert w.vmi is not None and w.vmi["status"]["nodeName"] == "n1"


def test_a_pending_target_times_out_by_the_catch_all_timeout_or_its_annotation() -> None:
    w = World(a_vmi(), a_migration())
    for _ in range(3):
        w.step()
    assert w.step(now=T0 + 10, pending_timeout=60).recheck_after == 50
    assert w.step(now=T0 + 60, pending_timeout=60).delete_pods == ("virt-launcher-vm-a-t1",)

    w = World(a_vmi(), a_migration(**{"kubevirt.io/migrationPendingPodTimeoutSeconds": "5"}))
    for _ in range(3):
        w.step()
    assert w.step(now=T0 + 5, pending_timeout=60).delete_pods == ("virt-launcher-vm-a-t1",)
    assert w.events[-1][2] == "pending pod tenant/virt-launcher-vm-a-t1 timeout period exceeded"


def test_a_migration_deleted_before_the_hand_off_deletes_its_target() -> None:
    w = World(a_vmi(), a_migration())
    for _ in range(3):
        w.step()
    w.migration["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:05Z"
    w.step(now=T0 + 5)
    assert w.phase == "Failed"
    assert w.deleted == ["virt-launcher-vm-a-t1"]
    [condition] = w.migration["status"]["conditions"]
    assert (condition["type"], condition["status"]) == ("migrationAbortRequested", "True")
    assert w.events == [("Warning", "FailedMigration", "Migration failed due to being canceled")]
    assert w.state() == {}


def test_a_migration_deleted_after_the_hand_off_aborts_on_the_vmi() -> None:
    w = World(a_vmi(), a_migration())
    for _ in range(3):
        w.step()
    w.run_target()
    w.step()
    w.step()  # handed off
    w.migration["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:05Z"
    w.step(now=T0 + 5)
    assert w.phase == "Failed"
    state = w.state()
    assert state["abortStatus"] == "Succeeded"
    assert state["failed"] is True and state["completed"] is True
    assert state["failureReason"] == "Live migration has been aborted"
    assert state["endTimestamp"] == "2026-01-01T12:00:05Z"
    assert w.deleted == ["virt-launcher-vm-a-t1"]
    assert w.vmi is not None and w.vmi["status"]["nodeName"] == "n1", "the VMI stays"


def test_a_migration_gone_after_the_hand_off_is_aborted_by_the_vmis_sync() -> None:
    status = {
        "phase": "Scheduled",
        "nodeName": "n1",
        "migrationState": {"migrationUid": JOB_UID, "targetNode": "n2"},
    }
    assert kv.abandon_migration(status, [JOB_UID], T0) == status
    aborted = kv.abandon_migration(status, ["other"], T0)
    assert aborted["migrationState"] == {
        "migrationUid": JOB_UID,
        "targetNode": "n2",
        "failed": True,
        "completed": True,
        "abortStatus": "Succeeded",
        "failureReason": "Live migration has been aborted",
        "startTimestamp": "2026-01-01T12:00:00Z",
        "endTimestamp": "2026-01-01T12:00:00Z",
    }
    done = {**status, "migrationState": {"migrationUid": JOB_UID, "completed": True}}
    assert kv.abandon_migration(done, [], T0) == done


def test_a_target_pod_that_fails_fails_the_migration() -> None:
    w = World(a_vmi(), a_migration())
    for _ in range(3):
        w.step()
    w.pods["virt-launcher-vm-a-t1"]["status"]["phase"] = "Failed"
    w.step()
    assert w.phase == "Failed"
    assert w.events[-1] == (
        "Warning",
        "FailedMigration",
        "Migration failed because target pod shutdown during migration",
    )
    assert w.deleted == ["virt-launcher-vm-a-t1"]


@pytest.mark.parametrize(
    ("vmi", "busy", "message"),
    [
        (a_vmi(phase="Scheduling"), False, "Cannot migrate VMI, VMI is not running"),
        (
            a_vmi([{"name": "a", "deviceName": A10}]),
            False,
            "Cannot migrate VMI, Reason: HostDeviceNotLiveMigratable, Message: VMI specifies a GPU "
            "but feature gate VGPULiveMigration is not enabled",
        ),
        (
            a_vmi(),
            True,
            "VMI is not eligible for migration because another migration job is in progress.",
        ),
        (a_vmi(phase="Failed"), False, "Migration failed vmi shutdown during migration."),
    ],
    ids=["not-running", "passthrough", "busy", "vmi-failed"],
)
def test_a_migration_kubevirt_would_not_run_fails_at_once(
    vmi: Obj, busy: bool, message: str
) -> None:
    w = World(vmi, a_migration())
    w.step(busy=busy)
    assert w.phase == "Failed" and w.created == 0
    assert w.events == [("Warning", "FailedMigration", message)]


def test_a_migration_of_a_vmi_that_does_not_exist_is_deleted() -> None:
    assert kv.migration_step(a_migration(), None, [], now=T0).delete_migration
    failed = a_migration()
    failed["status"] = {"phase": "Failed"}
    assert not kv.migration_step(failed, None, [], now=T0).delete_migration


# ---- VirtualMachines ---------------------------------------------------------------------


def a_vm(**spec: Any) -> Obj:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "vm-a", "namespace": "tenant", "uid": "uid-vm"},
        "spec": {
            **spec,
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"note": "kept"}},
                "spec": {"domain": {"devices": {}}},
            },
        },
    }


def vmi_of_vm(phase: str = "Scheduled", **meta: Any) -> Obj:
    obj = a_vmi(phase=phase)
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "name": "vm-a",
            "uid": "uid-vm",
            "controller": True,
        }
    ]
    obj["metadata"].update(meta)
    return obj


@pytest.mark.parametrize("run", [{"runStrategy": "Always"}, {"running": True}])
def test_a_vm_that_should_run_starts_its_vmi_from_the_template(run: Obj) -> None:
    step = kv.vm_step(a_vm(**run), None, launched=False)
    assert step.create == {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": "vm-a",
            "namespace": "tenant",
            "labels": {"app": "web"},
            "annotations": {"note": "kept"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachine",
                    "name": "vm-a",
                    "uid": "uid-vm",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"domain": {"devices": {}}},
    }
    assert step.status == {"created": False, "ready": False, "printableStatus": "Starting"}
    assert kv.vm_step(a_vm(**run), None, launched=True).create is None, "one VMI at a time"


@pytest.mark.parametrize("run", [{"runStrategy": "Always"}, {"running": True}])
def test_a_running_vm_says_so(run: Obj) -> None:
    step = kv.vm_step(a_vm(**run), vmi_of_vm(), launched=False)
    assert step.create is None and not step.delete_vmi
    assert step.status == {"created": True, "ready": True, "printableStatus": "Running"}
    starting = kv.vm_step(a_vm(**run), vmi_of_vm("Scheduling"), launched=False)
    assert starting.status["printableStatus"] == "Starting"
    migrating = vmi_of_vm()
    migrating["status"]["migrationState"] = {"startTimestamp": "2026-01-01T12:00:00Z"}
    assert kv.vm_step(a_vm(**run), migrating, launched=False).status["printableStatus"] == (
        "Migrating"
    )


@pytest.mark.parametrize("halt", [{"runStrategy": "Halted"}, {"running": False}, {}])
def test_a_halted_vm_stops_its_vmi(halt: Obj) -> None:
    step = kv.vm_step(a_vm(**halt), vmi_of_vm(), launched=False)
    assert step.delete_vmi and step.create is None
    assert step.status == {"created": True, "ready": True, "printableStatus": "Stopping"}
    going = kv.vm_step(
        a_vm(**halt), vmi_of_vm(deletionTimestamp="2026-01-01T12:00:00Z"), launched=False
    )
    assert not going.delete_vmi and going.status["printableStatus"] == "Stopping"
    gone = kv.vm_step(a_vm(**halt), None, launched=False)
    assert gone.create is None and not gone.delete_vmi
    assert gone.status == {"created": False, "ready": False, "printableStatus": "Stopped"}


def test_a_vm_leaves_a_vmi_of_its_name_it_does_not_control_alone() -> None:
    stranger = a_vmi()
    for run in ({"runStrategy": "Always"}, {"runStrategy": "Halted"}):
        step = kv.vm_step(a_vm(**run), stranger, launched=False)
        assert step.create is None and not step.delete_vmi
        assert step.status["created"] is False


def test_a_failed_vmi_of_a_vm_is_not_restarted() -> None:
    step = kv.vm_step(a_vm(runStrategy="Always"), vmi_of_vm("Failed"), launched=False)
    assert step.create is None and not step.delete_vmi
    assert step.status == {"created": True, "ready": False, "printableStatus": "Stopped"}


def test_a_target_pod_being_deleted_is_waited_for_not_deleted_again() -> None:
    w = World(a_vmi(), a_migration())
    for _ in range(3):
        w.step()
    w.pods["virt-launcher-vm-a-t1"]["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:09Z"
    step = w.step(now=T0 + 3600)
    assert step.delete_pods == () and step.events == () and w.phase == "Scheduling"
    del w.pods["virt-launcher-vm-a-t1"]
    w.step(now=T0 + 3601)
    assert w.phase == "Failed"
