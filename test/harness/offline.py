"""Cluster-less doubles for unit tests of controllers and webhooks.

* :class:`NoApiServer`: the ``ListWatcher`` of informers that are never started.
* :class:`OfflineManager`: enough of ``Manager`` for the product's own ``register``
  functions (``caches.register``, each controller's ``register``): informers that are never
  started, controllers kept by name with the sources they are wired to. Caches built this
  way carry exactly the product's indexes and transforms.
* :func:`offline_caches` / :func:`store_caches`: the shared caches on such a manager (fill
  them with :func:`put`, or ``caches.<kind>.store.put``).
* :class:`FakeApi`: a small API server (objects by kind, namespace and name, every call
  recorded): resourceVersion and UID preconditions answer 409, a missing object 404, a
  taken name AlreadyExists; for the kinds with a status subresource ``replace`` keeps the
  stored status and ``replace_status`` the stored rest; merge and JSON patches go through
  :func:`apply_patch`.
* :class:`ClaimStore`: just the GPUClaims, for status writers: ``replace_status`` checks the
  resourceVersion (409) and answers 404 for a claim that is gone; ``writes`` counts its calls.
* :class:`FakeRecorder`: the Events a controller records.
* :func:`apply_patch`: the one RFC 7386 merge-patch and RFC 6902 JSON-patch applier.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from prometheus_client import CollectorRegistry

from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.caches import Caches
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Kind
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Reconciler
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.informing import Informer, InformerOptions
from gpuoperator.runtime.managing import Mapper, Source

Obj = dict[str, Any]
Hook = Callable[[Obj], None]

#: Kinds whose ``status`` is a subresource (a PUT of the object keeps the stored status);
#: the shipped Workload CRD, Secrets and the like have none.
STATUS_SUBRESOURCE = frozenset(
    {"GPUClaim", "GPUClass", "GPUNode", "Node", "Pod", "VirtualMachineInstance"}
)


# -- patches ----------------------------------------------------------------------------------


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, on a copy."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def pointer_tokens(path: str) -> list[str]:
    """The unescaped reference tokens of a JSON pointer (RFC 6901)."""
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _step(parent: Any, token: str) -> Any:
    return parent[int(token)] if isinstance(parent, list) else parent[token]


#: The JSON-patch operations the operator's webhooks emit.
WEBHOOK_OPS = frozenset({"add"})
ALL_OPS = frozenset({"add", "remove", "replace", "test"})


def apply_json_patch(obj: Obj, ops: list[Obj], *, allowed: frozenset[str] = WEBHOOK_OPS) -> Obj:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test``, on a copy; a failed ``test``
    is a 409 as the API server answers it. An operation not in ``allowed`` fails the test
    (by default only ``add``: all a webhook patch may hold)."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] in allowed, f"unexpected JSON-patch op {op['op']!r}"
        tokens = pointer_tokens(op["path"])
        parent: Any = out
        for token in tokens[:-1]:
            parent = _step(parent, token)
        last = tokens[-1]
        kind = op["op"]
        if kind == "test":
            if _step(parent, last) != op["value"]:
                raise errors.ConflictError(409, "Conflict", f"test of {op['path']} failed")
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif kind in ("add", "replace"):
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, value)
                else:
                    parent[index] = value
            else:
                if kind == "replace" and last not in parent:
                    raise errors.InvalidError(422, "Invalid", f"no {op['path']} to replace")
                parent[last] = value
        else:
            raise AssertionError(f"unsupported JSON-patch op {kind!r}")
    return out


def apply_patch(obj: Obj, patch: Any) -> Obj:
    """A JSON patch (a list of operations, any of them) or a merge patch (an object), on a
    copy, as the API server applies it."""
    if isinstance(patch, list):
        return apply_json_patch(obj, patch, allowed=ALL_OPS)
    return cast(Obj, apply_merge_patch(obj, patch))


# -- caches -----------------------------------------------------------------------------------


class NoApiServer:
    """The ``ListWatcher`` of an informer that is never started: its cache is filled by
    the test (``put``, ``store.put``), so a list or a watch is a test's mistake."""

    def list(self, kind: Kind, namespace: str | None = None, **_: Any) -> tuple[list[Obj], str]:
        raise AssertionError(f"an offline informer of {kind.kind} was asked to list")

    def watch(
        self, kind: Kind, namespace: str | None = None, **_: Any
    ) -> Iterator[tuple[str, Obj]]:
        raise AssertionError(f"an offline informer of {kind.kind} was asked to watch")


class OfflineManager:
    """Enough of ``Manager`` for the product's ``register`` functions, with no API server:
    informers are made once per name and never started; ``controller`` keeps the reconciler
    (``reconcilers[name]``) and ``add_controller`` the sources it is woken by."""

    def __init__(
        self,
        writer: FakeApi | None = None,
        *,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        #: Every component writes to this one fake API server (by default one of its own).
        self.writer = writer if writer is not None else FakeApi()
        self.clock = clock
        self.registry = registry if registry is not None else CollectorRegistry()
        self.informers: dict[str, Informer] = {}
        self.reconcilers: dict[str, Reconciler[Key]] = {}
        self.sources: dict[str, list[tuple[Source, Mapper]]] = {}

    def writer_for(self, component: str) -> FakeApi:
        """Every component writes to the one fake API server."""
        return self.writer

    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        name = name or kind.endpoint
        if name not in self.informers:
            self.informers[name] = Informer(
                NoApiServer(), kind, options, name=name, registry=self.registry
            )
        return self.informers[name]

    def controller(
        self,
        name: str,
        reconciler: Reconciler[Key],
        *,
        workers: int = 2,
        seed: Callable[[], Iterable[Key]] = tuple,
    ) -> Controller[Key]:
        self.reconcilers[name] = reconciler
        return Controller(
            name, reconciler, workers=workers, seed=seed, clock=self.clock, registry=self.registry
        )

    def add_controller(
        self, controller: Controller[Key], watches: Iterable[tuple[Source, Mapper]]
    ) -> None:
        self.sources[controller.name] = list(watches)


def offline_caches(manager: OfflineManager | None = None) -> Caches:
    """The operator's shared caches, made by the product's own registration (so with its
    indexes and transforms), on informers that are never started."""
    return cachesmod.register(manager or OfflineManager())


def put(informer: Informer, obj: Obj) -> Obj:
    """Store ``obj`` in ``informer``'s cache as its watch would: through its transform."""
    transform = informer.options.transform
    stored = transform(copy.deepcopy(obj)) if transform else copy.deepcopy(obj)
    informer.store.put(stored)
    return stored


def store_caches(classes: Iterable[Obj] = (), claims: Iterable[Obj] = ()) -> Caches:
    """:func:`offline_caches` holding ``classes`` and ``claims``."""
    caches = offline_caches()
    for cls in classes:
        caches.classes.store.put(cls)
    for claim in claims:
        caches.claims.store.put(claim)
    return caches


# -- the API server ---------------------------------------------------------------------------


class FakeApi:
    """A tiny API server: objects by (kind, namespace, name), every call recorded in
    ``calls`` as ``(verb, kind, name, payload)``.

    ``conflict_next`` names verbs whose next call fails with 409, ``refuse[(verb,
    namespace)]`` an error every such call answers; ``before[name]`` runs
    first inside a status write of that object (it may raise, or block to hold the write in
    flight); ``after_get[name]`` runs once right after a read of that object has been
    answered (someone else changing it meanwhile); ``land_then_conflict`` names objects
    whose next status write is stored and then answered 409, as a retried write meeting its
    own first attempt is."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.calls: list[tuple[str, str, str, Any]] = []
        self.conflict_next: set[str] = set()
        self.before: dict[str, Hook] = {}
        self.after_get: dict[str, Hook] = {}
        self.land_then_conflict: set[str] = set()
        #: (verb, namespace) -> the error every such call answers
        self.refuse: dict[tuple[str, str], BaseException] = {}
        self._rv = 100

    # ---- the test's side ------------------------------------------------------------
    def add(self, kind: Kind, obj: Obj) -> Obj:
        """Store ``obj`` (a new resourceVersion, a uid if it has none); the stored copy."""
        with self.lock:
            self._rv += 1
            stored = copy.deepcopy(obj)
            meta = stored.setdefault("metadata", {})
            meta["resourceVersion"] = str(self._rv)
            meta.setdefault("uid", f"uid-{meta['name']}")
            self.objects[(kind.kind, meta.get("namespace") or "", meta["name"])] = stored
            return copy.deepcopy(stored)

    def stored(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        """What the server holds now (None when nothing), without recording a call."""
        with self.lock:
            found = self.objects.get((kind.kind, namespace or "", name))
            return copy.deepcopy(found) if found is not None else None

    def remove(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        """The object disappears (deleted by someone else)."""
        with self.lock:
            self.objects.pop((kind.kind, namespace or "", name), None)

    def writes(self) -> list[tuple[str, str, str, Any]]:
        with self.lock:
            return [c for c in self.calls if c[0] != "get"]

    def _record(self, verb: str, kind: Kind, name: str, payload: Any) -> None:
        with self.lock:
            self.calls.append((verb, kind.kind, name, copy.deepcopy(payload)))

    def _conflict(self, verb: str, namespace: str | None = None) -> None:
        with self.lock:
            refused = self.refuse.get((verb, namespace or ""))
            if refused is not None:
                raise refused
            if verb in self.conflict_next:
                self.conflict_next.discard(verb)
                raise errors.ConflictError(409, "Conflict", "the object has been modified")

    def _current(self, kind: Kind, name: str, namespace: str | None) -> Obj:
        found = self.objects.get((kind.kind, namespace or "", name))
        if found is None:
            raise errors.NotFoundError(404, "NotFound", f"{kind.kind} {name} not found")
        return found

    @staticmethod
    def _precondition(wanted: Any, current: Obj) -> None:
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise errors.ConflictError(409, "Conflict", "the object has been modified")

    # ---- the client's side ----------------------------------------------------------
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        self._record("get", kind, name, None)
        with self.lock:
            found = copy.deepcopy(self._current(kind, name, namespace))
        hook = self.after_get.pop(name, None)
        if hook is not None:
            hook(found)
        return found

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(kind, name, namespace)
        except errors.NotFoundError:
            return None

    def create(self, kind: Kind, obj: Obj, **_: Any) -> Obj:
        meta = obj["metadata"]
        self._record("create", kind, meta["name"], obj)
        self._conflict("create", meta.get("namespace"))
        with self.lock:
            if (kind.kind, meta.get("namespace") or "", meta["name"]) in self.objects:
                raise errors.AlreadyExistsError(409, "AlreadyExists", f"{meta['name']} exists")
            return self.add(kind, obj)

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> Obj:
        self._record("patch", kind, name, {"body": patch, "subresource": subresource})
        self._conflict("patch", namespace)
        with self.lock:
            current = self._current(kind, name, namespace)
            if isinstance(patch, dict):
                self._precondition((patch.get("metadata") or {}).get("resourceVersion"), current)
            return self.add(kind, apply_patch(current, patch))

    def replace(self, kind: Kind, obj: Obj, *, subresource: str | None = None) -> Obj:
        if subresource == "status":
            return self.replace_status(kind, obj)
        meta = obj["metadata"]
        self._record("replace", kind, meta["name"], obj)
        self._conflict("replace", meta.get("namespace"))
        with self.lock:
            current = self._current(kind, meta["name"], meta.get("namespace"))
            self._precondition(meta.get("resourceVersion") or "missing", current)
            kept = copy.deepcopy(obj)
            if kind.kind in STATUS_SUBRESOURCE:
                kept.pop("status", None)
                if "status" in current:
                    kept["status"] = copy.deepcopy(current["status"])
            return self.add(kind, kept)

    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        meta = obj["metadata"]
        name = meta["name"]
        self._record("replace_status", kind, name, obj)
        self._conflict("replace_status", meta.get("namespace"))
        if kind.kind not in STATUS_SUBRESOURCE:
            raise errors.NotFoundError(404, "NotFound", f"{kind.kind} has no status subresource")
        hook = self.before.get(name)
        if hook is not None:
            hook(obj)
        with self.lock:
            current = self._current(kind, name, meta.get("namespace"))
            self._precondition(meta.get("resourceVersion") or "missing", current)
            stored = self.add(kind, {**current, "status": copy.deepcopy(obj.get("status"))})
            if name in self.land_then_conflict:
                self.land_then_conflict.discard(name)
                raise errors.ConflictError(409, "Conflict", "the object has been modified")
            return stored

    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        **_: Any,
    ) -> None:
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        self._record("delete", kind, name, preconditions)
        self._conflict("delete", namespace)
        with self.lock:
            current = self._current(kind, name, namespace)
            if uid and current["metadata"]["uid"] != uid:
                raise errors.ConflictError(409, "Conflict", "uid precondition failed")
            self._precondition(resource_version, current)
            del self.objects[(kind.kind, namespace or "", name)]


class ClaimStore:
    """Stored GPUClaims by name; ``replace_status`` checks the resourceVersion."""

    def __init__(self) -> None:
        self.claims: dict[str, Obj] = {}
        self.writes = 0
        self._rv = 10

    def store(self, obj: Obj) -> Obj:
        self._rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._rv)
        self.claims[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def replace_status(self, _kind: Kind, obj: Obj) -> Obj:
        self.writes += 1
        current = self.claims.get(obj["metadata"]["name"])
        if current is None:
            raise errors.NotFoundError(404, "NotFound", "gone")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise errors.ConflictError(409, "Conflict", "the object has been modified")
        return self.store({**current, "status": copy.deepcopy(obj["status"])})

    def get(self, _kind: Kind, name: str, _namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.claims[name])

    def get_or_none(self, _kind: Kind, name: str, _namespace: str | None = None) -> Obj | None:
        found = self.claims.get(name)
        return copy.deepcopy(found) if found is not None else None


# -- events -----------------------------------------------------------------------------------


class FakeRecorder:
    """The Events recorded, as dicts of the involved object's name, kind and apiVersion and
    the Event's type, reason and message."""

    def __init__(self) -> None:
        self.events: list[Obj] = []
        self._lock = threading.Lock()

    def event(
        self,
        obj: Obj,
        type_: str,
        reason: str,
        message: str,
        *,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        with self._lock:
            self.events.append(
                {
                    "name": obj["metadata"]["name"],
                    "namespace": obj["metadata"].get("namespace", ""),
                    "kind": kind,
                    "apiVersion": api_version or names.API_VERSION,
                    "type": type_,
                    "reason": reason,
                    "message": message,
                }
            )

    def reasons(self, name: str | None = None) -> list[str]:
        """The reasons recorded, in order (of the object ``name`` only, when given)."""
        with self._lock:
            return [e["reason"] for e in self.events if name is None or e["name"] == name]


# -- a cluster ----------------------------------------------------------------------------------


class OfflineCluster:
    """The fake API server, the product's caches on an :class:`OfflineManager` writing to it,
    a real ``Ledger``, a fake clock and the Events recorded. :meth:`put` stores an object
    in the server and delivers it, as its watch would, to the cache and the ledger;
    :meth:`sync` delivers the server's current state of one object."""

    def __init__(self, clock: Any = None) -> None:
        from gpuoperator.ledger import Ledger
        from gpuoperator.runtime.clock import FakeClock

        self.clock = clock if clock is not None else FakeClock()
        self.api = FakeApi()
        self.recorder = FakeRecorder()
        self.manager = OfflineManager(self.api, clock=self.clock)
        self.caches = offline_caches(self.manager)
        self.ledger = Ledger(clock=self.clock)

    def _feeds(self, informer: Informer) -> tuple[Hook, Hook] | None:
        inv, caches = self.ledger, self.caches
        return {
            id(caches.classes): (inv.apply_class, inv.delete_class),
            id(caches.nodes): (inv.apply_node, inv.delete_node),
            id(caches.pods): (inv.apply_pod, inv.delete_pod),
            id(caches.claims): (inv.apply_claim, inv.delete_claim),
            id(caches.kubevirts): (inv.apply_kubevirt, inv.delete_kubevirt),
            id(caches.resource_slices): (inv.apply_resource_slice, inv.delete_resource_slice),
            id(caches.device_classes): (inv.apply_device_class, inv.delete_device_class),
            id(caches.resource_claims): (inv.apply_resource_claim, inv.delete_resource_claim),
            id(caches.device_taint_rules): (
                inv.apply_device_taint_rule,
                inv.delete_device_taint_rule,
            ),
        }.get(id(informer))

    def deliver(self, informer: Informer, obj: Obj) -> Obj:
        """``obj`` reaches ``informer``'s cache (and the ledger) as a watch event would."""
        stored = put(informer, obj)
        feeds = self._feeds(informer)
        if feeds is not None:
            feeds[0](stored)
        return stored

    def put(self, informer: Informer, obj: Obj) -> Obj:
        """Store ``obj`` in the server and deliver it; the server's copy."""
        stored = self.api.add(informer.kind, obj)
        self.deliver(informer, stored)
        return stored

    def sync(self, informer: Informer, name: str, namespace: str = "") -> Obj | None:
        """Deliver the server's current ``name`` (or its deletion) to the cache."""
        stored = self.api.stored(informer.kind, name, namespace)
        if stored is not None:
            return self.deliver(informer, stored)
        gone = informer.store.remove((namespace, name))
        feeds = self._feeds(informer)
        if gone is not None and feeds is not None:
            feeds[1](gone)
        return None
