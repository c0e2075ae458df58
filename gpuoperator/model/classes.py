"""Reading a GPUClass (docs/design.md §2): the few facts every component needs from a class.

A class is the full custom resource as the API server returns it (``metadata``, ``spec``).
The schema already refuses malformed classes, so these readers only resolve what the schema
leaves open on purpose: ``spec.maxCount`` has no schema default, and a class's effective
maxCount is decided here once (1 for ``vgpu``, unlimited for ``passthrough``) so the order
webhook, the VMI webhook and the binder cannot disagree. The readers stay total on partial
objects (a missing field reads as empty) because caches may hold objects mid-update.

Every function is pure and idempotent: the same class gives the same answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

Obj = dict[str, Any]

PASSTHROUGH: Final = "passthrough"
VGPU: Final = "vgpu"

#: ``spec.maxCount`` resolved for a ``vgpu`` class that does not set it: one mediated device
#: per VM is what vGPU drivers support without extra licensing.
VGPU_DEFAULT_MAX_COUNT: Final = 1


def _spec(cls: Obj) -> Obj:
    spec = cls.get("spec")
    return spec if isinstance(spec, dict) else {}


def name(cls: Obj) -> str:
    """The class's name (``metadata.name``), ``""`` when absent."""
    meta = cls.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def resource_name(cls: Obj) -> str:
    """The extended resource the class's units are (``spec.source.devicePlugin.resourceName``).

    ``""`` when the class has no device-plugin source, as a DRA class has none (see `dra`):
    such a class serves no extended resource on any node, and every reader of node
    allocatable, pod requests and admission parameters passes it over.
    """
    source = _spec(cls).get("source")
    if not isinstance(source, dict):
        return ""
    plugin = source.get("devicePlugin")
    if not isinstance(plugin, dict):
        return ""
    return str(plugin.get("resourceName") or "")


@dataclasses.dataclass(frozen=True)
class DraSource:
    """A DRA class's source (``spec.source.dra``): which DeviceClass picks its devices, and
    which device attribute, if any, groups the devices of one node (docs/design.md §2)."""

    device_class_name: str
    topology_attribute: str | None = None


def dra(cls: Obj) -> DraSource | None:
    """The class's DRA source, ``None`` for a device-plugin class (or a class without a
    source, which the schema never lets through)."""
    source = _spec(cls).get("source")
    member = source.get("dra") if isinstance(source, dict) else None
    if not isinstance(member, dict):
        return None
    topology = member.get("topologyAttribute")
    return DraSource(
        device_class_name=str(member.get("deviceClassName") or ""),
        topology_attribute=str(topology) if isinstance(topology, str) and topology else None,
    )


def is_dra(cls: Obj) -> bool:
    """Whether the class's units are DRA devices held through ResourceClaims, not units of
    an extended resource (docs/design.md §2, §5 "DRA classes")."""
    return dra(cls) is not None


def backend(cls: Obj) -> str:
    """What serves the class, for people: its resource name, or ``dra:<DeviceClass>``."""
    source = dra(cls)
    return f"dra:{source.device_class_name}" if source is not None else resource_name(cls)


def mode(cls: Obj) -> str:
    """``passthrough`` or ``vgpu`` (``spec.mode``), ``""`` when absent."""
    return str(_spec(cls).get("mode") or "")


def preemptible(cls: Obj) -> bool:
    """Whether the class sells units a guaranteed order may take back
    (``spec.preemptible``, immutable; docs/design.md §5 "Preemptible classes")."""
    return _spec(cls).get("preemptible") is True


def is_vgpu(cls: Obj) -> bool:
    """Whether ordering the class needs the namespace's vGPU entitlement (docs/design.md §3)."""
    return mode(cls) == VGPU


def effective_max_count(cls: Obj) -> int | None:
    """The most units one claim of this class may order; ``None`` means unlimited.

    ``spec.maxCount`` when set; otherwise 1 for ``vgpu`` and unlimited for ``passthrough``
    (and for a class whose mode is missing, which the schema never lets through).
    """
    value = _spec(cls).get("maxCount")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if is_vgpu(cls):
        return VGPU_DEFAULT_MAX_COUNT
    return None


def tolerations(cls: Obj) -> list[Obj]:
    """The class's tolerations (``spec.tolerations``), copied onto launcher pods and used to
    judge node eligibility. Items that are not objects are dropped."""
    items = _spec(cls).get("tolerations")
    if not isinstance(items, list):
        return []
    return [t for t in items if isinstance(t, dict)]
