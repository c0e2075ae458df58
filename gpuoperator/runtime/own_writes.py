"""Reading one's own writes over a lagging cache.

A controller reads objects from its informer's cache, and the cache delivers a write only
after the watch brings it back. A reconcile that runs meanwhile would judge the version the
write replaced: a status write based on it is refused with a conflict, and an action the
write already took is taken again. :class:`OwnWrites` keeps the server's reply to each write
until the cache delivers that version or a newer one, and :meth:`OwnWrites.current` answers
the newer of the two (``informing.newest``: same UID, higher resourceVersion).

Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from gpuoperator.runtime.versions import newest

K = TypeVar("K", bound=Hashable)
Obj = dict[str, Any]


class OwnWrites(Generic[K]):
    """The objects a controller wrote, by key. Invariant: an entry is the reply to this
    controller's last write of that key, and it is dropped as soon as :meth:`current` sees a
    cached version at least as new (or another object of that name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[K, Obj] = {}

    def current(self, key: K, cached: Obj | None) -> Obj | None:
        """The object at ``key`` as it stands: the last write while ``cached`` is older, else
        ``cached`` (``None`` when the cache no longer has it). Once the cache has caught up,
        the write is forgotten."""
        with self._lock:
            found = newest(cached, self._written.get(key))
            if found is cached:
                self._written.pop(key, None)
            return found

    def wrote(self, key: K, reply: Obj) -> None:
        """Remember the server's ``reply`` to a write of ``key``."""
        with self._lock:
            self._written[key] = reply

    def forget(self, key: K) -> None:
        """Drop the write of ``key``: it failed (a conflict: the cache is to be read again) or
        the object is gone."""
        with self._lock:
            self._written.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._written
