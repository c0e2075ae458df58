"""Which of two states of one object is newer, by resourceVersion.

A controller that wrote an object reads it back from its informer's cache, which may not
have delivered the write yet; :func:`newest` picks the server's reply to the write until the
cache has caught up with it.
"""

from __future__ import annotations

from gpuoperator.runtime.client import Obj


def resource_version(obj: Obj) -> int | None:
    """The object's resourceVersion as a number, for "which is newer" (etcd revisions are
    integers); ``None`` when it is absent or not a number."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def newest(cached: Obj | None, written: Obj | None) -> Obj | None:
    """The newer of a cached object and the server's reply to our own write of it: the
    write while the cache has not delivered it yet (same uid, higher resourceVersion), else
    the cache (``None`` when the cache no longer has it)."""
    if cached is None or written is None:
        return cached
    if (cached.get("metadata") or {}).get("uid") != (written.get("metadata") or {}).get("uid"):
        return cached
    mine, seen = resource_version(written), resource_version(cached)
    if mine is not None and seen is not None and mine > seen:
        return written
    return cached
