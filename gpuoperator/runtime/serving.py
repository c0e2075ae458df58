"""HTTP(S) servers: health probes, metrics and admission webhooks, on asyncio with h11.

The webhooks fail closed (DESIGN.md §6): while they cannot answer, nothing with GPU claim
references can be created anywhere in the cluster. So no peer may hold up another: every
connection is a coroutine on one event loop, each phase of a connection has its own
deadline, and handlers run on a thread pool that only ever sees complete requests.

Why asyncio with h11, not a WSGI/ASGI server: the threaded servers (cheroot) handshake and
read on threads a slow peer can hold; uvicorn and hypercorn run on an event loop, but
neither bounds how long a request may take to arrive (uvicorn's keep-alive timer is reset
by every byte and it has no request-start timeout; hypercorn's read timeout is per read, so
one byte every few seconds holds a connection forever), nor the connections per source.
h11 (the HTTP/1.1 state machine uvicorn, hypercorn and httpx use) parses; this module owns
the sockets and the clock. Behaviour under abuse is measured by the slow-client test in
``test/unit/admission``.

A connection's life, with the :class:`Limits` that bound it:

1. accepted within ``max_connections`` in all and ``max_connections_per_source`` per
   source address, making room as follows (a connection is *waiting* while it waits for
   its handshake, its next request or the rest of one, *busy* while it is being answered):

   * at its source's limit, the oldest waiting connection of that source is closed; when
     all of them are busy, the new one is closed at once. A flood from one address churns
     its own sockets;
   * at the server's limit, the source holding the most connections gives one up (the
     newest-connected source among equals): its oldest waiting connection, or, when all of
     its connections are busy and it holds two or more beyond the newcomer's source, its
     oldest busy one (that request is dropped unanswered). A newcomer whose source holds
     as many as any makes room with its own oldest waiting connection, or is closed at
     once. So no set of busy connections from a few sources can hold every slot against
     a source that holds fewer (the API server's), and the source holding the most cannot
     push out anyone else's;
2. TLS handshake within ``handshake_timeout`` of the accept (a socket that never starts
   one costs its slot for that long, and nobody else anything). With a client CA
   (:class:`servercerts.ClientCA` on the certificate source) the peer must present a
   certificate it signed, or the connection ends at the handshake;
3. each request's head (request line and headers, at most ``max_header_bytes``) within
   ``header_timeout``: from the handshake for the first request, from its first byte for
   the next ones; between requests a kept-alive connection may stay idle ``idle_timeout``;
4. the body (at most ``max_body`` bytes, or the path's own limit in ``body_limits``; 413
   naming the limit beyond; ``Content-Length`` or chunked) within ``body_timeout`` from
   the end of the head. Each body's first ``small_body`` bytes are
   its own; a larger body takes room for the rest (its ``Content-Length``, or
   ``max_body`` when chunked) from ``max_buffered_bytes`` for all bodies together, all
   at once before reading it, and holds it until its answer is ready (a body that finds
   no room waits, its bytes left in the kernel, until its deadline; then 503). So large
   bodies, sent or held half-sent, cannot stall small ones (the API server's), cannot
   deadlock each other, and memory stays bounded whatever peers send;
5. the whole request waits for its handler in a queue of at most ``max_queued`` requests,
   served round-robin by source address (one request of each waiting source in turn), so
   a request waits for one request of each other source, not for everything one source
   sent; the request of a source with none waiting and none served in the current round
   goes first, so a source sending a request at a time (the API server, as a rule) waits
   for none. When the queue is full, the newest request of the source with the most waiting
   (the new one when its source has as many) is answered 429 with ``Retry-After``
   (client-go's REST client, which the API server calls webhooks with, retries such an
   answer), held ``throttle_hold`` before it is sent so that a client ignoring it costs
   one cheap request per connection per hold: a flood refuses its own requests. The
   handler runs on the server's thread pool (``workers``) with the whole request, so it
   never waits on a peer; an answer not ready within ``handler_timeout`` of the request's
   arrival is a 503.
   Paths the server is told are ``inline`` (handlers that only read memory and answer in
   well under a millisecond, such as webhooks deciding on caches) are answered on the event
   loop itself when their body is at most ``small_body`` bytes (from a queue of their own,
   so they never wait for a pool thread): the hop to a pool thread
   and back costs two GIL hand-offs, each of which waits up to the interpreter's switch
   interval while another thread of the process computes, which is more than such a
   handler takes. An inline handler holds up the loop while it runs, so one that may wait
   (on the network, a lock held long) must not be inline;
6. the answer is written within ``write_timeout`` (a peer that does not read is dropped);
   after ``max_requests`` requests the connection is closed (``Connection: close``).

Across phases 2 to 6 a connection holds one of its source's ``max_active_per_source``
*turns* while it handshakes (from the peer's first byte) and while it has a request in
progress (from the request's first byte to its answer written); the source's other
connections wait for a turn, first come first served, their bytes not parsed
(:class:`_Turns`). A request whose turn has not come by the end of its head's deadline is
answered 429 with ``Retry-After`` and its connection closed (it was not read). So however
many connections one address holds, at most that many of its handshakes and requests are
before the event loop at a time, and every other source's steps wait behind that many of
its steps, not behind all of them; a connection that sends nothing holds no turn.

A deadline that expires closes the connection (with a 408 when part of a request had
arrived); a request h11 cannot parse is a 400 (431 for oversized heads) naming the problem.

Certificates: a server with TLS asks its :class:`servercerts.CertificateSource` for an
``ssl.SSLContext`` at every handshake (:mod:`gpuoperator.runtime.servercerts`), so a new
certificate serves the next connection without a restart.

Memory, chosen and measured (``make fuzz`` prints it): every buffer is bounded and the
threads are few and fixed (one event loop per server plus its handler pool), so the
resident size under abuse is the baseline plus what the limits allow:

* a connection with TLS state costs about 300 KiB (asyncio gives each one a 256 KiB read
  buffer), so that state is made only once the peer sends its first byte: a socket that
  never starts TLS costs a file descriptor;
* bodies hold at most ``max_connections * small_body + max_buffered_bytes`` in all
  until their answers are ready; parsing one takes about twice its size again while its
  handler runs, so at most ``workers`` such copies exist at once;
* freed memory is not always returned to the system at once (glibc keeps arenas per
  thread); with few threads that is bounded too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import h11
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from gpuoperator.model import echo
from gpuoperator.runtime import servercerts
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

#: How much of a traceback a log line carries (its innermost frames, where the error is).
MAX_TRACEBACK: int = 4000
#: How much of one traceback line is kept.
MAX_TRACEBACK_LINE: int = 300


# -- requests and responses -------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A complete HTTP request, as a handler sees it."""

    method: str
    path: str
    body: bytes = b""
    #: Header names in lower case; repeated headers joined with ", ".
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The peer's address (the source that per-source limits count).
    peer: str = ""
    query: str = ""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]
App = Callable[[Request], Response]


def text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """The traceback of ``exc`` as one string of at most ``limit`` characters. Each line is
    cut to :data:`MAX_TRACEBACK_LINE` (an error's message may repeat tenant input), then
    the end (the innermost frames and the error) is kept and the start cut with an
    ellipsis."""
    lines = [
        line if len(line) <= MAX_TRACEBACK_LINE else line[: MAX_TRACEBACK_LINE - 2] + "…\n"
        for chunk in traceback.format_exception(exc)
        for line in chunk.splitlines(keepends=True)
    ]
    full = "".join(lines)
    return full if len(full) <= limit else "…" + full[-(limit - 1) :]


def app(routes: dict[str, Handler]) -> App:
    """Dispatch on the exact path; an unknown path is a 404, a handler error a logged 500
    (handlers that must never answer 5xx, the webhooks, catch their own errors)."""

    def dispatch(request: Request) -> Response:
        handler = routes.get(request.path)
        if handler is None:
            return text(404, "not found")
        try:
            return handler(request)
        except Exception as exc:
            log.error(
                "request handler failed",
                path=request.path,
                reason=type(exc).__name__,
                traceback=bounded_traceback(exc),
            )
            return text(500, "internal error")

    return dispatch


# -- limits -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one server grants its peers (see the module docstring for each phase)."""

    handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    idle_timeout: float = 30.0
    write_timeout: float = 10.0
    handler_timeout: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_body: int = 64 * 1024
    #: Bodies up to this size never wait for the memory budget (see ``max_buffered_bytes``).
    small_body: int = 64 * 1024
    max_buffered_bytes: int = 32 * 1024 * 1024
    max_connections: int = 1024
    max_connections_per_source: int = 128
    #: Connections of one source handshaking or with a request in progress at once (the
    #: others wait their turn, unparsed; see :class:`_Turns`).
    max_active_per_source: int = 8
    max_requests: int = 1000
    workers: int = 4
    #: Complete requests waiting for a handler, per queue (the event loop's, the pool's).
    max_queued: int = 64
    #: Seconds a 429 (queue full) asks the client to wait before retrying.
    retry_after: int = 1
    #: Seconds a 429 is held before it is sent: a client that ignores ``Retry-After`` gets
    #: one refusal per connection per hold, and costs the server one cheap request for it
    #: (at most half of ``handler_timeout``).
    throttle_hold: float = 0.5

    def __post_init__(self) -> None:
        for name in (
            "handshake_timeout",
            "header_timeout",
            "body_timeout",
            "idle_timeout",
            "write_timeout",
            "handler_timeout",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name}: {getattr(self, name)!r} is not > 0")
        for name in (
            "max_header_bytes",
            "max_body",
            "small_body",
            "max_buffered_bytes",
            "max_connections",
            "max_connections_per_source",
            "max_active_per_source",
            "max_requests",
            "workers",
            "max_queued",
            "retry_after",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name}: {getattr(self, name)!r} is not ≥ 1")
        if not self.throttle_hold >= 0:
            raise ValueError(f"Limits.throttle_hold: {self.throttle_hold!r} is not ≥ 0")
        if self.max_body > self.max_buffered_bytes:
            raise ValueError(
                f"Limits.max_body ({self.max_body}) exceeds max_buffered_bytes "
                f"({self.max_buffered_bytes})"
            )


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not an address such as :8080 or 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - probes come from kubelet


# -- metrics ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Metrics:
    open: Gauge
    refused: PromCounter
    dropped: PromCounter
    throttled: PromCounter
    queued: Gauge
    waited: PromCounter


@per_registry
def _metrics(registry: CollectorRegistry) -> _Metrics:
    return _Metrics(
        open=Gauge(
            "gpuoperator_http_open_connections",
            "Connections open per server",
            ["server"],
            registry=registry,
        ),
        refused=PromCounter(
            "gpuoperator_http_connections_refused_total",
            "Connections closed at accept by a connection limit",
            ["server", "reason"],
            registry=registry,
        ),
        dropped=PromCounter(
            "gpuoperator_http_connections_dropped_total",
            "Connections closed by the server before a complete exchange, by reason",
            ["server", "reason"],
            registry=registry,
        ),
        throttled=PromCounter(
            "gpuoperator_http_requests_throttled_total",
            "Requests answered 429 because their handler queue was full, by queue "
            "(loop: handlers answered on the event loop; pool: on the handler threads)",
            ["server", "queue"],
            registry=registry,
        ),
        queued=Gauge(
            "gpuoperator_http_queued_requests",
            "Complete requests waiting for a handler, by queue",
            ["server", "queue"],
            registry=registry,
        ),
        waited=PromCounter(
            "gpuoperator_http_source_turn_waits_total",
            "Handshakes and requests that waited for a turn of their source (as many of its "
            "connections were handshaking or being answered as it may have), by phase",
            ["server", "phase"],
            registry=registry,
        ),
    )


# -- the server -------------------------------------------------------------------------------


@dataclass(eq=False)
class _Conn:
    """One open connection, as the limits see it."""

    source: str
    since: float = field(default_factory=time.monotonic)
    #: A request of it is being answered (handler or write): never evicted then.
    busy: bool = False
    evicted: bool = False
    gone: bool = False
    task: asyncio.Task[None] | None = None


@dataclass
class _Held:
    """The bytes of one body counted against the memory budget."""

    taken: int = 0


class _DropError(Exception):
    """End the connection; ``answer`` is sent first when the peer may still read it."""

    def __init__(self, reason: str, answer: Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answer = answer


@dataclass(eq=False)
class _Job:
    """A complete request waiting for its handler, and where its answer goes."""

    source: str
    request: Request
    answer: asyncio.Future[Response]


class _FairQueue:
    """Requests waiting for a handler, at most ``capacity``, served round-robin by source
    address (one request of each source with requests waiting, in turn), so however many
    requests one source queues, another's waits for one request of each source only.

    A source with no request waiting and none served in the current round is *new*: its
    request is served before the round goes on (new sources in their order of arrival),
    then the source joins the end of the round. So a source that sends a request at a
    time (the API server's, as a rule) waits for no other source's requests, and gains
    that at most once per round: a source queueing many, or sending one again as soon as
    one is answered, is served in the round like the others.

    When it is full, the request refused is the newest of the source with the most
    requests waiting (the arriving one when its source has as many): a flood refuses
    its own requests, never those of a source that queues fewer.
    """

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        #: The new sources' waiting requests (never empty), in order of arrival.
        self._new: dict[str, collections.deque[_Job]] = {}
        #: The other sources' waiting requests; the dict's order is the round-robin turn. A
        #: source served stays here until its turn comes round, maybe with none waiting.
        self._old: dict[str, collections.deque[_Job]] = {}
        self._size = 0
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return self._size

    def _queue(self, source: str) -> collections.deque[_Job] | None:
        queue = self._new.get(source)
        return self._old.get(source) if queue is None else queue

    def waiting(self, source: str) -> int:
        queue = self._queue(source)
        return 0 if queue is None else len(queue)

    def push(self, job: _Job) -> _Job | None:
        """Queue ``job``; return the job refused to make room (maybe ``job``), or None."""
        refused: _Job | None = None
        if self._size >= self.capacity:
            heaviest = max((*self._new.values(), *self._old.values()), key=len)
            if self.waiting(job.source) >= len(heaviest):
                return job
            refused = heaviest.pop()
            self._size -= 1
            if not heaviest:
                self._new.pop(refused.source, None)
        queue = self._queue(job.source)
        if queue is None:
            queue = self._new[job.source] = collections.deque()
        queue.append(job)
        self._size += 1
        self._ready.set()
        return refused

    def discard(self, job: _Job) -> None:
        """Forget ``job`` (its connection stopped waiting for it)."""
        queue = self._queue(job.source)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(job)
            self._size -= 1
        if not queue:
            self._new.pop(job.source, None)

    async def get(self) -> _Job:
        """The next job: a new source's, else the next in round-robin order; waits for one."""
        while not self._size:
            self._old.clear()  # every source's turn has come: all are new again
            self._ready.clear()
            await self._ready.wait()
        if self._new:
            source = next(iter(self._new))
            queue = self._new.pop(source)
        else:
            while True:  # a source with none waiting when its turn comes leaves the round
                source = next(iter(self._old))
                queue = self._old.pop(source)
                if queue:
                    break
        job = queue.popleft()
        self._size -= 1
        self._old[source] = queue  # to the end of the round
        return job


class _Turns:
    """The turns of one source address: at most ``limit`` of its connections handshake or
    have a request in progress at once (from the request's first byte to its answer
    written); the others wait, first come first served, their requests not yet parsed.

    A flood from one address therefore puts at most ``limit`` requests at a time before
    the event loop, however many connections it holds: every other source's handshake,
    request and answer waits behind that many of the flood's steps, not behind all of
    them. Invariant: ``active <= limit``; a waiter is granted its turn (``active`` counted
    for it) before it is woken, so a waiter cancelled after its grant gives the turn back.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def idle(self) -> bool:
        return not self.active and not self._waiters

    def free(self) -> bool:
        """A turn is free now (``acquire`` will not wait)."""
        return self.active < self.limit and not self._waiters

    async def acquire(self) -> None:
        """Take a turn, waiting for one; the caller must ``release`` it."""
        if self.free():
            self.active += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted, then cancelled before it ran: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a turn back: to the oldest waiter, or to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on: ``active`` stays
                return
        self.active -= 1


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    417: "Expectation Failed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Server:
    """One server: its event loop and handler pool on background threads.

    ``tls`` is a :class:`servercerts.CertificateSource`, or a ``(cert, key)`` pair of files (served
    through :class:`servercerts.FileCertificates`), or ``None`` for plain HTTP. ``start`` binds the
    port (a taken port fails there, at startup) and returns once the server accepts.
    """

    def __init__(
        self,
        name: str,
        address: str,
        handler: App,
        *,
        tls: servercerts.CertificateSource | tuple[Path, Path] | None = None,
        limits: Limits | None = None,
        registry: CollectorRegistry = REGISTRY,
        inline: Collection[str] = (),
        body_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self._address = parse_address(address)
        self._handler = handler
        #: Paths answered on the event loop (small bodies only; see the module docstring).
        self._inline = frozenset(inline)
        self.limits = limits or Limits()
        #: The largest body accepted per path (``max_body`` for the others).
        self.body_limits = dict(body_limits or {})
        for path, limit in self.body_limits.items():
            if not 1 <= limit <= self.limits.max_body:
                raise ValueError(
                    f"body_limits[{path!r}]: {limit!r} is not between 1 and Limits.max_body "
                    f"({self.limits.max_body})"
                )
        self.certificates: servercerts.CertificateSource | None = (
            servercerts.FileCertificates(*tls) if isinstance(tls, tuple) else tls
        )
        self.tls = tls is not None
        self._metrics = _metrics(registry)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stopped: asyncio.Event | None = None
        self._open = 0
        #: Open connections per source address, oldest first.
        self._by_source: dict[str, dict[int, _Conn]] = {}
        self._limited: set[str] = set()
        self._buffered = 0
        self._budget: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests waiting for a handler on the event loop, and for a pool thread.
        self._loop_queue: _FairQueue | None = None
        self._pool_queue: _FairQueue | None = None
        #: (queue, source) pairs whose requests are being refused with 429 (logged once).
        self._throttled: set[tuple[str, str]] = set()
        #: Sources that gave up connections at the server's limit (logged once).
        self._crowding: set[str] = set()
        #: When each source was last logged for a refused client certificate.
        self._uncertified: dict[str, float] = {}
        #: The turns of each source with connections (see :class:`_Turns`).
        self._turns: dict[str, _Turns] = {}
        #: When each source was last logged for waiting for its turns.
        self._busy: dict[str, float] = {}
        self._log = log.bind(server=name)

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        bound: tuple[str, int] = self._sock.getsockname()[:2]
        return bound[1]

    @property
    def open_connections(self) -> int:
        return self._open

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        host, port = self._address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say so, and
        # without it a small answer waits for the peer's delayed ACK (40 ms on Linux).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self._executor = ThreadPoolExecutor(
            self.limits.workers, thread_name_prefix=f"http-{self.name}"
        )
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=f"http-{self.name}-loop", daemon=True
        )
        self._thread.start()
        started.wait(10)
        self._log.info("serving", port=self.port, tls=self.tls, reason="Started")

    def _run(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(started))
        finally:
            loop.close()

    async def _serve(self, started: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._budget = asyncio.Condition()
        self._loop_queue = _FairQueue("loop", self.limits.max_queued)
        self._pool_queue = _FairQueue("pool", self.limits.max_queued)
        for lane in (self._loop_queue, self._pool_queue):
            self._metrics.queued.labels(self.name, lane.name).set_function(partial(len, lane))
        accepting = loop.create_task(self._accept(loop))
        dispatching = [
            loop.create_task(self._run_inline(self._loop_queue)),
            loop.create_task(self._run_pooled(loop, self._pool_queue)),
        ]
        started.set()
        await self._stopped.wait()
        accepting.cancel()
        if self._sock is not None:
            self._sock.close()
        tasks = [accepting, *dispatching, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(5)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- accepting --------------------------------------------------------------------
    async def _accept(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._sock is not None
        limits = self.limits
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, or the like: back off briefly
                self._log.warning("accept failed", reason=type(exc).__name__, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            source = str(address[0]) if isinstance(address, tuple) and address else "unknown"
            if self._open >= limits.max_connections and not self._make_room(source):
                self._refuse(conn, source, "TooManyConnections")
                continue
            mine = self._by_source.get(source, {})
            if len(mine) >= limits.max_connections_per_source and not self._evict(source):
                self._refuse(conn, source, "TooManyConnectionsFromSource")
                continue
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state = _Conn(source)
            self._open += 1
            self._by_source.setdefault(source, {})[id(state)] = state
            self._metrics.open.labels(self.name).inc()
            state.task = loop.create_task(self._connection(loop, conn, state))
            self._tasks.add(state.task)
            state.task.add_done_callback(self._tasks.discard)

    def _make_room(self, newcomer: str) -> bool:
        """At the server's limit: the source holding the most connections (the
        newest-connected among equals) gives one up: its oldest waiting connection, or,
        when it holds two or more beyond ``newcomer``'s source and all of its connections
        are busy, its oldest busy one. A newcomer whose source holds as many as any makes
        room with its own oldest waiting connection only. False when nothing may be
        closed."""
        pools = self._by_source
        own = pools.get(newcomer, {})
        if not pools:
            return False
        heaviest = max(
            pools, key=lambda s: (len(pools[s]), next(reversed(pools[s].values())).since)
        )
        pool = pools[heaviest]
        if heaviest == newcomer or len(pool) <= len(own):
            victim = next((c for c in own.values() if not c.busy), None)
        else:
            victim = next((c for c in pool.values() if not c.busy), None)
            if victim is None and len(pool) > len(own) + 1:
                victim = next(iter(pool.values()))
        if victim is None or victim.task is None:
            return False
        if victim.source not in self._crowding:
            self._crowding.add(victim.source)
            self._log.info(
                "server at its connection limit; the source holding the most connections "
                "gives up its oldest to make room",
                peer=victim.source,
                connections=len(pools[victim.source]),
                limit=self.limits.max_connections,
                reason="EvictedHeaviestSource",
            )
        victim.evicted = True
        self._forget(victim)
        victim.task.cancel()
        self._metrics.refused.labels(self.name, "EvictedHeaviestSource").inc()
        return True

    def _evict(self, source: str | None) -> bool:
        """Make room by closing the oldest connection (of ``source``, or of any source) that
        is not being answered: one waiting for its handshake, its next request, or the rest
        of one. False when every such connection is busy."""
        pools = (
            [self._by_source.get(source, {})] if source is not None else self._by_source.values()
        )
        oldest: _Conn | None = None
        for pool in pools:  # each pool is oldest first
            candidate = next((c for c in pool.values() if not c.busy), None)
            if candidate is not None and (oldest is None or candidate.since < oldest.since):
                oldest = candidate
        if oldest is None or oldest.task is None:
            return False
        self._note_limited(oldest.source if source is not None else None)
        oldest.evicted = True
        self._forget(oldest)
        oldest.task.cancel()
        self._metrics.refused.labels(
            self.name, "EvictedForSource" if source is not None else "Evicted"
        ).inc()
        return True

    def _forget(self, state: _Conn) -> None:
        """Count a connection as closed (once)."""
        if state.gone:
            return
        state.gone = True
        self._open -= 1
        pool = self._by_source.get(state.source, {})
        pool.pop(id(state), None)
        if not pool:
            self._by_source.pop(state.source, None)
            self._crowding.discard(state.source)
            turns = self._turns.get(state.source)
            if turns is not None and turns.idle():
                del self._turns[state.source]
        self._metrics.open.labels(self.name).dec()
        if state.source in self._limited and (
            len(pool) < self.limits.max_connections_per_source // 2
        ):
            self._limited.discard(state.source)
            self._log.info(
                "source back under its connection limit", peer=state.source, reason="UnderLimit"
            )

    def _note_limited(self, source: str | None) -> None:
        if source is not None and source not in self._limited:
            self._limited.add(source)
            self._log.info(
                "source reached its connection limit; its oldest waiting connections are "
                "closed to make room",
                peer=source,
                reason="TooManyConnectionsFromSource",
                limit=self.limits.max_connections_per_source,
            )

    def _refuse(self, conn: socket.socket, source: str, reason: str) -> None:
        self._metrics.refused.labels(self.name, reason).inc()
        self._log.debug("connection refused", peer=source, reason=reason)
        conn.close()

    # ---- one connection ---------------------------------------------------------------
    async def _connection(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, state: _Conn
    ) -> None:
        limits = self.limits
        source = state.source
        reason = "Closed"
        writer: asyncio.StreamWriter | None = None
        try:
            reader = asyncio.StreamReader(limit=65536, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport: asyncio.Transport
            if self.certificates is None:
                transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
            else:
                transport = await self._handshake(loop, conn, protocol, source)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._exchanges(reader, writer, state)
        except _DropError as drop:
            reason = drop.reason
            self._metrics.dropped.labels(self.name, reason).inc()
            if drop.answer is not None and writer is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(limits.write_timeout):
                        writer.write(_raw_answer(drop.answer))
                        await writer.drain()
                    await _linger(reader)
        except (ConnectionError, ssl.SSLError, OSError, asyncio.IncompleteReadError):
            reason = "PeerGone"
        except asyncio.CancelledError:
            # Evicted, or the server is stopping: this connection's task ends here, quietly
            # (it is the task's outermost frame, so nothing awaits the cancellation).
            reason = "Evicted" if state.evicted else "ServerStopped"
        finally:
            try:
                if writer is None:
                    conn.close()
                else:
                    await _close(writer)
            finally:
                self._log.debug("connection closed", peer=source, reason=reason)
                self._forget(state)

    async def _handshake(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        protocol: asyncio.StreamReaderProtocol,
        peer: str,
    ) -> asyncio.Transport:
        """The TLS handshake, within ``handshake_timeout`` of the accept. Its state (asyncio
        gives each TLS connection a 256 KiB read buffer) is made only once the peer has
        sent its first byte, so a socket that never starts TLS costs a file descriptor."""
        assert self.certificates is not None
        deadline = loop.time() + self.limits.handshake_timeout
        try:
            async with asyncio.timeout_at(deadline):
                await _readable(loop, conn)
                async with self._turn(peer, "handshake"):
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol,
                        conn,
                        ssl=self.certificates.context(),
                        ssl_handshake_timeout=max(0.001, deadline - loop.time()),
                    )
        except TimeoutError:
            raise _DropError("HandshakeTimeout") from None
        except ssl.SSLError as exc:
            if getattr(self.certificates, "client_ca", None) is not None and (
                exc.reason in _CLIENT_CERTIFICATE_ERRORS
            ):
                self._note_uncertified(peer, exc.reason or "")
                raise _DropError("ClientCertificateRefused") from exc
            raise _DropError("HandshakeFailed") from exc
        except OSError as exc:
            raise _DropError("HandshakeFailed") from exc
        return transport

    @contextlib.asynccontextmanager
    async def _turn(
        self, source: str, phase: str, deadline: float | None = None
    ) -> AsyncIterator[None]:
        """One of ``source``'s turns for ``phase`` (``handshake`` or ``request``), waited for
        until ``deadline`` (the caller's own deadline bounds it when None). A request whose
        turn does not come by then is answered 429 and its connection closed: its source's
        own requests hold every turn, and this one was not read."""
        turns = self._turns.get(source)
        if turns is None:
            turns = self._turns[source] = _Turns(self.limits.max_active_per_source)
        if turns.free():
            await turns.acquire()
        else:
            self._metrics.waited.labels(self.name, phase).inc()
            self._note_busy(source, turns)
            try:
                async with asyncio.timeout_at(deadline):
                    await turns.acquire()
            except TimeoutError:
                if deadline is None:
                    raise
                raise _DropError("SourceBusy", self._source_busy(source)) from None
        try:
            yield
        finally:
            turns.release()
            if turns.idle() and source not in self._by_source:
                self._turns.pop(source, None)

    def _source_busy(self, source: str) -> Response:
        limits = self.limits
        return Response(
            429,
            (
                f"too many requests of {echo.clip(source, 64)} are in progress at once (the "
                f"limit is {limits.max_active_per_source} per source address); retry after "
                f"{limits.retry_after}s\n"
            ).encode(),
            headers=(("Retry-After", str(limits.retry_after)),),
        )

    def _note_busy(self, source: str, turns: _Turns) -> None:
        """One info line per source and minute whose handshakes or requests wait for its
        turns (the metric counts each)."""
        now = time.monotonic()
        if now - self._busy.get(source, -60.0) < 60.0:
            return
        if len(self._busy) > 1024:
            self._busy = {p: t for p, t in self._busy.items() if now - t < 60.0}
        self._busy[source] = now
        self._log.info(
            "source has as many connections handshaking or being answered as it may; its "
            "other connections wait their turn",
            peer=source,
            limit=turns.limit,
            waiting=turns.waiting + 1,
            reason="SourceBusy",
        )

    def _note_uncertified(self, peer: str, why: str) -> None:
        """One info line per source and minute for handshakes refused for want of a valid
        client certificate (the metric counts each)."""
        now = time.monotonic()
        if now - self._uncertified.get(peer, -60.0) < 60.0:
            return
        if len(self._uncertified) > 1024:
            self._uncertified = {p: t for p, t in self._uncertified.items() if now - t < 60.0}
        self._uncertified[peer] = now
        self._log.info(
            "connection refused at the handshake: no client certificate signed by the client CA",
            peer=peer,
            error=why,
            reason="ClientCertificateRefused",
        )

    async def _exchanges(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Conn
    ) -> None:
        limits = self.limits
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        loop = asyncio.get_running_loop()
        served = 0
        while True:
            # The next request's first byte: within ``header_timeout`` of the handshake for
            # the first request, ``idle_timeout`` between requests. Only then does the
            # request take one of its source's turns, so a connection that sends nothing
            # holds none.
            start = loop.time()
            if not conn.trailing_data[0]:
                timeout = limits.idle_timeout if served else limits.header_timeout
                try:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(65536)
                except TimeoutError:
                    raise _DropError("IdleTimeout" if served else "HeaderTimeout") from None
                if not data:
                    return
                conn.receive_data(data)
            if served:
                start = loop.time()
            head_deadline = start + limits.header_timeout
            async with self._turn(state.source, "request", head_deadline):
                if not await self._exchange(conn, reader, writer, state, head_deadline, served):
                    return
            served += 1
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _exchange(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: _Conn,
        head_deadline: float,
        served: int,
    ) -> bool:
        """One request read, answered and its answer written; False when the connection
        ends with it (or before it)."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        request = await self._read_head(conn, reader, head_deadline, seen_bytes=True)
        if request is None:
            return False
        limit = self.body_limits.get(_path_of(request), limits.max_body)
        declared = self._declared_length(request, limit)
        # A body's bytes beyond ``small_body`` count against the memory budget until its
        # answer is ready.
        held = _Held()
        try:
            body = await self._read_body(
                conn, reader, loop.time() + limits.body_timeout, held, declared, limit
            )
            state.busy = True
            response = await self._answer(request, body, state.source, loop)
            del body
        finally:
            await self._release(held.taken)
        keep = served + 1 < limits.max_requests and conn.our_state is h11.SEND_RESPONSE
        await self._send(conn, writer, response, close=not keep)
        state.busy = False
        return conn.our_state is not h11.MUST_CLOSE and keep

    async def _read_head(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        deadline: float,
        *,
        seen_bytes: bool,
    ) -> h11.Request | None:
        received = seen_bytes
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        if not data and not received:
                            return None
                        received = received or bool(data)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        # h11 bounds a head only while it is incomplete; one that arrived
                        # whole in one read is measured here.
                        if _head_size(event) > self.limits.max_header_bytes:
                            raise _DropError("BadRequest", text(431, self._too_large_head()))
                        return event
                    if isinstance(event, h11.ConnectionClosed):
                        return None
                    raise _DropError("BadRequest", text(400, f"unexpected {type(event).__name__}"))
        except TimeoutError:
            answer = text(408, "the request head did not arrive in time") if received else None
            raise _DropError("HeaderTimeout", answer) from None
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint if exc.error_status_hint in _REASONS else 400
            if status == 431:
                message = self._too_large_head()
            else:
                message = f"malformed HTTP request: {echo.clip(str(exc), 200)}"
            raise _DropError("BadRequest", text(status, message)) from None

    def _declared_length(self, request: h11.Request, limit: int) -> int | None:
        """The body's ``Content-Length`` (``None`` when chunked); 413 beyond ``limit``,
        before reading any of it."""
        for name, value in request.headers:
            if name == b"content-length":
                declared = int(value)  # h11 has checked it is a non-negative integer
                if declared > limit:
                    raise _DropError(
                        "BodyTooLarge",
                        text(413, self._too_large_body(request, f"{declared} bytes", limit)),
                    )
                return declared
        return None

    def _too_large_body(self, request: h11.Request, size: str, limit: int) -> str:
        method = request.method.decode("latin-1")
        path = echo.clip(_path_of(request), 100)
        return f"a body of {size} exceeds the limit of {limit} bytes for {method} {path}"

    def _too_large_head(self) -> str:
        return f"the request head exceeds {self.limits.max_header_bytes} bytes"

    async def _read_body(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        body_deadline: float,
        held: _Held,
        declared: int | None,
        limit: int,
    ) -> bytes:
        limits = self.limits
        chunks: list[bytes] = []
        size = 0
        waiting = False
        try:
            if conn.they_are_waiting_for_100_continue:
                raise _DropError("BadRequest", text(417, "Expect: 100-continue is not supported"))
            async with asyncio.timeout_at(body_deadline):
                if declared is not None and declared > limits.small_body:
                    # All its room at once, before reading it: bodies that each held part
                    # of the budget while waiting for the rest would wait on each other.
                    waiting = True
                    await self._take(declared - limits.small_body, held)
                    waiting = False
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Data):
                        size += len(event.data)
                        if size > limit:
                            raise _DropError(
                                "BodyTooLarge",
                                text(413, f"the body exceeds the limit of {limit} bytes"),
                            )
                        chunks.append(bytes(event.data))
                        if size > limits.small_body and not held.taken:
                            # A chunked body grew large: room for the largest it may be.
                            waiting = True
                            await self._take(limit - limits.small_body, held)
                            waiting = False
                        continue
                    if isinstance(event, h11.EndOfMessage):
                        return b"".join(chunks)
                    if isinstance(event, h11.ConnectionClosed):
                        raise _DropError("PeerGone")
                    raise _DropError("BadRequest", text(400, f"unexpected {type(event).__name__}"))
        except TimeoutError:
            if waiting:
                raise _DropError(
                    "BufferFull",
                    text(503, "the server is holding too many large bodies; retry shortly"),
                ) from None
            raise _DropError(
                "BodyTimeout",
                text(408, f"the request body did not arrive within {limits.body_timeout:g}s"),
            ) from None
        except h11.RemoteProtocolError as exc:
            raise _DropError(
                "BadRequest", text(400, f"malformed HTTP body: {echo.clip(str(exc), 200)}")
            ) from None

    async def _take(self, size: int, held: _Held) -> None:
        """Count ``size`` bytes against ``max_buffered_bytes`` (into ``held``), waiting while
        other bodies hold the budget (the peer's bytes wait in the kernel meanwhile); the
        caller's deadline bounds the wait."""
        assert self._budget is not None
        limit = self.limits.max_buffered_bytes
        async with self._budget:
            await self._budget.wait_for(lambda: self._buffered + size <= limit)
            self._buffered += size
            held.taken += size

    async def _release(self, size: int) -> None:
        assert self._budget is not None
        if not size:
            return
        async with self._budget:
            self._buffered -= size
            self._budget.notify_all()

    async def _answer(
        self, head: h11.Request, body: bytes, source: str, loop: asyncio.AbstractEventLoop
    ) -> Response:
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in head.headers:
            key = name.decode("latin-1")
            text_value = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text_value}" if key in headers else text_value
        request = Request(
            method=head.method.decode("latin-1"),
            path=path,
            body=body,
            headers=headers,
            peer=source,
            query=query,
        )
        inline = path in self._inline and len(body) <= self.limits.small_body
        lane = self._loop_queue if inline else self._pool_queue
        assert lane is not None
        job = _Job(source, request, loop.create_future())
        refused = lane.push(job)
        if refused is not None:
            self._throttle(lane, refused)
        try:
            async with asyncio.timeout(self.limits.handler_timeout):
                return await job.answer
        except TimeoutError:
            lane.discard(job)
            self._log.warning(
                "request not answered in time",
                path=path,
                reason="HandlerTimeout",
                seconds=self.limits.handler_timeout,
            )
            return text(503, "the server did not answer in time; retry shortly")
        except BaseException:
            lane.discard(job)  # evicted or stopping: nobody waits for the answer any more
            raise

    def _throttle(self, lane: _FairQueue, job: _Job) -> None:
        """Answer ``job`` 429: its queue is full and its source has the most waiting."""
        limits = self.limits
        self._metrics.throttled.labels(self.name, lane.name).inc()
        key = (lane.name, job.source)
        if key not in self._throttled:
            self._throttled.add(key)
            self._log.info(
                "handler queue full; the requests of the source with the most waiting are "
                "answered 429",
                peer=job.source,
                queue=lane.name,
                waiting=lane.waiting(job.source),
                limit=lane.capacity,
                reason="QueueFull",
            )
        refusal = Response(
            429,
            (
                f"too many requests are waiting for this server's handlers (the limit is "
                f"{lane.capacity}; {lane.waiting(job.source)} of them from "
                f"{echo.clip(job.source, 64)}); retry after {limits.retry_after}s\n"
            ).encode(),
            headers=(("Retry-After", str(limits.retry_after)),),
        )
        hold = min(limits.throttle_hold, limits.handler_timeout / 2)
        asyncio.get_running_loop().call_later(hold, _settle, job.answer, refusal)

    def _dequeued(self, lane: _FairQueue, job: _Job) -> None:
        key = (lane.name, job.source)
        if key in self._throttled and not lane.waiting(job.source):
            self._throttled.discard(key)
            self._log.info(
                "source's requests queue again", peer=job.source, queue=lane.name, reason="Drained"
            )

    async def _run_inline(self, lane: _FairQueue) -> None:
        """Answer the event loop's queue, one request at a time, in its round-robin order,
        letting the loop read and write between two."""
        while True:
            job = await lane.get()
            self._dequeued(lane, job)
            if job.answer.done():
                continue
            try:
                response = self._handler(job.request)
            except Exception as exc:  # a handler not wrapped by app(): still an answer
                response = self._failed(job.request.path, exc)
            if not job.answer.done():
                job.answer.set_result(response)
            await asyncio.sleep(0)

    async def _run_pooled(self, loop: asyncio.AbstractEventLoop, lane: _FairQueue) -> None:
        """Hand the pool's queue to the handler threads, the next request in round-robin
        order whenever a thread is free."""
        assert self._executor is not None
        free = asyncio.Semaphore(self.limits.workers)
        while True:
            await free.acquire()
            job = await lane.get()
            self._dequeued(lane, job)
            if job.answer.done():
                free.release()
                continue
            running = loop.run_in_executor(self._executor, self._handler, job.request)
            running.add_done_callback(partial(self._pooled_done, job, free))

    def _pooled_done(
        self, job: _Job, free: asyncio.Semaphore, running: asyncio.Future[Response]
    ) -> None:
        free.release()
        if job.answer.done():
            return
        if running.cancelled():
            job.answer.set_result(text(503, "the server is stopping; retry shortly"))
            return
        exc = running.exception()
        if exc is None:
            job.answer.set_result(running.result())
        else:  # a handler not wrapped by app(): still an answer
            job.answer.set_result(
                self._failed(
                    job.request.path, exc if isinstance(exc, Exception) else Exception(exc)
                )
            )

    def _failed(self, path: str, exc: Exception) -> Response:
        """The answer to a request whose handler raised: logged with a bounded traceback."""
        self._log.error(
            "request handler failed",
            path=path,
            reason=type(exc).__name__,
            traceback=bounded_traceback(exc),
        )
        return text(500, "internal error")

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, *, close: bool
    ) -> None:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        if close:
            headers.append(("Connection", "close"))
        data = conn.send(
            h11.Response(
                status_code=response.status,
                headers=headers,
                reason=_REASONS.get(response.status, "Status"),
            )
        )
        data = (data or b"") + (conn.send(h11.Data(data=response.body)) or b"")
        data += conn.send(h11.EndOfMessage()) or b""
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                writer.write(data)
                await writer.drain()
        except TimeoutError:
            raise _DropError("WriteTimeout") from None


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """Wait until ``conn`` has something to read (or is closed), reading nothing."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _linger(reader: asyncio.StreamReader) -> None:
    """After an answer to a request that was not read to its end: discard what the peer
    still sends, for at most a second and 1 MiB, so that closing with unread data (which
    makes the kernel send a reset) does not destroy the answer before the peer reads it."""
    discarded = 0
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            while discarded < 1024 * 1024:
                data = await reader.read(65536)
                if not data:
                    return
                discarded += len(data)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close gracefully (what was written is flushed, TLS says goodbye) for at most a
    second, then abort: a peer that does not read cannot hold the connection."""
    writer.close()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    writer.transport.abort()


def _raw_answer(response: Response) -> bytes:
    """An answer outside h11's state machine (the request could not be parsed)."""
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        + "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + response.body


def _settle(answer: asyncio.Future[Response], response: Response) -> None:
    if not answer.done():
        answer.set_result(response)


#: OpenSSL's reasons for a handshake that failed on the client's certificate (none sent,
#: or not signed by the client CA).
_CLIENT_CERTIFICATE_ERRORS = frozenset(
    {
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        "NO_CERTIFICATE_RETURNED",
        "CERTIFICATE_VERIFY_FAILED",
    }
)


def _path_of(request: h11.Request) -> str:
    """The path of a request's target (the query left off)."""
    return request.target.decode("latin-1").partition("?")[0]


def _head_size(request: h11.Request) -> int:
    """The size of a request head as sent (request line and header lines)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(n) + len(v) + 4 for n, v in request.headers) + 2
