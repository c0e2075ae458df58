"""Kubernetes Events: the decisions a user would ask about, on the object they concern.

An event is identified by (object uid, type, reason, message); repeating one within
``dedupe_window`` bumps its ``count`` and ``lastTimestamp`` instead of creating another
(as kubelet's event correlator does), so a condition that persists does not flood the
namespace. Event writes are best-effort: a failure is logged, never raised into a
reconcile. Events go through the fenced writer: a replica that stopped leading says nothing.
"""

from __future__ import annotations

import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import pykube
import structlog

from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client, Obj
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


class Recorder:
    def __init__(
        self,
        client: Client,
        *,
        dedupe_window: float = 600.0,
        clock: Clock = SYSTEM,
        host: str | None = None,
    ) -> None:
        self._client = client
        self._window = dedupe_window
        self._clock = clock
        self._host = host or socket.gethostname()
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self._lock = threading.Lock()

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
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
        try:
            if count == 1:
                self._client.create(
                    pykube.Event, self._body(obj, type_, reason, message, name, namespace, stamp)
                )
            else:
                self._client.patch(
                    pykube.Event, name, {"count": count, "lastTimestamp": stamp}, namespace
                )
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
