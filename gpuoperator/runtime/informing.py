"""Informers: a per-kind cache kept current by list + watch, with indexes and handlers.

This reproduces client-go's reflector and shared informer, in the small, over the indexer
of ``indexing`` (one class here: the list/watch loop and the handlers share the lock under
which the store changes, so each handler sees changes in the order the store took them):

* **List, then watch.** A paginated list fills the cache and gives a resourceVersion; a
  watch from it (with bookmarks and a server-side timeout) keeps the cache current. A
  watch that ends normally is re-opened from the last resourceVersion seen; a watch that
  fails on the connection is re-opened after a backoff, from the same resourceVersion.
* **No request waits forever.** A watch that delivers nothing, not even the bookmark the
  API server sends an idle watch about once a minute, for ``watch_idle`` seconds is ended
  and re-opened at once from the same resourceVersion (its connection may have died without
  a reset: a cut on the way, a server that went away), one whose response headers have not
  come after ``watch_headers`` seconds is a failure (the API server sends them as soon as
  it registered the watch), and one that streams past its server-side timeout is ended by
  the client; list requests time out on every read
  (``Client``'s timeout).
* **410 Gone means relist.** Whether the server says it as an HTTP status or as an ERROR
  event inside the stream, the informer lists again, and every object that vanished across
  the relist is delivered as a delete: nothing is lost while the watch was down.
* **Backoff** between failed lists and watches (``backoff.Backoff``): 0.8 s doubling to
  30 s, with jitter, as client-go's reflector. It starts again from 0.8 s whenever the server
  answers healthily (a list that completed, a watch it opened), so failures spread over a
  long fault do not add up to half-minute waits once the server is back. 401, 403 and 429
  (an API server that just started answers them until its authorizer and storage caches are
  filled) wait at most ``refused_backoff_cap``.
* **Staleness and readiness.** From the first failure (a 410, a failed list or watch)
  until a list completes or a watch is open again, the cache is *stale*: it may miss
  changes. A re-opened watch has caught up only once the server delivered something on it
  (an event or a bookmark: the server sends what was missed first) or it stayed open
  :data:`CAUGHT_UP_SECONDS`: the API server answers a resumed watch with its headers
  first and only then, in the stream, with 410 when the version is too old, and a cut can
  end a watch right after it opened. A watch that fails before it caught up leaves the
  staleness counting from the first failure, so re-opened watches that each fail at once
  never make a cache that is behind look current. :meth:`Informer.current` is false once
  it has been stale for ``stale_after`` seconds, or when the informer's thread ended
  without ``stop``; the manager's readiness (and with it the webhooks, which then refuse
  with 503 on this replica while a ready one answers) follows it. ``stale_after`` outlasts
  a normal relist or re-watch, so readiness does not flap while the server is healthy; a
  dead thread is logged as critical.
* **Bookmarks** only advance the resourceVersion; they never touch the cache.
* **Transform.** Each object passes through an optional ``transform`` before it is stored
  or handed to handlers, so a cache keeps only the fields its readers use (every pod of a
  large cluster is watched to count GPU use; whole pod objects would not fit in memory).
* **Handlers** run in the informer's thread, in event order, and must be quick: they map
  the event to keys and enqueue them (level-triggered controllers read the cache again).
* **Indexes** of the cache are the ``indexing.Store``'s, kept in step with every change.

Keys are ``(namespace, name)`` with ``""`` for cluster-scoped objects (``indexing.Key``).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuoperator.runtime import errors
from gpuoperator.runtime.backoff import Backoff
from gpuoperator.runtime.client import (
    WATCH_HEADERS_SECONDS,
    WATCH_IDLE_SECONDS,
    WATCH_TIMEOUT_SECONDS,
    Kind,
    Obj,
)
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.indexing import IndexFunc, Store, key_of
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

Transform = Callable[[Obj], Obj]


@dataclass
class Handlers:
    """Callbacks for one consumer. ``on_update`` gets (old, new); ``on_delete`` the last
    known state (after a relist, the state before the watch went down)."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    on_delete: Callable[[Obj], None] | None = None


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.events = Counter(
            "gpuoperator_informer_events_total",
            "Watch events applied to a cache",
            ["informer", "type"],
            **kw,
        )
        self.lists = Counter(
            "gpuoperator_informer_lists_total",
            "Full lists (initial and relists)",
            ["informer", "reason"],
            **kw,
        )
        self.objects = Gauge(
            "gpuoperator_informer_objects", "Objects in a cache", ["informer"], **kw
        )
        self.synced = Gauge(
            "gpuoperator_informer_synced", "1 once the first list is in", ["informer"], **kw
        )
        # What a cache knows, for "is this replica's cache following?" (read at scrape time).
        self.stale = Gauge(
            "gpuoperator_informer_stale_seconds",
            "Seconds the cache may have been missing changes (0: list done, watch open)",
            ["informer"],
            **kw,
        )
        self.heard = Gauge(
            "gpuoperator_informer_last_heard_seconds",
            "Seconds since the server last spoke on the watch (event, bookmark, list, opened)",
            ["informer"],
            **kw,
        )
        self.watching = Gauge(
            "gpuoperator_informer_watch_open",
            "1 while a watch's response is open (0: listing, opening or backing off)",
            ["informer"],
            **kw,
        )
        self.resource_version = Gauge(
            "gpuoperator_informer_resource_version",
            "The resourceVersion the cache follows from (its last list, event or bookmark)",
            ["informer"],
            **kw,
        )


_metrics = per_registry(_Metrics)


@dataclass
class InformerOptions:
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    transform: Transform | None = None
    indexers: dict[str, IndexFunc] = field(default_factory=dict)
    resync: float | None = None
    watch_timeout: int = WATCH_TIMEOUT_SECONDS
    page_size: int = 500
    #: Seconds without an event or bookmark after which a watch is abandoned and re-opened.
    watch_idle: float = WATCH_IDLE_SECONDS
    #: Seconds a watch may wait for its response headers before that counts as a failure.
    watch_headers: float = WATCH_HEADERS_SECONDS
    #: Backoff between failed lists/watches: (initial, cap) seconds, jittered.
    backoff: tuple[float, float] = (0.8, 30.0)
    #: The longest wait after a 401, 403 or 429 (a starting API server's answers).
    refused_backoff_cap: float = 5.0
    #: Seconds a cache may be stale (see the module docstring) before ``current()`` is false.
    stale_after: float = 10.0
    #: The kind may not be served (its CRD not installed, e.g. KubeVirt's): then the cache
    #: counts as synced and empty, and the list is retried until the kind appears.
    optional: bool = False


def abort(response: requests.Response) -> None:
    """End a streaming response that another thread is blocked reading: shut the socket
    down (a plain close from another thread would leave the reader blocked)."""
    conn = getattr(response.raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()


class ListWatcher(Protocol):
    """What an informer needs of a client (``Client`` is one)."""

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = ...,
        field_selector: str | None = ...,
        page_size: int = ...,
        transform: Callable[[Obj], Obj] | None = ...,
    ) -> tuple[list[Obj], str]: ...

    def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int = ...,
        label_selector: str | None = ...,
        field_selector: str | None = ...,
        bookmarks: bool = ...,
        stop: threading.Event | None = ...,
        opened: Callable[[requests.Response], None] | None = ...,
        idle_timeout: float = ...,
        headers_timeout: float = ...,
    ) -> Iterator[tuple[str, Obj]]: ...


#: Seconds a re-opened watch stays open without failing after which it has caught up even
#: if it delivered nothing (the server sends what was missed, or its 410, at once).
CAUGHT_UP_SECONDS = 5.0

#: Answers of a server that is up but not serving us yet: retried soon, not backed off long.
_REFUSED = (errors.UnauthorizedError, errors.ForbiddenError, errors.TooManyRequestsError)


class Informer:
    """Keeps a ``Store`` of one kind current and tells handlers about every change."""

    def __init__(
        self,
        client: ListWatcher,
        kind: Kind,
        options: InformerOptions | None = None,
        *,
        name: str | None = None,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.options = options or InformerOptions()
        self.name = name or kind.endpoint
        self.store = Store(self.options.indexers)
        self.resource_version = ""
        self._clock = clock
        self._handlers: list[Handlers] = []
        self._handlers_lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: requests.Response | None = None
        self._backoff = Backoff(*self.options.backoff)
        #: Monotonic time of the first failure since the cache was last known current.
        self._stale_since: float | None = None
        #: What the informer's thread is doing (see ``describe``), and when the server last
        #: spoke to it (a list completed, a watch opened, an event or a bookmark).
        self._phase = "starting"
        self._heard: float | None = None
        #: While a re-opened watch has not caught up: when it opened, and since when the
        #: cache had been stale before it (see the module docstring).
        self._opened_at: float | None = None
        self._behind_since: float | None = None
        self._metrics = _metrics(registry)
        self._log = log.bind(informer=self.name)
        m = self._metrics
        m.stale.labels(self.name).set_function(self.stale_for)
        m.heard.labels(self.name).set_function(lambda: self.describe()["last_heard_seconds"])
        m.watching.labels(self.name).set_function(lambda: float(self._phase == "watching"))
        m.resource_version.labels(self.name).set_function(
            lambda: float(self.resource_version) if self.resource_version.isdigit() else 0.0
        )

    # ---- consumers ----------------------------------------------------------------
    def add_handlers(self, handlers: Handlers) -> None:
        """Register a consumer; it is told about every object already in the cache first
        (as adds), so a late consumer misses nothing."""
        with self._handlers_lock, self.store.held():
            self._handlers.append(handlers)
            if handlers.on_add is not None:
                for obj in self.store.values():
                    handlers.on_add(obj)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def stale_for(self) -> float:
        """Seconds since the cache may have started missing changes (0 when it is current:
        its last list completed and its watch is open)."""
        since = self._stale_since
        return 0.0 if since is None else max(0.0, self._clock.monotonic() - since)

    def describe(self) -> dict[str, Any]:
        """What the cache knows, for diagnosis (the metrics carry the same figures): the
        thread's phase (``listing``, ``opening`` a watch, ``watching``, ``backoff``,
        ``stopped``), the resourceVersion it follows from, how long it may have been missing
        changes, and how long ago the server last spoke to it."""
        heard = self._heard
        return {
            "informer": self.name,
            "phase": "crashed" if self.crashed() else self._phase,
            "synced": self.has_synced(),
            "current": self.current(),
            "resource_version": self.resource_version,
            "objects": len(self.store),
            "stale_seconds": round(self.stale_for(), 1),
            "last_heard_seconds": (
                -1.0 if heard is None else round(max(0.0, self._clock.monotonic() - heard), 1)
            ),
        }

    def crashed(self) -> bool:
        """The informer's thread ended without ``stop``: the cache no longer follows."""
        thread = self._thread
        return thread is not None and not thread.is_alive() and not self._stop.is_set()

    def current(self) -> bool:
        """Whether readers may trust the cache: not stale for ``stale_after`` seconds or
        more, and still followed by a live thread (see the module docstring)."""
        return not self.crashed() and self.stale_for() < self.options.stale_after

    # ---- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop listing and watching, and wait up to ``timeout`` for the thread to end.

        A watch that has delivered its response headers is aborted at once; one still
        waiting for them ends when they come or after ``watch_headers``. The thread is a
        daemon: it never holds up process exit. Returns whether the thread has ended.
        """
        self._stop.set()
        response = self._response
        if response is not None:
            abort(response)
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _opened(self, response: requests.Response) -> None:
        """The watch's streaming response, as soon as its headers arrived: ``stop`` aborts
        it (a watch set up after ``stop`` is aborted here)."""
        self._response = response
        if self._stop.is_set():
            abort(response)
        elif response.ok:
            # The server answers: back off from the start next time, and the cache follows
            # again from its resourceVersion (nothing is missed across a re-watch).
            self._backoff.reset()
            self._heard_now()
            self._phase = "watching"
            behind_since = self._stale_since
            was = self._current()
            # Current unless this watch fails before it caught up (``_stale``).
            self._behind_since, self._opened_at = behind_since, self._clock.monotonic()
            if was > 0:
                self._log.info(
                    "watch open again",
                    reason="WatchOpened",
                    resource_version=self.resource_version,
                    stale_for=round(was, 1),
                )

    def run(self) -> None:
        """List and watch until ``stop``; survives every error by backing off. Should the
        thread die anyway, that is logged as critical and ``current()`` turns false."""
        try:
            self._run()
            self._phase = "stopped"
        except BaseException:
            self._log.critical("informer thread died; the cache no longer follows", exc_info=True)
            raise

    def _run(self) -> None:
        backoff = self._backoff
        relist, reason = True, "initial"
        while not self._stop.is_set():
            try:
                if relist:
                    self._phase = "listing"
                    self._list(reason)
                    relist = False
                    backoff.reset()
                self._phase = "opening"
                self._watch()
            except errors.NotFoundError as exc:
                if relist and self.options.optional:
                    self._absent(str(exc))
                    self._current()  # empty is what the server serves
                    self._stop.wait(self.options.backoff[1])
                else:
                    self._stale()
                    delay = backoff.next()
                    self._log.warning(
                        "list/watch failed; retrying",
                        reason="NotFound",
                        error=str(exc),
                        retry_in=round(delay, 2),
                        relist=relist,
                    )
                    self._phase = "backoff"
                    self._stop.wait(delay)
            except errors.GoneError as exc:
                self._stale()
                relist, reason = True, "gone"
                delay = backoff.next()
                self._log.info(
                    "watch expired; relisting",
                    reason="Gone",
                    error=str(exc),
                    retry_in=round(delay, 2),
                )
                self._phase = "backoff"
                self._stop.wait(delay)
            except (errors.ApiError, requests.RequestException, ValueError) as exc:
                if self._stop.is_set():
                    return  # the watch was aborted by stop(): not a failure
                self._stale()
                delay = backoff.next()
                if isinstance(exc, _REFUSED):
                    delay = min(delay, self.options.refused_backoff_cap)
                self._log.warning(
                    "list/watch failed; retrying",
                    reason=type(exc).__name__,
                    error=str(exc),
                    retry_in=round(delay, 2),
                    relist=relist,
                    stale_for=round(self.stale_for(), 1),
                )
                self._phase = "backoff"
                self._stop.wait(delay)
            except Exception as exc:  # a handler bug must not kill the cache
                if self._stop.is_set():
                    # stop() closed the stream under a read: urllib3 then fails in ways of
                    # its own (an AttributeError on the released connection), not an error.
                    return
                self._stale()
                delay = backoff.next()
                self._log.exception(
                    "informer error; retrying", reason=type(exc).__name__, retry_in=round(delay, 2)
                )
                self._phase = "backoff"
                self._stop.wait(delay)

    def _heard_now(self) -> None:
        self._heard = self._clock.monotonic()

    def _stale(self) -> None:
        """The cache may miss changes from now (unless it already might) — or since it
        first might, when the watch that failed had not caught up."""
        now = self._clock.monotonic()
        behind, opened = self._behind_since, self._opened_at
        self._behind_since = self._opened_at = None
        if self._stale_since is None:
            caught_up = opened is None or now - opened >= CAUGHT_UP_SECONDS
            self._stale_since = now if behind is None or caught_up else behind

    def _caught_up(self) -> None:
        """The watch delivered something: everything missed came before it."""
        self._behind_since = self._opened_at = None

    def _current(self) -> float:
        """The cache follows the server again; returns for how long it had been stale."""
        was = self.stale_for()
        self._stale_since = None
        self._caught_up()
        return was

    def _absent(self, why: str) -> None:
        """An optional kind is not served: empty the cache (deleting what it held) and
        count it as synced."""
        with self._handlers_lock:
            for key in self.store:
                old = self.store.remove(key)
                if old is not None:
                    self._notify("DELETED", old, None)
        if not self._synced.is_set():
            self._log.info("kind not served; cache empty until it is", reason="NotFound", error=why)
            self._synced.set()
            self._metrics.synced.labels(self.name).set(1)

    # ---- list ---------------------------------------------------------------------
    def _list(self, reason: str) -> None:
        o = self.options
        items, rv = self.client.list(
            self.kind,
            o.namespace,
            label_selector=o.label_selector,
            field_selector=o.field_selector,
            page_size=o.page_size,
            transform=o.transform,  # applied page by page: never a whole list of full objects
        )
        self._metrics.lists.labels(self.name, reason).inc()
        fresh = {key_of(obj): obj for obj in items}
        del items
        with self._handlers_lock:
            for key in set(self.store.keys()) - set(fresh):
                old = self.store.remove(key)
                if old is not None:
                    self._notify("DELETED", old, None)
            for obj in fresh.values():
                old = self.store.put(obj)
                self._notify("ADDED" if old is None else "MODIFIED", obj, old)
        self.resource_version = rv
        self._heard_now()
        self._metrics.objects.labels(self.name).set(len(self.store))
        stale = self._current()
        if not self._synced.is_set():
            self._synced.set()
            self._metrics.synced.labels(self.name).set(1)
            self._log.info("cache synced", objects=len(self.store), resource_version=rv)
        else:
            self._log.info(
                "cache relisted",
                reason=reason,
                objects=len(self.store),
                resource_version=rv,
                stale_for=round(stale, 1),
            )

    # ---- watch --------------------------------------------------------------------
    def _watch(self) -> None:
        o = self.options
        # Spread re-watches of many informers: a timeout between 1x and 2x the base.
        timeout = int(o.watch_timeout * (1 + random.random()))  # noqa: S311
        next_resync = self._clock.monotonic() + o.resync if o.resync else None
        events = self.client.watch(
            self.kind,
            o.namespace,
            resource_version=self.resource_version,
            timeout_seconds=timeout,
            label_selector=o.label_selector,
            field_selector=o.field_selector,
            stop=self._stop,
            opened=self._opened,  # so that stop() can abort a watch waiting for an event
            idle_timeout=o.watch_idle,
            headers_timeout=o.watch_headers,
        )
        for etype, obj in events:
            self._heard_now()
            self._caught_up()
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if etype == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            self._apply(etype, obj)
            if rv:
                self.resource_version = rv
            if next_resync is not None and self._clock.monotonic() >= next_resync:
                self._resync()
                next_resync = self._clock.monotonic() + (o.resync or 0)

    def _apply(self, etype: str, raw: Obj) -> None:
        obj = self._transform(raw)
        self._metrics.events.labels(self.name, etype).inc()
        with self._handlers_lock:
            if etype == "DELETED":
                old = self.store.remove(key_of(obj))
                self._notify("DELETED", old or obj, None)
            elif etype in ("ADDED", "MODIFIED"):
                old = self.store.put(obj)
                self._notify("ADDED" if old is None else "MODIFIED", obj, old)
        self._metrics.objects.labels(self.name).set(len(self.store))

    def _resync(self) -> None:
        with self._handlers_lock:
            for obj in self.store.values():
                self._notify("MODIFIED", obj, obj)

    def _transform(self, obj: Obj) -> Obj:
        return self.options.transform(obj) if self.options.transform else obj

    def _notify(self, etype: str, obj: Obj, old: Obj | None) -> None:
        for h in self._handlers:
            try:
                if etype == "ADDED" and h.on_add:
                    h.on_add(obj)
                elif etype == "MODIFIED" and h.on_update:
                    h.on_update(old if old is not None else obj, obj)
                elif etype == "DELETED" and h.on_delete:
                    h.on_delete(obj)
            except Exception:
                self._log.exception(
                    "event handler failed",
                    reason="HandlerError",
                    key="/".join(key_of(obj)),
                    event_type=etype,
                )
