"""The transient hold a claim carries while its VM migrates, as read from its status."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import migrations
from harness import objects


def test_a_recorded_transient_hold_is_read_back_as_written() -> None:
    hold = migrations.TransientHold(uid="0b6c-uid", target_node="gpu-2")
    claim = {
        "status": {"phase": "Bound", "nodeName": "gpu-1", "migration": migrations.as_status(hold)}
    }
    assert migrations.transient_hold(claim) == hold
    assert claim["status"]["migration"] == {"uid": "0b6c-uid", "targetNode": "gpu-2"}


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"migration": None},
        {"migration": "gpu-2"},
        {"migration": {"uid": "u"}},
        {"migration": {"targetNode": "gpu-2"}},
        {"migration": {"uid": "", "targetNode": "gpu-2"}},
        {"migration": {"uid": 7, "targetNode": "gpu-2"}},
    ],
)
def test_a_claim_without_a_complete_transient_hold_has_none(status: dict[str, Any]) -> None:
    assert migrations.transient_hold({"status": status}) is None
    assert migrations.transient_hold({}) is None


# -- the objects read -----------------------------------------------------------------------

TARGET_POD: dict[str, Any] = objects.launcher_pod(migration=True, gated=False)
HOLD = migrations.TransientHold(uid="uid-mig1", target_node="n2")


def test_a_migration_object_is_read_with_its_vmi_and_phase() -> None:
    found = migrations.migration(objects.vmim(phase="Running"))
    assert found == migrations.Migration(objects.NS, "mig1", "uid-mig1", "vm1", "Running", False)
    assert not found.finished
    assert migrations.migration(objects.vmim(phase="Failed")).finished  # type: ignore[union-attr]
    assert migrations.migration({"metadata": {"name": "m", "uid": "u"}, "spec": {}}) is None


def test_a_vmis_migration_state_is_read_as_virt_controller_writes_it() -> None:
    vmi = objects.vmi(phase="Running")
    assert migrations.migration_state(vmi) is None
    vmi["status"]["migrationState"] = objects.migration_state(completed=True)
    assert migrations.migration_state(vmi) == migrations.MigrationState(
        "uid-mig1", "n2", completed=True, failed=False, aborted=False
    )


# -- which VMs -------------------------------------------------------------------------------

VGPU = objects.gpuclass("v", mode="vgpu")
PASS = objects.gpuclass("p", mode="passthrough")


def running(node: str = "n1", **kwargs: Any) -> dict[str, Any]:
    vmi = objects.vmi(phase="Running", **kwargs)
    vmi["status"]["nodeName"] = node
    return vmi


@pytest.mark.parametrize(
    ("vmi", "claims", "classes", "why"),
    [
        pytest.param(running(), {"c": {"n1"}}, {"c": VGPU}, "", id="vgpu-bound-on-its-node"),
        pytest.param(
            running(), {"c": {"n1"}, "d": {"n1"}}, {"c": VGPU, "d": VGPU}, "", id="two-vgpu-claims"
        ),
        pytest.param(
            running(devices={"hostDevices": [{"name": "h", "deviceName": "x/y"}]}),
            {"c": {"n1"}},
            {"c": VGPU},
            "host devices",
            id="passthrough-host-devices",
        ),
        pytest.param(
            {**running(), "spec": {"resourceClaims": [{"name": "gpuop-0"}]}},
            {"c": {"n1"}},
            {"c": VGPU},
            "DRA resource claims",
            id="dra-resource-claims",
        ),
        pytest.param(running(), {"c": {"n1"}}, {"c": PASS}, "only vgpu", id="passthrough-class"),
        pytest.param(
            running(),
            {"c": {"n1"}},
            {
                "c": objects.gpuclass("d", mode="vgpu")
                | {"spec": {"mode": "vgpu", "source": {"dra": {"deviceClassName": "x"}}}}
            },
            "DRA class",
            id="dra-class",
        ),
        pytest.param(running(), {"c": {"n2"}}, {"c": VGPU}, "not Bound", id="bound-elsewhere"),
        pytest.param(running(), {"c": set()}, {"c": VGPU}, "not Bound", id="not-bound"),
        pytest.param(running(), {}, {"c": VGPU}, "does not exist", id="claim-missing"),
        pytest.param(running(), {"c": {"n1"}}, {"c": None}, "does not exist", id="class-missing"),
        pytest.param(
            objects.vmi(phase="Scheduling"), {"c": {"n1"}}, {"c": VGPU}, "no node", id="no-node"
        ),
    ],
)
def test_which_vms_get_transient_holds(
    vmi: dict[str, Any],
    claims: dict[str, set[str]],
    classes: dict[str, Any],
    why: str,
) -> None:
    counted = {
        name: objects.claim(
            name, phase="Bound" if nodes else "Pending", node=next(iter(nodes), None)
        )
        for name, nodes in claims.items()
    }
    said = migrations.refusal(vmi, ["c", *sorted(set(claims) - {"c"})], counted, classes)
    assert (why in said) if why else said == ""
    assert bool(said) == bool(why)


# -- how it ends -----------------------------------------------------------------------------

RUNNING = migrations.migration(objects.vmim(phase="Running"))
PENDING = migrations.migration(objects.vmim(phase="Pending"))


@pytest.mark.parametrize(
    ("found", "state", "target_pods", "end", "reason"),
    [
        pytest.param(
            RUNNING,
            objects.migration_state(completed=True),
            [],
            "Migrated",
            "Migrated",
            id="completed-on-the-target",
        ),
        pytest.param(
            None,
            objects.migration_state(completed=True),
            [],
            "Migrated",
            "Migrated",
            id="completed-then-the-object-went",
        ),
        pytest.param(
            RUNNING,
            objects.migration_state(target="n3", completed=True),
            [TARGET_POD],
            "Cleared",
            "TargetMismatch",
            id="completed-elsewhere",
        ),
        pytest.param(
            RUNNING,
            objects.migration_state(completed=True, failed=True),
            [TARGET_POD],
            "Cleared",
            "MigrationFailed",
            id="state-failed",
        ),
        pytest.param(
            RUNNING,
            objects.migration_state(aborted=True),
            [TARGET_POD],
            "Cleared",
            "MigrationAborted",
            id="aborted",
        ),
        pytest.param(None, None, [TARGET_POD], "Cleared", "MigrationGone", id="object-gone"),
        pytest.param(
            migrations.migration(objects.vmim(uid="uid-other", phase="Running")),
            None,
            [TARGET_POD],
            "Cleared",
            "MigrationGone",
            id="another-object-of-that-name",
        ),
        pytest.param(
            migrations.migration(objects.vmim(phase="Failed")),
            None,
            [TARGET_POD],
            "Cleared",
            "MigrationFailed",
            id="object-failed",
        ),
        pytest.param(RUNNING, None, [], "Cleared", "TargetPodGone", id="target-pod-gone"),
        pytest.param(
            RUNNING,
            None,
            [{**TARGET_POD, "status": {"phase": "Failed"}}],
            "Cleared",
            "TargetPodGone",
            id="target-pod-failed",
        ),
        pytest.param(PENDING, None, [], "Kept", "", id="target-pod-not-made-yet"),
        pytest.param(RUNNING, None, [TARGET_POD], "Kept", "", id="running"),
        pytest.param(
            migrations.migration(objects.vmim(phase="Succeeded")),
            None,
            [TARGET_POD],
            "Kept",
            "",
            id="succeeded-waits-for-the-vmis-state",
        ),
        pytest.param(
            migrations.migration(objects.vmim(phase="Running", deleting=True)),
            None,
            [TARGET_POD],
            "Kept",
            "",
            id="being-deleted-waits-until-gone",
        ),
        pytest.param(
            RUNNING,
            objects.migration_state(uid="uid-older", completed=True),
            [TARGET_POD],
            "Kept",
            "",
            id="an-older-migrations-state-says-nothing",
        ),
    ],
)
def test_how_a_transient_hold_ends(
    found: migrations.Migration | None,
    state: dict[str, Any] | None,
    target_pods: list[dict[str, Any]],
    end: str,
    reason: str,
) -> None:
    vmi = running()
    if state is not None:
        vmi["status"]["migrationState"] = state
    verdict = migrations.verdict(HOLD, found, migrations.migration_state(vmi), target_pods)
    assert (verdict.end.value, verdict.reason) == (end, reason)
    assert bool(verdict.message) == bool(reason)


@pytest.mark.parametrize(
    ("phase", "deleting", "state", "holds"),
    [
        pytest.param("", False, None, True, id="new"),
        pytest.param("Pending", False, None, True, id="pending"),
        pytest.param("Scheduling", False, None, True, id="target-pod-gated"),
        pytest.param("Scheduled", False, None, False, id="target-pod-placed-without-holds"),
        pytest.param("Running", False, None, False, id="running"),
        pytest.param("Failed", False, None, False, id="failed"),
        pytest.param("Succeeded", False, None, False, id="succeeded"),
        pytest.param("Pending", True, None, False, id="being-deleted"),
        pytest.param(
            "Pending", False, objects.migration_state(aborted=True), False, id="ended-per-the-vmi"
        ),
        pytest.param(
            "Pending",
            False,
            objects.migration_state(uid="uid-older", failed=True),
            True,
            id="an-older-migration-ended",
        ),
    ],
)
def test_a_migration_is_held_only_before_its_target_pod_is_placed(
    phase: str, deleting: bool, state: dict[str, Any] | None, holds: bool
) -> None:
    found = migrations.migration(objects.vmim(phase=phase or None, deleting=deleting))
    assert found is not None
    vmi = running()
    if state is not None:
        vmi["status"]["migrationState"] = state
    assert migrations.may_hold(found, migrations.migration_state(vmi)) is holds
