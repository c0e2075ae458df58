"""KubeVirt's host devices: the ``permittedHostDevices`` table and a VMI's own
``spec.domain.devices.hostDevices`` (docs/design.md §5 "VMs", §10).

When the KubeVirt CR sets ``spec.configuration.permittedHostDevices``, virt-controller
renders a launcher pod only for GPUs whose ``deviceName`` the table lists (under
``pciHostDevices`` or ``mediatedDevices``); virt-api does not check it, so an unlisted GPU
leaves the VMI stuck. The VMI webhook therefore refuses a class whose resource the table
does not permit. An unset table permits everything; a set but empty table permits nothing.
Newer KubeVirt also reads ``usb`` entries here; a GPU is never a USB device, so they are not
counted (which stays correct for every KubeVirt version).

A VMI with claim references may not also name a GPU resource (the resourceName of any
class) in ``spec.domain.devices.hostDevices``: virt-controller would add those units to the
launcher pod beside the claims' units, a GPU nobody ordered. :func:`gpu_host_devices` finds
such entries for the VMI webhook's refusal.

Every function is pure and idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

Obj = dict[str, Any]

_GPU_SECTIONS = ("pciHostDevices", "mediatedDevices")


def permitted_resources(kubevirt: Obj | None) -> frozenset[str] | None:
    """The resource names the table permits; ``None`` when there is no table (no KubeVirt
    CR, or ``permittedHostDevices`` unset): everything is permitted."""
    if not kubevirt:
        return None
    configuration = (kubevirt.get("spec") or {}).get("configuration") or {}
    table = configuration.get("permittedHostDevices")
    if not isinstance(table, dict):
        return None
    permitted: set[str] = set()
    for section in _GPU_SECTIONS:
        for entry in table.get(section) or []:
            if isinstance(entry, dict) and entry.get("resourceName"):
                permitted.add(str(entry["resourceName"]))
    return frozenset(permitted)


def is_permitted(resource: str, permitted: frozenset[str] | None) -> bool:
    """Whether a VM may use ``resource`` under the table read by :func:`permitted_resources`."""
    return permitted is None or resource in permitted


def gpu_host_devices(
    vmi: Mapping[str, Any], gpu_resources: Collection[str]
) -> list[tuple[str, str]]:
    """``(name, deviceName)`` of each ``spec.domain.devices.hostDevices`` entry of ``vmi``
    whose ``deviceName`` is one of ``gpu_resources``, in order."""
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, Mapping) else None
    devices = domain.get("devices") if isinstance(domain, Mapping) else None
    entries = devices.get("hostDevices") if isinstance(devices, Mapping) else None
    found: list[tuple[str, str]] = []
    for entry in entries if isinstance(entries, list) else ():
        device = entry.get("deviceName") if isinstance(entry, Mapping) else None
        if isinstance(device, str) and device in gpu_resources:
            found.append((str(entry.get("name") or ""), device))
    return found
