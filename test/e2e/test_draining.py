"""Drain-aware holds on the real control plane: cordoning a node moves its idle holds to
other nodes with room, leaves (and reports) the claims of running VMs, and reports a hold
that fits nowhere; the suite's over-allocation check closes every test."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pykube
import pytest

from gpuoperator.kinds import GPUClaim
from harness.claims import (
    bound_node,
    claim_status,
    create_claim,
    event_messages,
    node_report,
    start_vm,
)
from harness.fleet import Fleet, published
from harness.kube import Obj
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator

CONVERGE = 30.0


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


def order(api: pykube.HTTPClient, ns: str, name: str, cls: str, count: int) -> str:
    create_claim(api, ns, name, cls, count)
    return bound_node(api, ns, name)


def cordon(api: pykube.HTTPClient, node: str) -> None:
    obj = pykube.Node.objects(api).get(name=node)
    obj.patch({"spec": {"unschedulable": True}})


def test_cordoning_moves_idle_holds_and_reports_the_running_vm(
    api: pykube.HTTPClient, kubeconfig: Path, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    first, other = fleet.node(4), fleet.node(4)
    published(api, cls, 4)
    # Binpack puts all three on the first node (least free that fits, ties by name).
    assert [order(api, tenant, n, cls, 1) for n in ("idle-1", "idle-2", "run")] == [first] * 3
    start_vm(api, tenant, "vm-1", "run", timeout=CONVERGE)

    cordon(api, first)
    for name in ("idle-1", "idle-2"):
        bound_node(api, tenant, name, other)
        moved = wait_for(
            f"the Moved event on {name}",
            partial(event_messages, api, tenant, name, "Moved"),
            timeout=CONVERGE,
        )
        assert moved == [f"moved from {first} to {other}: node cordoned"]
    assert claim_status(api, tenant, "run")["nodeName"] == first

    blocked = wait_for(
        "the DrainBlocked event on the node",
        lambda: event_messages(api, "default", first, "DrainBlocked"),
        timeout=CONVERGE,
    )
    assert f"{tenant}/vm-1 (running; claim run, 1 unit(s))" in blocked[0]
    report = node_report(kubeconfig, first)
    assert f"NODE {first}: cordoned" in report
    row = next(line.split() for line in report.splitlines() if line.startswith(tenant))
    assert row[:5] == [tenant, "run", cls, "1", "vm-1"]
    assert "BLOCKS: VM running" in " ".join(row)
    assert f"BLOCKING THE DRAIN: 1 VM(s) of tenant(s) {tenant}: {tenant}/vm-1" in report


def cordoned_condition(api: pykube.HTTPClient, ns: str, name: str) -> Obj | None:
    found = claim_status(api, ns, name).get("conditions", [])
    return next((c for c in found if c["type"] == "NodeCordoned"), None)


def test_a_hold_that_fits_nowhere_stays_and_says_why_then_moves_when_room_frees(
    api: pykube.HTTPClient, kubeconfig: Path, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    first, other = fleet.node(4), fleet.node(4)
    published(api, cls, 4)
    assert order(api, tenant, "big", cls, 3) == first
    assert order(api, tenant, "filler", cls, 2) == other  # 1 free on the first: it goes on
    cordon(api, first)
    found = wait_for(
        "the NodeCordoned condition",
        partial(cordoned_condition, api, tenant, "big"),
        timeout=CONVERGE,
    )
    assert found is not None
    stuck = found
    assert stuck["reason"] == "CannotMove"
    assert (
        f"node {first} is cordoned and no other eligible node has 3 free units" in stuck["message"]
    )
    assert claim_status(api, tenant, "big")["nodeName"] == first
    assert "fits on no other eligible node now" in node_report(kubeconfig, first)
    assert event_messages(api, tenant, "big", "CannotMove")

    GPUClaim.objects(api, namespace=tenant).get(name="filler").delete()
    bound_node(api, tenant, "big", other)
    conditions = claim_status(api, tenant, "big").get("conditions", [])
    assert all(c["type"] != "NodeCordoned" for c in conditions)
