"""What every Kubernetes object has, read once: its ``(namespace, name)`` key.

The runtime's caches and work queues, the model's ledger and plans and the controllers all
identify an object by this one key, so it is defined here, in a module that imports nothing
of the product: the runtime (generic) and the model (pure) can both use it. Pure and
idempotent.
"""

from collections.abc import Mapping
from typing import Any

#: ``(namespace, name)`` of an object (``""`` for a cluster-scoped one's namespace).
Key = tuple[str, str]


def key(obj: Mapping[str, Any]) -> Key:
    """The ``(namespace, name)`` key of an object (``""`` for what it does not carry)."""
    meta = obj.get("metadata")
    # A plain dict (every cached object) skips the abstract-class check: caches key each event.
    if type(meta) is not dict and not isinstance(meta, Mapping):
        return ("", "")
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata`` (empty when absent or not an object)."""
    return _mapping((obj or {}).get("metadata"))


def labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata.labels`` (empty when absent or not an object)."""
    return _mapping(meta(obj).get("labels"))


def annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``metadata.annotations`` (empty when absent or not an object)."""
    return _mapping(meta(obj).get("annotations"))
