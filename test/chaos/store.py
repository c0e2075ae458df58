"""The cluster's etcd, spoken to directly through its v3 HTTP/JSON gateway: the current
revision, compaction (so watches from older versions get 410 Gone), and a watch of a key
prefix.

The chaos suite records every version of every GPUClaim from etcd rather than from the API
server: etcd's watch serves any revision not yet compacted and stays connected while
kube-apiserver restarts, so the record has no gap however the API server is treated (an API
server watch would be cut and answered 410 itself). Custom resources are stored as JSON
under ``/registry/<group>/<resource>/<namespace>/<name>``; built-in kinds (ResourceClaims)
as protobuf under ``/registry/<resource>/<namespace>/<name>``, which ``chaos.protobuf``
reads.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

Obj = dict[str, Any]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The first key after every key starting with ``prefix`` (etcd's range_end)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True)
class Event:
    """One change of one key: ``obj`` is the stored JSON, ``None`` for a deletion."""

    revision: int
    key: str
    obj: Obj | None
    #: When this process received it (``time.time()``).
    received: float


class Etcd:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 2379

    def _post(self, path: str, body: Obj, timeout: float = 10) -> Obj:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
            if resp.status != 200:
                raise RuntimeError(f"etcd {path}: HTTP {resp.status}: {data}")
            return dict(data)
        finally:
            conn.close()

    def revision(self) -> int:
        header = self._post("/v3/kv/range", {"key": _b64("/"), "limit": 1, "keys_only": True})
        return int(header["header"]["revision"])

    def compact(self, revision: int | None = None) -> int:
        """Compact the history up to ``revision`` (default: the current one), physically;
        returns the revision compacted to."""
        rev = revision or self.revision()
        self._post("/v3/kv/compaction", {"revision": str(rev), "physical": True}, timeout=60)
        return rev

    def watch(
        self,
        prefix: str,
        start_revision: int,
        on_events: Callable[[list[Event]], None],
        wanted: Callable[[str], bool] = lambda _key: True,
        decode: Callable[[str, bytes], Obj] = lambda _key, value: dict(json.loads(value)),
    ) -> Watch:
        return Watch(self, prefix, start_revision, on_events, wanted, decode)


class Watch:
    """A watch of every key under ``prefix`` from ``start_revision``, in a thread.

    ``on_events`` is called with the events of one etcd revision at a time, in revision
    order, for the keys ``wanted`` accepts (only those values are decoded, by ``decode``:
    JSON unless told otherwise, since built-in kinds are stored as protobuf). Watching a wide
    prefix (``/registry/``) keeps the revision known to be delivered moving even while no
    wanted key changes, which :meth:`caught_up` relies on. A watch that etcd cancels (its
    start revision was compacted) or whose connection breaks is resumed from the next
    revision; a resume that etcd refuses as compacted is a *gap* in the record, counted in
    ``gaps`` (the checks then say so instead of passing).
    """

    def __init__(
        self,
        etcd: Etcd,
        prefix: str,
        start_revision: int,
        on_events: Callable[[list[Event]], None],
        wanted: Callable[[str], bool],
        decode: Callable[[str, bytes], Obj],
    ) -> None:
        self._etcd = etcd
        self._wanted = wanted
        self._decode = decode
        self._prefix = prefix
        self._next = start_revision
        self._on_events = on_events
        self._stopping = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self.gaps = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="etcd-watch", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(2)
        self.thread.join(10)

    def caught_up(
        self, revision: int, nudge: Callable[[], object] | None = None, timeout: float = 30
    ) -> None:
        """Wait until every revision up to ``revision`` has been delivered; ``nudge`` (a
        write of anything, called every second meanwhile) makes sure a later one comes."""
        deadline = time.monotonic() + timeout
        last_nudge = 0.0
        while self._next <= revision:
            now = time.monotonic()
            if now > deadline:
                raise AssertionError(f"etcd watch is at {self._next}, not past {revision}")
            if nudge is not None and now - last_nudge > 1:
                nudge()
                last_nudge = now
            time.sleep(0.05)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._stream()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if not self._stopping.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.2)

    def _stream(self) -> None:
        conn = http.client.HTTPConnection(self._etcd.host, self._etcd.port, timeout=None)
        self._conn = conn
        try:
            body = {
                "create_request": {
                    "key": _b64(self._prefix),
                    "range_end": _b64(prefix_end(self._prefix)),
                    "start_revision": str(self._next),
                    "progress_notify": True,
                }
            }
            conn.request("POST", "/v3/watch", json.dumps(body))
            resp = conn.getresponse()
            while not self._stopping.is_set():
                line = resp.readline()
                if not line:
                    return
                result = json.loads(line).get("result") or {}
                if result.get("canceled"):
                    compacted = int(result.get("compact_revision") or 0)
                    if compacted > self._next:
                        self.gaps += 1
                        self._next = compacted
                    return
                self._deliver(result)
        finally:
            conn.close()

    def _deliver(self, result: Obj) -> None:
        now = time.time()
        batch: list[Event] = []
        last = 0
        for ev in result.get("events") or []:
            kv = ev.get("kv") or {}
            revision = int(kv.get("mod_revision") or 0)
            if batch and batch[-1].revision != revision:
                self._on_events(batch)
                batch = []
            last = max(last, revision)
            key = base64.b64decode(kv.get("key", "")).decode()
            if not self._wanted(key):
                continue
            obj = None
            if ev.get("type") != "DELETE":
                obj = self._decode(key, base64.b64decode(kv.get("value", "")))
            batch.append(Event(revision, key, obj, now))
        if batch:
            self._on_events(batch)
        header = int((result.get("header") or {}).get("revision") or 0)
        if last:
            self._next = max(self._next, last + 1)
        elif header >= self._next:
            # A progress notification (no events): everything up to its revision is sent.
            self._next = header + 1
