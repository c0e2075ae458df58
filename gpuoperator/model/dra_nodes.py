"""A node's devices of each DRA class, as its GPUNode reports them (docs/design.md §2
GPUNode, §5 "DRA classes").

Beside the device-plugin resources (``status.devices``), ``GPUNode.status.draDevices`` has
one entry per DRA class with devices on the node: ``{name, deviceClassName, count,
allocated, tainted, free}``, from the class's inventory (``dra_devices.Inventory``, with the
counted claims' devices held, ``dra_holds.counted_inventory``):

* ``count``: the devices of the node that every selector of the class's DeviceClass accepts;
* ``allocated``: those an allocation (or a Bound claim's ``status.devices``) holds;
* ``tainted``: those with a ``NoSchedule`` or ``NoExecute`` device taint, held or not;
* ``free``: neither held nor tainted (what a new claim may take).

A device both held and tainted counts in both, so ``allocated + tainted + free`` exceeds
``count`` exactly by the held devices that turned unhealthy (what device health moves off,
``model.dra_health``). Entries are sorted by class name; a class without devices on the node
has none. At most :data:`MAX_ENTRIES` (the CRD's ``maxItems``), the first by name.

Pure: plain values in, new dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypedDict

from gpuoperator.model import dra_devices

#: The most entries ``GPUNode.status.draDevices`` lists (the CRD's ``maxItems``).
MAX_ENTRIES: Final = 64


class DraFigures(TypedDict):
    """One entry of ``GPUNode.status.draDevices``."""

    name: str
    deviceClassName: str
    count: int
    allocated: int
    tainted: int
    free: int


def figures(class_name: str, device_class_name: str, node: dra_devices.NodeDevices) -> DraFigures:
    """The figures of ``class_name``'s devices on one node (the module's rules)."""
    return DraFigures(
        name=class_name,
        deviceClassName=device_class_name,
        count=len(node.devices),
        allocated=sum(1 for d in node.devices if d.held),
        tainted=sum(1 for d in node.devices if d.tainted),
        free=node.free,
    )


def node_figures(
    node_name: str, classes: Mapping[str, tuple[str, dra_devices.Inventory]]
) -> list[DraFigures]:
    """``GPUNode.status.draDevices`` of ``node_name``: ``classes`` maps each DRA class's
    name to its DeviceClass's name and its inventory."""
    out = []
    for class_name in sorted(classes):
        device_class_name, inventory = classes[class_name]
        view = inventory.nodes.get(node_name)
        if view is not None and view.devices:
            out.append(figures(class_name, device_class_name, view))
    return out[:MAX_ENTRIES]
