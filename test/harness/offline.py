"""Cluster-less doubles for unit tests of webhooks: shared caches backed by real ``Store``s
(fill them with ``caches.<kind>.store.put``), and a JSON-patch applier for checking the
patches webhooks return."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, cast

from gpuoperator.caches import BY_CLASS, BY_NAMESPACE, Caches
from gpuoperator.runtime import informing
from gpuoperator.runtime.informing import Informer, Store

Obj = dict[str, Any]


class StoreInformer:
    """What webhooks read of an informer: its store."""

    def __init__(self, indexers: dict[str, informing.IndexFunc] | None = None) -> None:
        self.store = Store(indexers)


def store_caches(classes: Iterable[Obj] = (), claims: Iterable[Obj] = ()) -> Caches:
    """The operator's shared caches with the production indexes, but no API server."""

    def informer(**indexers: informing.IndexFunc) -> Informer:
        return cast(Informer, StoreInformer(indexers))

    ns = informing.by_namespace
    caches = Caches(
        nodes=informer(),
        pods=informer(**{BY_NAMESPACE: ns}),
        classes=informer(),
        claims=informer(**{BY_NAMESPACE: ns, BY_CLASS: informing.by_field("spec", "className")}),
        gpunodes=informer(),
        kubevirts=informer(),
        namespaces=informer(),
        quotas=informer(**{BY_NAMESPACE: ns}),
        workloads=informer(**{BY_NAMESPACE: ns}),
        vmis=informer(**{BY_NAMESPACE: ns}),
    )
    for cls in classes:
        caches.classes.store.put(cls)
    for claim in claims:
        caches.claims.store.put(claim)
    return caches


def apply_json_patch(obj: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 ``add`` (all the webhooks emit), on a copy."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent: Any = out
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last, value = tokens[-1], copy.deepcopy(op["value"])
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            parent[last] = value
    return out
