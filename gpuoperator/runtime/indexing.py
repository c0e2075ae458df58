"""The store an informer keeps: a thread-safe map of key → object, with secondary indexes.

An index maps an index value to the keys of the objects that have it, kept in step with
every change: by namespace, by label, by ``status.nodeName``, by ``spec.className``... An
index function returns the values one object is filed under (none, one or several).

Keys are ``(namespace, name)`` with ``""`` for cluster-scoped objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from gpuoperator.model import objects
from gpuoperator.runtime.client import Obj

Key = objects.Key
IndexFunc = Callable[[Obj], Iterable[str]]


#: The object key, defined once for the runtime and the model.
key_of = objects.key


# ---- index functions ----------------------------------------------------------------------
def by_namespace(obj: Obj) -> Iterable[str]:
    ns = (obj.get("metadata") or {}).get("namespace")
    return [ns] if ns else []


def by_label(label: str) -> IndexFunc:
    def index(obj: Obj) -> Iterable[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return [value] if value is not None else []

    return index


def by_field(*path: str) -> IndexFunc:
    """Index by a nested string field, e.g. ``by_field("status", "nodeName")``."""

    def index(obj: Obj) -> Iterable[str]:
        node: Any = obj
        for part in path:
            if not isinstance(node, dict):
                return []
            node = node.get(part)
        return [node] if isinstance(node, str) and node else []

    return index


class Store:
    """A thread-safe map of key → object with secondary indexes.

    Invariant: for every index, ``value → keys`` holds exactly the keys of the stored
    objects whose index function returns ``value`` (updated under one lock with the map).
    Readers get the stored objects themselves: treat them as read-only.
    """

    def __init__(self, indexers: dict[str, IndexFunc] | None = None) -> None:
        self._lock = threading.RLock()
        self._items: dict[Key, Obj] = {}
        self._indexers = dict(indexers or {})
        self._indexes: dict[str, dict[str, set[Key]]] = {n: {} for n in self._indexers}

    def held(self) -> AbstractContextManager[bool]:
        """The store's lock, for a caller that must see it unchanged across several reads
        (an informer telling a new consumer what is cached): no other thread reads or
        writes the store meanwhile. Re-entrant: the holder may go on using the store."""
        return self._lock

    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __iter__(self) -> Iterator[Key]:
        """The keys, as a snapshot (safe while others write)."""
        return iter(self.keys())

    def by_index(self, index: str, value: str) -> list[Obj]:
        with self._lock:
            return [self._items[k] for k in self._indexes[index].get(value, ())]

    def index_keys(self, index: str, value: str) -> list[Key]:
        with self._lock:
            return list(self._indexes[index].get(value, ()))

    def index_values(self, index: str) -> list[str]:
        with self._lock:
            return [v for v, keys in self._indexes[index].items() if keys]

    def put(self, obj: Obj) -> Obj | None:
        """Store ``obj``; return the object it replaced, if any."""
        key = key_of(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            self._index(key, obj)
            return old

    def remove(self, key: Key) -> Obj | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
            return old

    def _index(self, key: Key, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            for value in fn(obj):
                self._indexes[name].setdefault(value, set()).add(key)

    def _unindex(self, key: Key, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indexes[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
