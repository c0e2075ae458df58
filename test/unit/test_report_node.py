"""``gpuoperator status --node N`` on a ledger loaded from lists: every claim bound to the
node with what a drain does with it, and the tenants whose VMs block the drain."""

from __future__ import annotations

from typing import Any

from gpuoperator import report
from gpuoperator.ledger import Ledger
from gpuoperator.runtime.clock import FakeClock

RESOURCE = "nvidia.com/GA102GL_A10"
CLASS = {
    "metadata": {"name": "a10"},
    "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
}


def node(name: str, units: int, *, cordoned: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "capacity": {RESOURCE: str(units)},
            "allocatable": {RESOURCE: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def claim(ns: str, name: str, count: int, second: int, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "creationTimestamp": f"2026-01-01T00:00:{second:02d}Z",
        },
        "spec": {"className": "a10", "count": count},
        "status": {"phase": "Bound", "nodeName": "n1", **status},
    }


def node_lines(*others: dict[str, Any]) -> list[str]:
    ledger = Ledger()
    claims = [
        claim("shop", "idle", 1, 1),
        claim("shop", "big", 3, 2),
        claim("lab", "train", 2, 3, attachment={"vmi": "gpu-vm", "uid": "u1"}),
    ]
    ledger.load(nodes=[node("n1", 8, cordoned=True), *others], classes=[CLASS], claims=claims)
    vmis = {
        ("lab", "gpu-vm"): {
            "metadata": {"name": "gpu-vm", "namespace": "lab", "uid": "u1"},
            "status": {"phase": "Running"},
        }
    }
    text = report.node(ledger, {"a10": CLASS}, "n1", claims, vmis, clock=FakeClock())
    return text.splitlines()


def test_the_node_view_names_every_hold_and_the_tenants_that_block_the_drain() -> None:
    lines = node_lines(node("n2", 2))
    assert lines[0] == "NODE n1: cordoned"
    assert lines[1].split() == ["NAMESPACE", "CLAIM", "CLASS", "UNITS", "VM", "DRAIN"]
    rows = {tuple(r.split()[:2]): " ".join(r.split()[5:]) for r in lines[2:5]}
    assert rows == {
        ("shop", "idle"): "idle hold; room on n2",
        ("shop", "big"): "idle hold; fits on no other eligible node now",
        ("lab", "train"): "BLOCKS: VM running",
    }
    assert lines[2].split()[:5] == ["shop", "idle", "a10", "1", "-"]
    assert lines[-1] == "BLOCKING THE DRAIN: 1 VM(s) of tenant(s) lab: lab/gpu-vm"


def test_an_unknown_node_says_so() -> None:
    ledger = Ledger()
    assert report.node(ledger, {}, "nope", [], {}) == (
        "node nope: not found, or it has no GPU resource"
    )
