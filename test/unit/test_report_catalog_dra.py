"""``gpuoperator status`` on a ledger loaded from lists with a DRA class beside a
device-plugin one: the class's backend and free devices, and per node its devices,
allocated, tainted and free, with why a node is not eligible."""

from __future__ import annotations

import datetime

from gpuoperator import report
from gpuoperator.ledger import Ledger
from gpuoperator.model import claim_states, dra_devices, dra_holds
from harness import objects

DRIVER = objects.DRA_DRIVER
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_the_catalog_shows_a_dra_class_and_its_devices_per_node() -> None:
    dra_class = objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "a10.example.com"}})
    plugin_class = objects.gpuclass("a10")
    slice_1 = objects.resource_slice("d1", {"gpu-0": {}, "gpu-1": {}, "gpu-2": {}})
    slice_1["spec"]["devices"][2]["taints"] = [{"key": "bad", "effect": "NoExecute"}]
    held = {
        "metadata": {"namespace": "t", "name": "own"},
        "status": dra_holds.allocation([dra_devices.DeviceRef(DRIVER, "d1", "gpu-0")], "d1", NOW),
    }
    ledger = Ledger()
    ledger.load(
        nodes=[
            objects.node("n1", 4),
            objects.node("d1", {}),
            objects.node("d2", {}, cordoned=True),
        ],
        classes=[dra_class, plugin_class],
        resource_slices=[slice_1, objects.resource_slice("d2", {"gpu-0": {}})],
        device_classes=[
            {
                "metadata": {"name": "a10.example.com"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            }
        ],
        resource_claims=[held],
    )

    text = report.catalog(ledger, {"dra-a10": dra_class, "a10": plugin_class})

    lines = [line.split() for line in text.splitlines()]
    assert ["dra-a10", "passthrough", "dra:a10.example.com", "1", "1", "1"] in lines
    start = text.splitlines().index("DRA DEVICES")
    rows = lines[start + 1 :]
    assert rows[0][:7] == [
        "NODE",
        "CLASS",
        "DEVICECLASS",
        "DEVICES",
        "ALLOCATED",
        "TAINTED",
        "FREE",
    ]
    assert rows[1] == ["d1", "dra-a10", "a10.example.com", "3", "1", "1", "1", "-"]
    assert rows[2][:7] == ["d2", "dra-a10", "a10.example.com", "1", "0", "0", "1"]
    assert rows[2][7:] == ["Cordoned"]


def test_without_dra_devices_the_catalog_has_no_dra_section() -> None:
    ledger = Ledger()
    ledger.load(nodes=[objects.node("n1", 4)], classes=[objects.gpuclass("a10")])
    assert "DRA DEVICES" not in report.catalog(ledger, {"a10": objects.gpuclass("a10")})


def test_the_node_view_lists_dra_holds_on_unhealthy_devices_and_what_becomes_of_them() -> None:
    dra_class = objects.gpuclass("dra-a10", source={"dra": {"deviceClassName": "all.example.com"}})
    published = objects.resource_slice("d1", {"gpu-0": {}, "gpu-1": {}, "gpu-2": {}})
    for d in published["spec"]["devices"][:2]:
        d["taints"] = [{"key": "bad", "effect": "NoSchedule"}]

    def bound(name: str, device: str, **status: object) -> dict[str, object]:
        base = objects.claim(name, namespace="t", class_name="dra-a10", count=1)
        state = claim_states.dra_bound(
            base, "d1", name, [dra_devices.DeviceRef(DRIVER, "d1", device)], NOW
        )
        return {**base, "status": {**state, **status}}

    claims = [
        bound("idle", "gpu-0"),
        bound("serving", "gpu-1", attachment={"vmi": "vm-1", "uid": "u1"}),
        bound("fine", "gpu-2"),
    ]
    ledger = Ledger()
    ledger.load(
        nodes=[objects.node("d1", {})],
        classes=[dra_class],
        claims=claims,
        resource_slices=[published],
        device_classes=[{"metadata": {"name": "all.example.com"}, "spec": {}}],
    )
    vmis = {("t", "vm-1"): {"metadata": {"name": "vm-1", "namespace": "t", "uid": "u1"}}}

    text = report.node(ledger, {"dra-a10": dra_class}, "d1", claims, vmis)

    lines = text.splitlines()
    figures = lines.index("DRA DEVICES")
    assert lines[figures + 2].split() == ["dra-a10", "all.example.com", "3", "3", "2", "0"]
    start = lines.index("HOLDS ON UNHEALTHY DEVICES")
    rows = lines[start + 2 :]
    assert len(rows) == 2
    assert rows[0].split()[:5] == ["t", "idle", "dra-a10", f"{DRIVER}/d1/gpu-0", "DeviceTainted"]
    assert "moves" in rows[0]
    assert rows[1].split()[:2] == ["t", "serving"] and "STAYS: serves VM t/vm-1" in rows[1]
