"""Class status on in-memory caches: a class whose deletion its claims hold is told once per
change (one info line and one Event), not on every pass."""

from __future__ import annotations

from typing import Any, cast

import structlog
from prometheus_client import CollectorRegistry

from controllers import class_status
from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.inventory import Inventory
from gpuoperator.runtime.client import Client, Kind
from gpuoperator.runtime.informing import Informer, InformerOptions, ListWatcher
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder

Obj = dict[str, Any]


class _NoServerManager:
    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        return Informer(cast("ListWatcher", object()), kind, options, name=name)


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def event(self, _obj: Obj, _type: str, reason: str, _message: str, **_: Any) -> None:
        self.reasons.append(reason)


def claim(name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "t", "resourceVersion": "1"},
        "spec": {"className": "a10", "count": 1},
    }


def test_a_held_class_deletion_is_told_once_per_change_not_every_pass() -> None:
    caches = cachesmod.register(cast("Manager", _NoServerManager()))
    caches.classes.store.put(
        {
            "metadata": {
                "name": "a10",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": [names.CLASS_PROTECTION_FINALIZER],
            },
            "spec": {"mode": "passthrough"},
        }
    )
    caches.claims.store.put(claim("one"))
    events = Events()
    reconciler = class_status.ClassStatus(
        caches,
        Inventory(),
        cast("Client", object()),  # nothing is written while claims remain
        cast("Recorder", events),
        registry=CollectorRegistry(),
    )

    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            reconciler.reconcile(("", "a10"))
        caches.claims.store.put(claim("two"))  # a change: told again
        reconciler.reconcile(("", "a10"))

    told = [e for e in logs if e["log_level"] == "info"]
    assert [e["event"] for e in told] == ["class deletion held"] * 2
    assert [e["claims"] for e in told] == [1, 2]
    assert events.reasons == ["DeletionHeld"] * 2
