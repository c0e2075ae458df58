"""Informer semantics on a scripted list/watch source: what reaches the cache and the
handlers, across watch ends, bookmarks, 410s and relists."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, MutableMapping
from http.server import BaseHTTPRequestHandler
from typing import Any

import pykube
import pytest
import requests
from structlog.testing import capture_logs

from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.indexing import by_field, by_label, by_namespace
from gpuoperator.runtime.informing import Handlers, Informer, InformerOptions
from harness import objects
from harness.loopback import open_watch, pod_informer, watch_handler
from harness.scripted import Cut, ScriptedSource
from harness.waiting import wait_for

Obj = dict[str, Any]


def pod(name: str, rv: str, node: str = "", ns: str = "default", **labels: str) -> Obj:
    return objects.pod(name, namespace=ns, rv=rv, labels=labels, node_name=node, containers=[])


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

    def on_watch(handler: BaseHTTPRequestHandler) -> None:
        open_watch(handler)
        opened.set()
        release.wait(30)  # an idle watch: no event, no bookmark

    with pod_informer(watch_handler(on_watch, "1"), release, InformerOptions()) as informer:
        informer.start()
        assert opened.wait(10)
        assert informer.stop(timeout=10), "the watch was not aborted"


def _retry_delays(logs: list[MutableMapping[str, Any]]) -> list[float]:
    return [float(e["retry_in"]) for e in logs if "retry_in" in e]


def test_the_backoff_starts_again_whenever_the_server_opens_a_watch(
    source: ScriptedSource,
) -> None:
    """Watches the server opens and a cut then ends: each is a healthy answer, so the next
    wait is the first step again, not a doubling of every failure since the start."""
    inf = Informer(source, pykube.Pod, InformerOptions(backoff=(0.01, 100.0)))
    rec = Recorder()
    inf.add_handlers(rec.handlers())
    source.lists.put(([], "10"))
    cuts = 7
    for i in range(cuts):
        source.watches.put(Cut(("ADDED", pod(f"p{i}", str(11 + i)))))
    with capture_logs() as logs:
        inf.start()
        try:
            assert rec.next(cuts) == [("add", f"p{i}") for i in range(cuts)]
            wait_for("the last cut's retry", lambda: len(_retry_delays(logs)) >= cuts)
        finally:
            inf.stop()
    delays = _retry_delays(logs)
    assert max(delays) <= 0.02, delays  # initial, with at most 100% jitter


def test_a_relist_that_completes_starts_the_backoff_again(source: ScriptedSource) -> None:
    """Failed lists (the server restarting) grow the backoff; once a list completes, the
    next failure waits the first step again."""
    inf = Informer(source, pykube.Pod, InformerOptions(backoff=(0.01, 100.0)))
    source.lists.put(([], "10"))
    source.watches.put(errors.GoneError(410, "Expired", "too old resource version"))
    for _ in range(5):
        source.lists.put(requests.ConnectionError("Connection refused"))
    source.lists.put(([pod("a", "20")], "20"))
    source.watches.put(requests.ConnectionError("Connection reset by peer"))
    with capture_logs() as logs:
        inf.start()
        try:
            wait_for("the failure after the relist", lambda: len(_retry_delays(logs)) >= 7)
        finally:
            inf.stop()
    delays = _retry_delays(logs)
    assert delays[5] >= 0.32, delays  # five failures in a row did double it
    assert delays[6] <= 0.02, delays


def test_a_starting_server_refusing_requests_is_retried_within_the_refused_cap(
    source: ScriptedSource,
) -> None:
    """401/403/429 while an API server fills its authorizer and storage caches: retried
    soon, however many came in a row, so a class made meanwhile is seen within seconds."""
    inf = Informer(
        source, pykube.Pod, InformerOptions(backoff=(0.01, 100.0), refused_backoff_cap=0.05)
    )
    refusals = [
        errors.ForbiddenError(403, "Forbidden", "RBAC: clusterrole not found"),
        errors.UnauthorizedError(401, "Unauthorized", "Unauthorized"),
        errors.TooManyRequestsError(429, "TooManyRequests", "storage is (re)initializing"),
    ] * 3
    for refusal in refusals:
        source.lists.put(refusal)
    source.lists.put(([pod("a", "5")], "5"))
    with capture_logs() as logs:
        inf.start()
        try:
            assert inf.wait_synced(10)
        finally:
            inf.stop()
    delays = _retry_delays(logs)
    assert len(delays) == len(refusals)
    assert max(delays) <= 0.05, delays


def test_a_cache_relisting_for_longer_than_stale_after_is_not_current_until_the_list_completes(
    source: ScriptedSource,
) -> None:
    clock = FakeClock()
    inf = Informer(
        source, pykube.Pod, InformerOptions(backoff=(0.0, 0.0), stale_after=10.0), clock=clock
    )
    source.lists.put(([pod("a", "5")], "5"))
    inf.start()
    try:
        assert inf.wait_synced(10)
        assert inf.current() and inf.stale_for() == 0.0
        source.watches.put(errors.GoneError(410, "Expired", "too old resource version"))
        wait_for("the relist to start", lambda: source.list_calls == 2)
        clock.advance(9.0)
        assert inf.current(), "a relist shorter than stale_after keeps the cache current"
        clock.advance(2.0)
        assert not inf.current()
        source.lists.put(([pod("a", "6")], "6"))
        wait_for("the relist to complete", inf.current)
        assert inf.stale_for() == 0.0
    finally:
        inf.stop()


def test_a_watch_that_the_server_reopens_keeps_the_cache_current(source: ScriptedSource) -> None:
    clock = FakeClock()
    inf = Informer(
        source, pykube.Pod, InformerOptions(backoff=(0.0, 0.0), stale_after=10.0), clock=clock
    )
    source.lists.put(([], "5"))
    inf.start()
    try:
        assert inf.wait_synced(10)
        source.watches.put(requests.ConnectionError("Connection reset by peer"))
        wait_for("the re-watch", lambda: len(source.watch_rvs) >= 2)
        clock.advance(60.0)
        assert not inf.current(), "no watch open for a minute: stale"
        source.watches.put([("ADDED", pod("a", "6"))])
        wait_for("the re-opened watch", inf.current)
    finally:
        inf.stop()


class _Died(BaseException):
    pass


def test_an_informer_whose_thread_died_is_not_current(
    source: ScriptedSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    inf = Informer(source, pykube.Pod, InformerOptions(backoff=(0.0, 0.0)))

    def die(_obj: Obj) -> None:
        raise _Died

    inf.add_handlers(Handlers(on_add=die))
    source.lists.put(([], "5"))
    inf.start()
    try:
        assert inf.wait_synced(10)
        assert inf.current()
        with capture_logs() as logs:
            source.watches.put([("ADDED", pod("a", "6"))])
            wait_for("the thread to die", inf.crashed)
        assert not inf.current()
        assert [e["log_level"] for e in logs] == ["critical"]
        assert len(died) == 1 and isinstance(died[0], _Died)
    finally:
        inf.stop()


def _silent_watches(
    watch_paths: list[str], release: threading.Event
) -> type[BaseHTTPRequestHandler]:
    """A handler whose lists answer empty at resourceVersion 7 and whose watches are opened
    (headers sent) and then silent, as on a connection that died without a reset; it
    records each watch's path in ``watch_paths``."""

    def on_watch(handler: BaseHTTPRequestHandler) -> None:
        watch_paths.append(handler.path)
        open_watch(handler)
        release.wait(30)

    return watch_handler(on_watch)


def test_a_watch_silent_for_longer_than_watch_idle_is_reopened_from_the_same_version() -> None:
    """A real client on a loopback server whose watches open and then stay silent (no
    event, no bookmark): the informer ends each after ``watch_idle`` and watches again from
    the same resourceVersion, instead of waiting out the server-side timeout; an idle watch
    is not a failure (no warning, no backoff, the cache stays current)."""

    watch_paths: list[str] = []
    release = threading.Event()
    handler = _silent_watches(watch_paths, release)
    with pod_informer(
        handler, release, InformerOptions(watch_idle=0.3, backoff=(0.01, 0.05))
    ) as informer:
        with capture_logs() as logs:
            informer.start()
            wait_for("a third watch", lambda: len(watch_paths) >= 3, timeout=10)
        assert all("resourceVersion=7" in p for p in watch_paths), watch_paths
        failures = [e for e in logs if e["log_level"] in ("warning", "error", "critical")]
        assert not failures, failures
        assert any(e["event"] == "watch idle; reopening" for e in logs), logs
        assert informer.current()
