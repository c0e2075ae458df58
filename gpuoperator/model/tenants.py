"""Tenant entitlement (docs/design.md §3): a namespace may order ``vgpu`` classes only when it
carries the label ``gpu.cozystack.io/vgpu-entitled: "true"``.

The label lives on the Namespace, which only the hoster edits, so a tenant cannot grant
itself vGPU (and the license cost it brings). Any other value, or no label, is no
entitlement: the check fails closed.

Every function is pure and idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuoperator import names


def _labels(namespace_obj_or_labels: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not namespace_obj_or_labels:
        return {}
    meta = namespace_obj_or_labels.get("metadata")
    # A label value is always a string, so a mapping under "metadata" means a whole object.
    if isinstance(meta, Mapping):
        labels = meta.get("labels")
        return labels if isinstance(labels, Mapping) else {}
    return namespace_obj_or_labels


def vgpu_entitled(namespace_obj_or_labels: Mapping[str, Any] | None) -> bool:
    """Whether the namespace may order ``vgpu`` classes.

    Takes a Namespace object (with ``metadata.labels``) or its labels mapping; ``None`` (the
    namespace is not known) is not entitled.
    """
    return _labels(namespace_obj_or_labels).get(names.VGPU_ENTITLED_LABEL) == names.TRUE
