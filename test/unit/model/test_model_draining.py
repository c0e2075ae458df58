"""What a drain does with each claim bound to a cordoned node: idle holds move, claims
serving VMs block, claims being deleted release; oldest first."""

from __future__ import annotations

from typing import Any

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
