"""A node's devices of each DRA class as its GPUNode reports them (docs/design.md §2
GPUNode): counted, allocated, tainted and free, a held tainted device in both, per class
sorted by name, and no entry for a class without devices on the node.

The oracle is the hand-written slice and allocation, counted by hand."""

from __future__ import annotations

from gpuoperator.model import dra_devices, dra_nodes
from harness import objects

DRIVER = objects.DRA_DRIVER
SELECT_ALL = {
    "metadata": {"name": "all.example.com"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def tainted_slice() -> dict[str, object]:
    obj = objects.resource_slice("n1", {f"gpu-{i}": {} for i in range(4)})
    devices = obj["spec"]["devices"]
    devices[1]["taints"] = [{"key": "gpu.example.com/unhealthy", "effect": "NoSchedule"}]
    devices[2]["taints"] = [{"key": "gpu.example.com/unhealthy", "effect": "NoExecute"}]
    devices[3]["taints"] = [{"key": "gpu.example.com/soon", "effect": "PreferNoSchedule"}]
    return obj


def allocation(*devices: str) -> dict[str, object]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": d}
                        for d in devices
                    ]
                }
            }
        }
    }


def test_held_tainted_and_free_devices_are_counted_apart_and_a_held_tainted_one_in_both() -> None:
    # gpu-0 held, gpu-1 held and tainted, gpu-2 tainted, gpu-3 only PreferNoSchedule (free).
    inv = dra_devices.inventory([tainted_slice()], SELECT_ALL, [allocation("gpu-0", "gpu-1")])

    [entry] = dra_nodes.node_figures("n1", {"dra-a10": ("all.example.com", inv)})

    assert entry == {
        "name": "dra-a10",
        "deviceClassName": "all.example.com",
        "count": 4,
        "allocated": 2,
        "tainted": 2,
        "free": 1,
    }


def test_entries_are_sorted_by_class_and_a_class_without_devices_on_the_node_has_none() -> None:
    here = dra_devices.inventory([objects.resource_slice("n1", {"gpu-0": {}})], SELECT_ALL, [])
    elsewhere = dra_devices.inventory([objects.resource_slice("n2", {"gpu-0": {}})], SELECT_ALL, [])

    found = dra_nodes.node_figures(
        "n1",
        {
            "zeta": ("all.example.com", here),
            "alpha": ("all.example.com", here),
            "b": ("x", elsewhere),
        },
    )

    assert [e["name"] for e in found] == ["alpha", "zeta"]
    assert all(e["free"] == 1 and e["count"] == 1 for e in found)
