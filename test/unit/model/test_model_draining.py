"""What a drain does with each claim bound to a cordoned node: idle holds move, claims
serving VMs block, claims being deleted release; oldest first."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import draining
from gpuoperator.model.draining import Hold, Role


def claim(name: str, second: int, node: str = "n1", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "t", "creationTimestamp": f"2026-01-01T00:00:{second:02d}Z"}
    status = {"phase": "Bound", "nodeName": node, **extra.pop("status", {})}
    return {
        "metadata": {**meta, **extra},
        "spec": {"className": "a10", "count": 2},
        "status": status,
    }


def vmi(name: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "t", "uid": "v1"}, "status": {"phase": phase}}


def test_only_a_cordoned_node_drains() -> None:
    assert draining.draining({"metadata": {"name": "n1"}, "spec": {"unschedulable": True}})
    assert not draining.draining({"metadata": {"name": "n1"}, "spec": {}})
    assert not draining.draining(None)


def test_each_claim_on_the_node_in_order_of_creation() -> None:
    claims = [
        claim("running", 3, status={"attachment": {"vmi": "vm", "uid": "v1"}}),
        claim("idle", 1),
        claim("starting", 4, status={"attachment": {"vmi": "vm2"}}),
        claim("deleted", 2, deletionTimestamp="2026-01-01T01:00:00Z"),
        claim("elsewhere", 0, node="n2"),
        {**claim("pending", 0), "status": {"phase": "Pending"}},
    ]
    vmis = {("t", "vm"): vmi("vm", "Running"), ("t", "vm2"): vmi("vm2", "Scheduling")}
    assert draining.holds_on("n1", claims, vmis) == [
        Hold(("t", "idle"), "a10", 2, Role.MOVABLE),
        Hold(("t", "deleted"), "a10", 2, Role.RELEASING),
        Hold(("t", "running"), "a10", 2, Role.BLOCKING, "vm", running=True),
        Hold(("t", "starting"), "a10", 2, Role.BLOCKING, "vm2", running=False),
    ]


def test_a_template_claim_blocks_while_its_vmi_exists() -> None:
    template = claim(
        "vm-gpu-0",
        1,
        labels={"gpu.cozystack.io/template-claim": "true"},
        ownerReferences=[
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": "vm",
                "uid": "v1",
                "controller": True,
            }
        ],
    )
    held = draining.hold(template, vmi("vm", "Running"))
    assert (held.role, held.vmi, held.running) == (Role.BLOCKING, "vm", True)


def test_messages_say_where_from_where_to_and_why() -> None:
    assert draining.moved_message("n1", "n2") == "moved from n1 to n2: node cordoned"
    assert draining.stuck_message("n1", 1, "nvidia.com/A10").startswith(
        "node n1 is cordoned and no other eligible node has 1 free unit of nvidia.com/A10 now"
    )
    holds = [
        Hold(("t", "c"), "a10", 1, Role.BLOCKING, "vm", running=True),
        Hold(("t", "i"), "a10", 1, Role.MOVABLE),
        Hold(("u", "d"), "a10", 2, Role.BLOCKING, "vm2"),
    ]
    assert draining.blocking_text(holds) == (
        "t/vm (running; claim c, 1 unit(s)), u/vm2 (not running; claim d, 2 unit(s))"
    )


# -- live migration (docs/design.md §5 "Live migration") -----------------------------------

VGPU: dict[str, Any] = {"metadata": {"name": "l40s"}, "spec": {"mode": "vgpu"}}
PASSTHROUGH = {"metadata": {"name": "a10"}, "spec": {"mode": "passthrough"}}
DRA = {"metadata": {"name": "a10-dra"}, "spec": {"source": {"dra": {"deviceClassName": "d"}}}}
CLASSES: dict[str, dict[str, Any]] = {"l40s": VGPU, "a10": PASSTHROUGH, "a10-dra": DRA}
VGPU_SPEC = {"className": "l40s", "count": 1}


def live_vmi(
    *, strategy: str | None = "LiveMigrate", phase: str = "Running", node: str = "n1"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vm",
            "namespace": "t",
            "uid": "v1",
            "labels": {"gpu.cozystack.io/claims": "true"},
            "annotations": {
                "gpu.cozystack.io/claims": (
                    '[{"claim":"held"},{"claimTemplate":{"className":"l40s","count":1}}]'
                )
            },
        },
        "spec": {} if strategy is None else {"evictionStrategy": strategy},
        "status": {"phase": phase, "nodeName": node},
    }


def vm_claims(**classes: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for name in ("held", "vm-gpu-1"):
        c = claim(name, 1)
        c["spec"]["className"] = classes.get(name.replace("-", "_"), "l40s")
        out[("t", name)] = c
    return out


def refusal(vmi: dict[str, Any] | None, claims: Any = None, kubevirt: Any = None) -> str:
    found = vm_claims() if claims is None else claims
    return draining.migration_refusal(vmi, kubevirt, "n1", found.get, CLASSES)


def test_a_running_vgpu_vm_with_live_migrate_migrates() -> None:
    assert refusal(live_vmi()) == ""
    assert refusal(live_vmi(phase="Scheduled")) == ""  # its launcher pod runs


@pytest.mark.parametrize(
    ("vmi_strategy", "cluster", "migrates"),
    [
        pytest.param("LiveMigrate", None, True, id="vm"),
        pytest.param(None, "LiveMigrate", True, id="cluster-wide"),
        pytest.param("None", "LiveMigrate", False, id="vm-overrides-cluster"),
        pytest.param(None, None, False, id="neither"),
        pytest.param("LiveMigrateIfPossible", None, False, id="another-strategy"),
    ],
)
def test_the_vms_strategy_else_the_clusters(
    vmi_strategy: str | None, cluster: str | None, migrates: bool
) -> None:
    kubevirt = {"spec": {"configuration": {"evictionStrategy": cluster}}} if cluster else None
    why = refusal(live_vmi(strategy=vmi_strategy), kubevirt=kubevirt)
    assert (why == "") is migrates
    if not migrates:
        assert "evictionStrategy is" in why


@pytest.mark.parametrize(
    ("vmi", "claims", "words"),
    [
        pytest.param(None, None, "not known", id="no-vmi"),
        pytest.param(
            live_vmi(phase="Scheduling"), None, "is Scheduling: only a running", id="starting"
        ),
        pytest.param(live_vmi(node="n2"), None, "runs on n2", id="elsewhere"),
        pytest.param(
            live_vmi(), {("t", "held"): vm_claims()[("t", "held")]}, "claim vm-gpu-1 does not exist"
        ),
        pytest.param(
            live_vmi(),
            {**vm_claims(), ("t", "held"): {**claim("held", 1, node="n2"), "spec": VGPU_SPEC}},
            "claim held is not Bound to the VM's node n1",
            id="split",
        ),
        pytest.param(
            live_vmi(),
            vm_claims(held="a10"),
            "in mode passthrough; only vgpu classes live-migrate",
            id="passthrough",
        ),
        pytest.param(live_vmi(), vm_claims(vm_gpu_1="a10-dra"), "is of DRA class", id="dra"),
        pytest.param(
            live_vmi(),
            vm_claims(held="gone"),
            "the class of claim held does not exist",
            id="class-unknown",
        ),
    ],
)
def test_what_keeps_a_vm_from_migrating(vmi: Any, claims: Any, words: str) -> None:
    assert words in refusal(vmi, claims)


def test_a_migrating_vm_makes_its_running_claims_migrating_not_blocking() -> None:
    claims = list(vm_claims().values())
    for c in claims:
        c["status"]["attachment"] = {"vmi": "vm", "uid": "v1"}
    vmis = {("t", "vm"): live_vmi()}
    migrating = draining.migrating_vmis("n1", claims, vmis, None, vm_claims().get, CLASSES)
    assert migrating == {("t", "vm")}
    holds = draining.holds_on("n1", claims, vmis, migrating)
    assert {h.role for h in holds} == {Role.MIGRATING}
    assert draining.blocking_text(holds) == ""
    assert {h.role for h in draining.holds_on("n1", claims, vmis)} == {Role.BLOCKING}


def migration(name: str, vmi: str, phase: str | None, created: str) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "t",
            "uid": f"u-{name}",
            "creationTimestamp": created,
        },
        "spec": {"vmiName": vmi},
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def test_migrations_in_flight_on_a_node_as_source_or_target() -> None:
    vmis = {
        ("t", "on-n1"): live_vmi(node="n1"),
        ("t", "on-n3"): live_vmi(node="n3"),
    }
    to_n1 = claim("c3", 1, node="n3", status={"migration": {"uid": "u-m3", "targetNode": "n1"}})
    to_n1["status"]["attachment"] = {"vmi": "on-n3", "uid": "v3"}
    from_n1 = claim("c1", 1, status={"migration": {"uid": "u-m1", "targetNode": "n2"}})
    from_n1["status"]["attachment"] = {"vmi": "on-n1", "uid": "v1"}
    found = draining.in_flight(
        "n1",
        [
            migration("m1", "on-n1", "Running", "2026-01-01T00:00:02Z"),
            migration("m3", "on-n3", None, "2026-01-01T00:00:01Z"),
            migration("done", "on-n1", "Succeeded", "2026-01-01T00:00:00Z"),
            migration("failed", "on-n1", "Failed", "2026-01-01T00:00:00Z"),
        ],
        vmis,
        [to_n1, from_n1],
    )
    assert [(f.key[1], f.source, f.target, f.claims) for f in found] == [
        ("m3", "n3", "n1", ("c3",)),
        ("m1", "n1", "n2", ("c1",)),
    ]


def test_the_migration_the_drain_creates() -> None:
    assert draining.migration_object("t", "vm", "n1") == {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": {
            "generateName": "vm-drain-",
            "namespace": "t",
            "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
            "annotations": {"gpu.cozystack.io/drained-node": "n1"},
        },
        "spec": {"vmiName": "vm"},
    }
