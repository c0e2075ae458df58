"""A scripted list/watch source for informer tests: it stands in for ``Client.list`` and
``Client.watch`` (``informing.ListWatcher``), each call taking the next answer a test put in
its queues, so a test decides what the server says and when."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import requests

Obj = dict[str, Any]
Event = tuple[str, Obj]


class Opened:
    """What ``opened`` receives for a watch the server accepted."""

    ok = True
    raw = None

    def close(self) -> None:
        pass


class Lost:
    """A watch the server opens (headers sent) and that then fails with ``error`` after
    delivering ``events`` (an in-stream ERROR 410, a cut connection); with ``hold``, it
    stays open and quiet after them until ``hold`` is set."""

    def __init__(self, error: Exception, *events: Event, hold: threading.Event | None = None):
        self.error, self.events, self.hold = error, list(events), hold


class Cut(Lost):
    """A watch the server opens, streams ``events`` on, and then loses on the connection."""

    def __init__(self, *events: Event) -> None:
        super().__init__(requests.ConnectionError("Connection reset by peer"), *events)


class ScriptedSource:
    """Each list takes the next answer of ``lists`` (an exception is a failed list); each
    watch the next of ``watches``: an exception is a watch the server refused before any
    header, a list of events one it opened, streamed and ended normally, a :class:`Lost`
    one it opened and then lost. A watch with nothing scripted waits, open, until the
    informer stops."""

    def __init__(self) -> None:
        self.lists: queue.Queue[tuple[list[Obj], str] | Exception] = queue.Queue()
        self.watches: queue.Queue[list[Event] | Lost | Exception] = queue.Queue()
        #: The resourceVersion each watch started from, in order.
        self.watch_rvs: list[str] = []
        self.list_calls = 0

    @property
    def watch_calls(self) -> int:
        return len(self.watch_rvs)

    def list(
        self, kind: Any, namespace: Any = None, *, transform: Any = None, **_kw: Any
    ) -> tuple[list[Obj], str]:
        self.list_calls += 1
        answer = self.lists.get(timeout=10)
        if isinstance(answer, Exception):
            raise answer
        items, rv = answer
        return [transform(o) for o in items] if transform else items, rv

    def watch(
        self,
        kind: Any,
        namespace: Any = None,
        *,
        resource_version: str,
        stop: threading.Event | None = None,
        opened: Any = None,
        **_kw: Any,
    ) -> Iterator[Event]:
        assert stop is not None
        self.watch_rvs.append(resource_version)
        while not stop.is_set():
            try:
                answer = self.watches.get(timeout=0.02)
            except queue.Empty:
                continue
            if isinstance(answer, Exception):
                raise answer
            if opened is not None:
                opened(Opened())
            if isinstance(answer, Lost):
                yield from answer.events
                if answer.hold is not None:
                    answer.hold.wait(10)  # open and quiet until released
                raise answer.error
            yield from answer
            return
