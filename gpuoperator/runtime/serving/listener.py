"""The listener: one server's socket and event loop, the accept with its connection limits
(per source and in all, with the evictions that make room), the TLS handshake with its
client-CA check, and each source's turns; every connection it accepts is served by
:class:`connection.Connections`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path

import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from gpuoperator.model import echo
from gpuoperator.runtime import servercerts
from gpuoperator.runtime.serving import connection, fairness, metrics
from gpuoperator.runtime.serving.dispatching import Dispatcher
from gpuoperator.runtime.serving.limits import Limits, parse_address
from gpuoperator.runtime.serving.routing import App, Response

log = structlog.get_logger("gpuoperator.runtime.serving")


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
        self._meters = metrics.metrics(registry)
        self._log = log.bind(server=name)
        self._dispatcher = Dispatcher(name, handler, self.limits, inline, self._meters, self._log)
        self._connections = connection.Connections(
            self.limits, self.body_limits, self._dispatcher, self.turn, self._observe_answer
        )
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._open = 0
        #: Open connections per source address, oldest first.
        self._by_source: dict[str, dict[int, connection.Slot]] = {}
        self._limited: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Sources that gave up connections at the server's limit (logged once).
        self._crowding: set[str] = set()
        #: Sources logged for a refused client certificate in the last minute.
        self._uncertified = _OncePerMinute()
        #: The turns of each source with connections (see :class:`fairness.Turns`).
        self._turns: dict[str, fairness.Turns] = {}
        #: Sources logged for waiting for their turns in the last minute.
        self._busy = _OncePerMinute()

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
        accepting = loop.create_task(self._accept(loop))
        dispatching = self._dispatcher.run(loop)
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
        self._dispatcher.shutdown()

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
            state = connection.Slot(source)
            self._open += 1
            self._by_source.setdefault(source, {})[id(state)] = state
            self._meters.open.labels(self.name).inc()
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
        self._meters.refused.labels(self.name, "EvictedHeaviestSource").inc()
        return True

    def _evict(self, source: str | None) -> bool:
        """Make room by closing the oldest connection (of ``source``, or of any source) that
        is not being answered: one waiting for its handshake, its next request, or the rest
        of one. False when every such connection is busy."""
        pools = (
            [self._by_source.get(source, {})] if source is not None else self._by_source.values()
        )
        oldest: connection.Slot | None = None
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
        self._meters.refused.labels(
            self.name, "EvictedForSource" if source is not None else "Evicted"
        ).inc()
        return True

    def _forget(self, state: connection.Slot) -> None:
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
        self._meters.open.labels(self.name).dec()
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
        self._meters.refused.labels(self.name, reason).inc()
        self._log.debug("connection refused", peer=source, reason=reason)
        conn.close()

    # ---- one connection ---------------------------------------------------------------
    async def _connection(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, state: connection.Slot
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
            await self._connections.serve(reader, writer, state)
        except connection.DropError as drop:
            reason = drop.reason
            self._meters.dropped.labels(self.name, reason).inc()
            if drop.answer is not None and writer is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(limits.write_timeout):
                        writer.write(connection.raw_answer(drop.answer))
                        await writer.drain()
                    await connection.linger(reader)
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
                    await connection.close(writer)
            finally:
                self._log.debug("connection closed", peer=source, reason=reason)
                self._forget(state)

    def _observe_answer(self, fresh: bool, seconds: float) -> None:
        self._meters.answered.labels(self.name, "fresh" if fresh else "kept-alive").observe(seconds)

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
                async with self.turn(peer, "handshake"):
                    began = loop.time()
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol,
                        conn,
                        ssl=self.certificates.context(),
                        ssl_handshake_timeout=max(0.001, deadline - loop.time()),
                    )
                    self._meters.handshakes.labels(self.name).observe(loop.time() - began)
        except TimeoutError:
            raise connection.DropError("HandshakeTimeout") from None
        except ssl.SSLError as exc:
            if getattr(self.certificates, "client_ca", None) is not None and (
                exc.reason in _CLIENT_CERTIFICATE_ERRORS
            ):
                self._note_uncertified(peer, exc.reason or "")
                raise connection.DropError("ClientCertificateRefused") from exc
            raise connection.DropError("HandshakeFailed") from exc
        except OSError as exc:
            raise connection.DropError("HandshakeFailed") from exc
        return transport

    @contextlib.asynccontextmanager
    async def turn(
        self, source: str, phase: str, deadline: float | None = None
    ) -> AsyncIterator[None]:
        """One of ``source``'s turns for ``phase`` (``handshake`` or ``request``), waited for
        until ``deadline`` (the caller's own deadline bounds it when None). A request whose
        turn does not come by then is answered 429 and its connection closed: its source's
        own requests hold every turn, and this one was not read."""
        turns = self._turns.get(source)
        if turns is None:
            turns = self._turns[source] = fairness.Turns(self.limits.max_active_per_source)
        if turns.free():
            await turns.acquire()
        else:
            self._meters.waited.labels(self.name, phase).inc()
            self._note_busy(source, turns)
            try:
                async with asyncio.timeout_at(deadline):
                    await turns.acquire()
            except TimeoutError:
                if deadline is None:
                    raise
                raise connection.DropError("SourceBusy", self._source_busy(source)) from None
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

    def _note_busy(self, source: str, turns: fairness.Turns) -> None:
        """One info line per source and minute whose handshakes or requests wait for its
        turns (the metric counts each)."""
        if not self._busy.due(source):
            return
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
        if not self._uncertified.due(peer):
            return
        self._log.info(
            "connection refused at the handshake: no client certificate signed by the client CA",
            peer=peer,
            error=why,
            reason="ClientCertificateRefused",
        )


class _OncePerMinute:
    """The sources something was logged for in the last minute, so that it is logged once
    per source and minute (about 1,024 sources remembered at most, the older forgotten)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def due(self, source: str) -> bool:
        """True (and remembered) when ``source`` was not logged in the last minute."""
        now = time.monotonic()
        if now - self._last.get(source, -60.0) < 60.0:
            return False
        if len(self._last) > 1024:
            self._last = {p: t for p, t in self._last.items() if now - t < 60.0}
        self._last[source] = now
        return True


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


#: OpenSSL's reasons for a handshake that failed on the client's certificate (none sent,
#: or not signed by the client CA).
_CLIENT_CERTIFICATE_ERRORS = frozenset(
    {
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        "NO_CERTIFICATE_RETURNED",
        "CERTIFICATE_VERIFY_FAILED",
    }
)
