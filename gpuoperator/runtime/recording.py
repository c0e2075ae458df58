"""Kubernetes Events: the decisions a user would ask about, on the object they concern.

An event is identified by (object uid, type, reason, message); repeating one within
``dedupe_window`` bumps its ``count`` and ``lastTimestamp`` instead of creating another
(as kubelet's event correlator does), so a condition that persists does not flood the
namespace. Event writes are best-effort and asynchronous (one background sender): a
failure is logged, never raised into a reconcile, and a reconcile never waits for one.
Events go through the fenced writer: a replica that stopped leading says nothing.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

import pykube
import structlog

from gpuoperator.runtime import errors, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock

log = structlog.get_logger(__name__)

EventType = Literal["Normal", "Warning"]
COMPONENT = "gpuoperator"


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    first: str
    at: float


class ApiAccess(protocols.Creates, protocols.Patches, Protocol):
    """Creates an Event, and patches its count and last timestamp when it repeats."""


class Recorder:
    def __init__(
        self,
        client: ApiAccess,
        *,
        api_version: str,
        dedupe_window: float = 600.0,
        clock: Clock = SYSTEM,
        host: str | None = None,
    ) -> None:
        self._client = client
        #: The apiVersion of the objects an event names by ``kind`` alone (the product's).
        self._api_version = api_version
        self._window = dedupe_window
        self._clock = clock
        self._host = host or socket.gethostname()
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self._lock = threading.Lock()
        #: Events are sent by one background thread: a reconcile never waits for them.
        self._queue: queue.Queue[tuple[Callable[[], object], tuple[str, str, str, str], str]] = (
            queue.Queue(maxsize=10_000)
        )
        self._worker: threading.Thread | None = None

    def event(
        self,
        obj: Obj,
        type_: EventType,
        reason: str,
        message: str,
        *,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        """Record an event about ``obj``. Objects from caches carry no ``kind``: name it
        (``api_version`` defaults to the one this recorder was made with)."""
        if kind is not None:
            obj = {**obj, "kind": kind, "apiVersion": api_version or self._api_version}
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        key = (uid, type_, reason, message)
        now_mono = self._clock.monotonic()
        stamp = self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now_mono - seen.at > self._window:
                seen = None
            if seen is not None:
                seen.count += 1
                seen.at = now_mono
                count, name, namespace = seen.count, seen.name, seen.namespace
            else:
                if len(self._seen) > 4096:
                    self._seen = {
                        k: v for k, v in self._seen.items() if now_mono - v.at <= self._window
                    }
                namespace = str(meta.get("namespace") or "default")
                name = f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:10]}"
                self._seen[key] = _Seen(name, namespace, 1, stamp, now_mono)
                count = 1
        if count == 1:
            body = self._body(obj, type_, reason, message, name, namespace, stamp)
            job: Callable[[], object] = partial(self._client.create, pykube.Event, body)
        else:
            job = partial(
                self._client.patch,
                pykube.Event,
                name,
                {"count": count, "lastTimestamp": stamp},
                namespace,
            )
        try:
            self._queue.put_nowait((job, key, reason))
        except queue.Full:
            log.warning("event dropped: the event queue is full", event_reason=reason)
            return
        self._ensure_worker()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event was sent (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._send_loop, name="events", daemon=True)
                self._worker.start()

    def _send_loop(self) -> None:
        while True:
            job, key, reason = self._queue.get()
            try:
                self._send(job, key, reason)
            finally:
                self._queue.task_done()

    def _send(self, job: Callable[[], object], key: tuple[str, str, str, str], reason: str) -> None:
        try:
            job()
        except errors.NotLeaderError:
            pass
        except (errors.ApiError, OSError) as exc:
            log.warning(
                "event not recorded",
                reason=getattr(exc, "reason", type(exc).__name__),
                event_reason=reason,
                error=str(exc),
            )
            if isinstance(exc, errors.NotFoundError):
                with self._lock:
                    self._seen.pop(key, None)

    def _body(
        self,
        obj: Obj,
        type_: EventType,
        reason: str,
        message: str,
        name: str,
        namespace: str,
        stamp: str,
    ) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
        }
        if meta.get("namespace"):
            involved["namespace"] = meta["namespace"]
        if meta.get("resourceVersion"):
            involved["resourceVersion"] = meta["resourceVersion"]
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": COMPONENT, "host": self._host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._host,
        }
