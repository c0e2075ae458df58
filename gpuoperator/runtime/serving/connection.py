"""One connection's HTTP/1.1 exchanges (h11 parses): each request's head and body read
within their deadlines and limits, answered, the answer written, and the connection kept
alive for the next one; the helpers that end a connection cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import h11

from gpuoperator.model import echo
from gpuoperator.runtime.serving.dispatching import Dispatcher
from gpuoperator.runtime.serving.limits import Limits
from gpuoperator.runtime.serving.routing import Response, text

#: Takes one of a source's turns: ``(source, phase, deadline)``.
TakeTurn = Callable[[str, str, float | None], AbstractAsyncContextManager[None]]


@dataclass(eq=False)
class Slot:
    """One open connection, as the limits see it."""

    source: str
    since: float = field(default_factory=time.monotonic)
    #: A request of it is being answered (handler or write): never evicted then.
    busy: bool = False
    evicted: bool = False
    gone: bool = False
    task: asyncio.Task[None] | None = None


@dataclass
class Held:
    """The bytes of one body counted against the memory budget."""

    taken: int = 0


class DropError(Exception):
    """End the connection; ``answer`` is sent first when the peer may still read it."""

    def __init__(self, reason: str, answer: Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answer = answer


#: The reason phrases of the statuses the server answers.
REASONS = {
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


class Connections:
    """The HTTP/1.1 exchanges of every connection of one server, and the memory budget
    their bodies share (``max_buffered_bytes``)."""

    def __init__(
        self,
        limits: Limits,
        body_limits: Mapping[str, int],
        dispatcher: Dispatcher,
        turns: TakeTurn,
        answered: Callable[[bool, float], None] = lambda _fresh, _seconds: None,
    ) -> None:
        self.limits = limits
        self.body_limits = body_limits
        self._dispatcher = dispatcher
        self._turns = turns
        #: Called with (first request of its connection, seconds) once an answer is written.
        self._answered = answered
        self._buffered = 0
        self._budget = asyncio.Condition()

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Slot
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
                    raise DropError("IdleTimeout" if served else "HeaderTimeout") from None
                if not data:
                    return
                conn.receive_data(data)
            first_bytes = loop.time()
            if served:
                start = first_bytes
            head_deadline = start + limits.header_timeout
            async with self._turns(state.source, "request", head_deadline):
                if not await self._exchange(
                    conn, reader, writer, state, head_deadline, served, first_bytes
                ):
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
        state: Slot,
        head_deadline: float,
        served: int,
        first_bytes: float,
    ) -> bool:
        """One request read, answered and its answer written; False when the connection
        ends with it (or before it). ``first_bytes``: when its first bytes were read."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        request = await self._read_head(conn, reader, head_deadline, seen_bytes=True)
        if request is None:
            return False
        limit = self.body_limits.get(path_of(request), limits.max_body)
        declared = self._declared_length(request, limit)
        # A body's bytes beyond ``small_body`` count against the memory budget until its
        # answer is ready.
        held = Held()
        try:
            body = await self._read_body(
                conn, reader, loop.time() + limits.body_timeout, held, declared, limit
            )
            state.busy = True
            response = await self._dispatcher.answer(request, body, state.source, loop)
            del body
        finally:
            await self._release(held.taken)
        keep = served + 1 < limits.max_requests and conn.our_state is h11.SEND_RESPONSE
        await self._send(conn, writer, response, close=not keep)
        self._answered(served == 0, loop.time() - first_bytes)
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
                        if head_size(event) > self.limits.max_header_bytes:
                            raise DropError("BadRequest", text(431, self._too_large_head()))
                        return event
                    if isinstance(event, h11.ConnectionClosed):
                        return None
                    raise DropError("BadRequest", text(400, f"unexpected {type(event).__name__}"))
        except TimeoutError:
            answer = text(408, "the request head did not arrive in time") if received else None
            raise DropError("HeaderTimeout", answer) from None
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint if exc.error_status_hint in REASONS else 400
            if status == 431:
                message = self._too_large_head()
            else:
                message = f"malformed HTTP request: {echo.clip(str(exc), 200)}"
            raise DropError("BadRequest", text(status, message)) from None

    def _declared_length(self, request: h11.Request, limit: int) -> int | None:
        """The body's ``Content-Length`` (``None`` when chunked); 413 beyond ``limit``,
        before reading any of it."""
        for name, value in request.headers:
            if name == b"content-length":
                declared = int(value)  # h11 has checked it is a non-negative integer
                if declared > limit:
                    raise DropError(
                        "BodyTooLarge",
                        text(413, self._too_large_body(request, f"{declared} bytes", limit)),
                    )
                return declared
        return None

    def _too_large_body(self, request: h11.Request, size: str, limit: int) -> str:
        method = request.method.decode("latin-1")
        path = echo.clip(path_of(request), 100)
        return f"a body of {size} exceeds the limit of {limit} bytes for {method} {path}"

    def _too_large_head(self) -> str:
        return f"the request head exceeds {self.limits.max_header_bytes} bytes"

    async def _read_body(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        body_deadline: float,
        held: Held,
        declared: int | None,
        limit: int,
    ) -> bytes:
        limits = self.limits
        chunks: list[bytes] = []
        size = 0
        waiting = False
        try:
            if conn.they_are_waiting_for_100_continue:
                raise DropError("BadRequest", text(417, "Expect: 100-continue is not supported"))
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
                            raise DropError(
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
                        raise DropError("PeerGone")
                    raise DropError("BadRequest", text(400, f"unexpected {type(event).__name__}"))
        except TimeoutError:
            if waiting:
                raise DropError(
                    "BufferFull",
                    text(503, "the server is holding too many large bodies; retry shortly"),
                ) from None
            raise DropError(
                "BodyTimeout",
                text(408, f"the request body did not arrive within {limits.body_timeout:g}s"),
            ) from None
        except h11.RemoteProtocolError as exc:
            raise DropError(
                "BadRequest", text(400, f"malformed HTTP body: {echo.clip(str(exc), 200)}")
            ) from None

    async def _take(self, size: int, held: Held) -> None:
        """Count ``size`` bytes against ``max_buffered_bytes`` (into ``held``), waiting while
        other bodies hold the budget (the peer's bytes wait in the kernel meanwhile); the
        caller's deadline bounds the wait."""
        limit = self.limits.max_buffered_bytes
        async with self._budget:
            await self._budget.wait_for(lambda: self._buffered + size <= limit)
            self._buffered += size
            held.taken += size

    async def _release(self, size: int) -> None:
        if not size:
            return
        async with self._budget:
            self._buffered -= size
            self._budget.notify_all()

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
                reason=REASONS.get(response.status, "Status"),
            )
        )
        data = (data or b"") + (conn.send(h11.Data(data=response.body)) or b"")
        data += conn.send(h11.EndOfMessage()) or b""
        writer.write(data)
        if not writer.transport.get_write_buffer_size():
            return  # all of it handed to the kernel: nothing to wait for
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        except TimeoutError:
            raise DropError("WriteTimeout") from None


async def linger(reader: asyncio.StreamReader) -> None:
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


async def close(writer: asyncio.StreamWriter) -> None:
    """Close gracefully (what was written is flushed, TLS says goodbye) for at most a
    second, then abort: a peer that does not read cannot hold the"""
    writer.close()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    writer.transport.abort()


def raw_answer(response: Response) -> bytes:
    """An answer outside h11's state machine (the request could not be parsed)."""
    head = (
        f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Status')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        + "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + response.body


def path_of(request: h11.Request) -> str:
    """The path of a request's target (the query left off)."""
    return request.target.decode("latin-1").partition("?")[0]


def head_size(request: h11.Request) -> int:
    """The size of a request head as sent (request line and header lines)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(n) + len(v) + 4 for n, v in request.headers) + 2
