"""``gpuoperator status --node N`` on a ledger loaded from lists: every claim bound to the
node with what a drain does with it, the tenants whose VMs block the drain, the VMs that
live-migrate instead and the migrations in flight on the node as source or target."""

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
    assert "BLOCKING THE DRAIN: 1 VM(s) of tenant(s) lab: lab/gpu-vm" in lines
    assert lines[-1] == "MIGRATIONS IN FLIGHT: none"


def test_an_unknown_node_says_so() -> None:
    ledger = Ledger()
    assert report.node(ledger, {}, "nope", [], {}) == (
        "node nope: not found, or it has no GPU resource"
    )


VGPU = {
    "metadata": {"name": "l40s"},
    "spec": {"mode": "vgpu", "source": {"devicePlugin": {"resourceName": RESOURCE}}},
}


def migrating_vmi(name: str, node_name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "lab",
            "uid": f"u-{name}",
            "labels": {"gpu.cozystack.io/claims": "true"},
            "annotations": {"gpu.cozystack.io/claims": f'[{{"claim":"{name}-hold"}}]'},
        },
        "spec": {"evictionStrategy": "LiveMigrate"},
        "status": {"phase": "Running", "nodeName": node_name},
    }


def test_the_node_view_lists_live_migrating_vms_and_migrations_in_flight_both_ways() -> None:
    ledger = Ledger()
    leaving = claim(
        "lab",
        "out-hold",
        1,
        1,
        attachment={"vmi": "out", "uid": "u-out"},
        migration={"uid": "u-m-out", "targetNode": "n2"},
    )
    arriving = claim(
        "lab",
        "in-hold",
        1,
        2,
        attachment={"vmi": "in", "uid": "u-in"},
        migration={"uid": "u-m-in", "targetNode": "n1"},
    )
    arriving["status"]["nodeName"] = "n3"
    for c in (leaving, arriving):
        c["spec"]["className"] = "l40s"
    ledger.load(
        nodes=[node("n1", 8, cordoned=True), node("n2", 8), node("n3", 8)],
        classes=[CLASS, VGPU],
        claims=[leaving, arriving],
    )
    vmis = {("lab", "out"): migrating_vmi("out", "n1"), ("lab", "in"): migrating_vmi("in", "n3")}
    migrations = [
        {
            "metadata": {
                "name": name,
                "namespace": "lab",
                "uid": f"u-{name}",
                "creationTimestamp": since,
            },
            "spec": {"vmiName": vmi},
            "status": {"phase": "Running"},
        }
        for name, vmi, since in (
            ("m-out", "out", "2026-01-01T00:01:00Z"),
            ("m-in", "in", "2026-01-01T00:02:00Z"),
        )
    ]
    text = report.node(
        ledger,
        {"a10": CLASS, "l40s": VGPU},
        "n1",
        [leaving],  # the claims bound to n1, as the CLI lists them
        vmis,
        migrations=migrations,
        clock=FakeClock(),
    )
    lines = text.splitlines()
    assert lines[2].split()[:2] == ["lab", "out-hold"]
    assert "LIVE-MIGRATES" in lines[2]
    assert "BLOCKING THE DRAIN: no VM" in lines
    start = lines.index("MIGRATIONS IN FLIGHT")
    table = [line.split() for line in lines[start + 1 : start + 4]]
    assert table[0] == ["NAMESPACE", "MIGRATION", "VM", "CLAIMS", "SOURCE", "->", "TARGET", "SINCE"]
    assert table[1] == ["lab", "m-out", "out", "out-hold", "n1", "->", "n2", "2026-01-01T00:01:00Z"]
    assert table[2] == ["lab", "m-in", "in", "in-hold", "n3", "->", "n1", "2026-01-01T00:02:00Z"]
