"""Informer semantics on a scripted list/watch source: what reaches the cache and the
handlers, across watch ends, bookmarks, 410s and relists."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pykube
import pytest

from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.informing import (
    Backoff,
    Handlers,
    Informer,
    InformerOptions,
    Store,
    by_field,
    by_label,
    by_namespace,
)

Obj = dict[str, Any]


def pod(name: str, rv: str, node: str = "", ns: str = "default", **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels},
        "spec": {"nodeName": node},
    }


class ScriptedSource:
    """Stands in for ``Client.list``/``Client.watch``: each call takes the next scripted
    answer; a watch with nothing scripted blocks until the informer stops."""

    def __init__(self) -> None:
        self.lists: queue.Queue[tuple[list[Obj], str] | Exception] = queue.Queue()
        self.watches: queue.Queue[list[tuple[str, Obj]] | Exception] = queue.Queue()
        self.watch_rvs: list[str] = []

    def list(self, kind: Any, namespace: Any = None, **_kw: Any) -> tuple[list[Obj], str]:
        answer = self.lists.get(timeout=10)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(
        self,
        kind: Any,
        namespace: Any = None,
        *,
        resource_version: str,
        stop: threading.Event | None = None,
        **_kw: Any,
    ) -> Iterator[tuple[str, Obj]]:
        assert stop is not None
        self.watch_rvs.append(resource_version)
        while not stop.is_set():
            try:
                answer = self.watches.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(answer, Exception):
                raise answer
            yield from answer
            return


class Recorder:
    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()

    def handlers(self) -> Handlers:
        return Handlers(
            on_add=lambda o: self.events.put(("add", o["metadata"]["name"])),
            on_update=lambda old, new: self.events.put(("update", new["metadata"]["name"])),
            on_delete=lambda o: self.events.put(("delete", o["metadata"]["name"])),
        )

    def next(self, n: int = 1) -> list[tuple[str, str]]:
        return [self.events.get(timeout=10) for _ in range(n)]


@pytest.fixture
def source() -> ScriptedSource:
    return ScriptedSource()


@pytest.fixture
def informer(source: ScriptedSource) -> Iterator[Informer]:
    inf = Informer(
        source,
        pykube.Pod,
        InformerOptions(
            indexers={
                "node": by_field("spec", "nodeName"),
                "ns": by_namespace,
                "app": by_label("app"),
            },
            backoff=(0.0, 0.0),
        ),
    )
    yield inf
    inf.stop()


def test_the_first_list_fills_the_cache_and_marks_it_synced(
    source: ScriptedSource, informer: Informer
) -> None:
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([pod("a", "1"), pod("b", "2")], "10"))
    informer.start()
    assert informer.wait_synced(10)
    assert sorted(rec.next(2)) == [("add", "a"), ("add", "b")]
    assert informer.resource_version == "10"


def test_watch_events_update_cache_indexes_and_handlers(
    source: ScriptedSource, informer: Informer
) -> None:
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([pod("a", "1", node="n1", app="x")], "10"))
    informer.start()
    rec.next()
    source.watches.put(
        [
            ("MODIFIED", pod("a", "11", node="n2", app="y")),
            ("ADDED", pod("b", "12", node="n2")),
            ("DELETED", pod("a", "13", node="n2")),
        ]
    )
    assert rec.next(3) == [("update", "a"), ("add", "b"), ("delete", "a")]
    store = informer.store
    assert [o["metadata"]["name"] for o in store.by_index("node", "n2")] == ["b"]
    assert store.by_index("node", "n1") == [] and store.by_index("app", "y") == []
    assert informer.resource_version == "13"


def test_a_bookmark_moves_the_resource_version_and_nothing_else(
    source: ScriptedSource, informer: Informer
) -> None:
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([pod("a", "1")], "10"))
    informer.start()
    rec.next()
    source.watches.put([("BOOKMARK", {"metadata": {"resourceVersion": "50"}})])
    source.watches.put([("ADDED", pod("z", "51"))])
    assert rec.next() == [("add", "z")]
    assert source.watch_rvs[:2] == ["10", "50"], "the re-watch starts from the bookmark"
    assert len(informer.store) == 2


def test_a_watch_that_ends_is_reopened_from_the_last_version_without_a_relist(
    source: ScriptedSource, informer: Informer
) -> None:
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([], "10"))
    informer.start()
    informer.wait_synced(10)
    source.watches.put([("ADDED", pod("a", "11"))])  # ends after one event
    source.watches.put([("ADDED", pod("b", "12"))])
    assert rec.next(2) == [("add", "a"), ("add", "b")]
    assert source.watch_rvs[:2] == ["10", "11"]
    assert source.lists.empty()


@pytest.mark.parametrize("where", ["in-stream", "on-connect"])
def test_gone_relists_and_delivers_deletes_for_objects_that_vanished(
    source: ScriptedSource, informer: Informer, where: str
) -> None:
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([pod("a", "1"), pod("b", "2")], "10"))
    informer.start()
    rec.next(2)
    gone = errors.GoneError(410, "Expired", "too old resource version: 10 (900)")
    source.watches.put(
        [
            ("ADDED", pod("c", "11")),
        ]
        if where == "in-stream"
        else []
    )
    source.watches.put(gone)
    # Across the relist: b was deleted and d created while the watch was down.
    source.lists.put(([pod("a", "1"), pod("c", "11"), pod("d", "901")], "902"))
    events = rec.next(5 if where == "in-stream" else 4)
    assert ("delete", "b") in events
    assert ("add", "d") in events
    assert informer.store.get(("default", "b")) is None
    assert informer.resource_version == "902"


def test_connection_errors_rewatch_from_the_same_version(
    source: ScriptedSource, informer: Informer
) -> None:
    import requests

    rec = Recorder()
    informer.add_handlers(rec.handlers())
    source.lists.put(([], "10"))
    informer.start()
    informer.wait_synced(10)
    source.watches.put(requests.ConnectionError("connection reset"))
    source.watches.put([("ADDED", pod("a", "11"))])
    assert rec.next() == [("add", "a")]
    assert source.watch_rvs[:2] == ["10", "10"]
    assert source.lists.empty(), "a dropped connection is not a reason to relist"


def test_a_failing_handler_does_not_stop_the_informer_or_other_handlers(
    source: ScriptedSource, informer: Informer
) -> None:
    def boom(_obj: Obj) -> None:
        raise RuntimeError("handler bug")

    rec = Recorder()
    informer.add_handlers(Handlers(on_add=boom))
    informer.add_handlers(rec.handlers())
    source.lists.put(([pod("a", "1")], "10"))
    informer.start()
    source.watches.put([("ADDED", pod("b", "2"))])
    assert rec.next(2) == [("add", "a"), ("add", "b")]


def test_a_late_consumer_is_told_about_every_cached_object(
    source: ScriptedSource, informer: Informer
) -> None:
    source.lists.put(([pod("a", "1"), pod("b", "2")], "10"))
    informer.start()
    informer.wait_synced(10)
    rec = Recorder()
    informer.add_handlers(rec.handlers())
    assert sorted(rec.next(2)) == [("add", "a"), ("add", "b")]


def test_the_transform_shapes_what_is_stored_and_handed_out(source: ScriptedSource) -> None:
    inf = Informer(
        source,
        pykube.Pod,
        InformerOptions(
            transform=lambda o: {"metadata": o["metadata"], "slim": True}, backoff=(0.0, 0.0)
        ),
    )
    seen: list[Obj] = []
    inf.add_handlers(Handlers(on_add=seen.append))
    source.lists.put(([pod("a", "1")], "10"))
    inf.start()
    try:
        assert inf.wait_synced(10)
        assert seen == [inf.store.get(("default", "a"))]
        assert seen[0]["slim"] is True and "spec" not in seen[0]
    finally:
        inf.stop()


def test_store_indexes_follow_updates_and_removals() -> None:
    store = Store({"node": by_field("spec", "nodeName")})
    store.put(pod("a", "1", node="n1"))
    store.put(pod("b", "1", node="n1"))
    store.put(pod("a", "2", node="n2"))
    assert store.index_keys("node", "n1") == [("default", "b")]
    assert store.index_keys("node", "n2") == [("default", "a")]
    store.remove(("default", "b"))
    assert store.index_values("node") == ["n2"]


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.8, 30.0, jitter=0.0)
    assert [b.next() for _ in range(7)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]
    b.reset()
    assert b.next() == 0.8


def test_an_optional_kind_that_is_not_served_counts_as_synced_and_empty(
    source: ScriptedSource,
) -> None:
    inf = Informer(source, pykube.Pod, InformerOptions(optional=True, backoff=(0.0, 0.0)))
    rec = Recorder()
    inf.add_handlers(rec.handlers())
    source.lists.put(errors.NotFoundError(404, "NotFound", "the server could not find it"))
    source.lists.put(([pod("kv", "1")], "5"))  # the CRD gets installed later
    inf.start()
    try:
        assert inf.wait_synced(10)
        assert rec.next() == [("add", "kv")]
    finally:
        inf.stop()


def test_stop_aborts_a_watch_that_is_waiting_for_its_next_event() -> None:
    """A real client on a loopback server that opens the watch (headers sent) and then
    sends nothing: ``stop`` ends the informer's thread at once instead of leaving it
    blocked on the socket until the server-side timeout."""
    opened, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if "watch=true" not in self.path:
                body = json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            opened.set()
            release.wait(30)  # an idle watch: no event, no bookmark

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
        ],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    informer = Informer(Client(lambda: pykube.KubeConfig(doc)), pykube.Pod)
    try:
        informer.start()
        assert opened.wait(10)
        assert informer.stop(timeout=10), "the watch was not aborted"
    finally:
        release.set()
        server.shutdown()
        server.server_close()
