"""How long a cache counts as stale when its watches keep being opened and then lost at
once: the API server answers a resumed watch with 200 and its headers first, and only then
says, inside the stream, that the resourceVersion is too old (410) — or the connection is
cut again before anything arrived. Such a watch never followed the server: the time the
cache may have been missing changes goes on from the first failure, so a replica whose
cache is behind stops being ready after ``stale_after`` however many watches it re-opens."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import pykube
import pytest
import requests
from structlog.testing import capture_logs

from gpuoperator.runtime import errors
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.informing import Informer, InformerOptions
from harness import objects
from harness.loopback import open_watch, pod_informer, watch_handler
from harness.scripted import Lost, ScriptedSource
from harness.waiting import wait_for

Obj = dict[str, Any]


def _gone() -> errors.GoneError:
    return errors.GoneError(410, "Expired", "too old resource version: 40 (55)")


def _cut() -> requests.ConnectionError:
    return requests.ConnectionError("Response ended prematurely")


@dataclass
class Started:
    """An informer of pods on a scripted source and a fake clock, synced at version 40."""

    clock: FakeClock
    source: ScriptedSource
    informer: Informer

    def cut_and_rewatched(self, seconds: float) -> None:
        """The open watch is cut and the informer watches again; then ``seconds`` pass."""
        self.source.watches.put(Lost(_cut()))
        wait_for("the re-watch", lambda: self.source.watch_calls >= 2)
        self.clock.advance(seconds)


@pytest.fixture
def started() -> Iterator[Started]:
    clock, source = FakeClock(), ScriptedSource()
    inf = Informer(
        source,
        pykube.Pod,
        InformerOptions(backoff=(0.0, 0.0), stale_after=10.0),
        clock=clock,
    )
    source.lists.put(([], "40"))
    inf.start()
    try:
        assert inf.wait_synced(10)
        yield Started(clock, source, inf)
    finally:
        inf.stop()


def test_watches_answered_410_right_after_their_headers_do_not_make_the_cache_current(
    started: Started,
) -> None:
    clock, source, inf = started.clock, started.source, started.informer
    started.cut_and_rewatched(6.0)  # the connection is cut: stale from here
    source.watches.put(Lost(_gone()))  # opened, then 410 in the stream
    wait_for("the relist", lambda: source.list_calls >= 2)
    clock.advance(6.0)
    assert inf.stale_for() >= 12.0, inf.describe()
    assert not inf.current(), "12 s behind the server: not to be trusted"
    source.lists.put(([], "60"))
    wait_for("the relist to complete", inf.current)
    assert inf.stale_for() == 0.0


def test_watches_cut_again_before_anything_arrived_do_not_reset_the_staleness(
    started: Started,
) -> None:
    clock, source, inf = started.clock, started.source, started.informer
    for n in range(2, 6):
        source.watches.put(Lost(_cut()))
        wait_for(f"watch {n}", lambda n=n: source.watch_calls >= n)  # type: ignore[misc]
        clock.advance(3.0)
    assert inf.stale_for() >= 9.0, inf.describe()
    clock.advance(2.0)
    assert not inf.current(), inf.describe()


def test_a_watch_that_delivered_an_event_before_its_cut_had_caught_up(started: Started) -> None:
    """Whatever a re-opened watch delivered came after everything it had missed (the
    server sends the backlog first): the cache was current from that watch on."""
    clock, source, inf = started.clock, started.source, started.informer
    started.cut_and_rewatched(8.0)
    pod = objects.pod("a", namespace="default", rv="41", labels={}, containers=[])
    source.watches.put(Lost(_cut(), ("ADDED", pod)))
    wait_for("the next re-watch", lambda: source.watch_calls >= 3)
    clock.advance(3.0)
    assert inf.store.get(("default", "a")) is not None
    assert inf.stale_for() == 3.0, inf.describe()
    assert inf.current()


def test_a_watch_open_and_quiet_for_a_while_had_caught_up(started: Started) -> None:
    """A resumed watch that stays open without a word has nothing to deliver: once it has
    been open a few seconds, a cut of it starts the staleness afresh."""
    clock, source, inf = started.clock, started.source, started.informer
    started.cut_and_rewatched(8.0)
    release = threading.Event()
    source.watches.put(Lost(_cut(), hold=release))
    wait_for("the quiet watch to open", lambda: inf.describe()["phase"] == "watching")
    clock.advance(30.0)
    release.set()
    wait_for("the re-watch after the quiet one", lambda: source.watch_calls >= 3)
    assert inf.stale_for() < 1.0, inf.describe()
    assert inf.current()


def test_a_watch_whose_headers_never_come_is_a_failure_not_a_quiet_watch() -> None:
    """A real client on a loopback server that takes the watch request and never answers:
    the API server sends a watch's headers at once, so after ``watch_headers`` the watch
    has failed (the cache is stale, the next attempt backs off) — instead of counting as
    current until the idle limit, far longer than any webhook may trust a cache."""
    requests_seen: list[str] = []
    release = threading.Event()

    def on_watch(handler: BaseHTTPRequestHandler) -> None:
        requests_seen.append(handler.path)
        release.wait(30)  # no headers, ever

    options = InformerOptions(watch_idle=60.0, watch_headers=0.3, backoff=(0.01, 0.05))
    with pod_informer(watch_handler(on_watch), release, options) as informer:
        with capture_logs() as logs:
            informer.start()
            assert informer.wait_synced(10)
            wait_for("a second watch request", lambda: len(requests_seen) >= 2, timeout=10)
        failures = [e for e in logs if e["event"] == "list/watch failed; retrying"]
        assert failures and failures[0]["reason"] == "ReadTimeout", logs
        assert informer.stale_for() > 0.0


def test_after_its_headers_a_watch_may_be_quiet_up_to_the_idle_limit() -> None:
    """The short wait is for the headers only: a watch whose first event comes later than
    ``watch_headers`` after them is neither a failure nor re-opened."""
    watch_paths: list[str] = []
    release = threading.Event()
    event = json.dumps(
        {"type": "ADDED", "object": objects.pod("late", namespace="d", rv="8", containers=[])}
    )

    def on_watch(handler: BaseHTTPRequestHandler) -> None:
        watch_paths.append(handler.path)
        open_watch(handler)
        if len(watch_paths) == 1:
            release.wait(0.8)  # quiet for four times the headers' limit
            line = (event + "\n").encode()
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()
        release.wait(30)

    options = InformerOptions(watch_idle=60.0, watch_headers=0.2, backoff=(0.01, 0.05))
    with pod_informer(watch_handler(on_watch), release, options) as informer:
        with capture_logs() as logs:
            informer.start()
            wait_for("the late event", lambda: informer.store.get(("d", "late")) is not None)
        assert len(watch_paths) == 1, watch_paths
        assert not [e for e in logs if e["event"] != "cache synced"], logs
        assert informer.current()
