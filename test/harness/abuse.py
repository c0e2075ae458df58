"""Clients for probing a TLS server on loopback: good requests that are timed, and the
misbehaving peers a webhook port must withstand (idle sockets that never start TLS,
slowloris connections trickling header bytes, bodies sent half-way and then held).

Every loop here is bounded in count and time, and every address is a loopback one.
"""

from __future__ import annotations

import http.client
import math
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """A TLS server on loopback and the CA its certificate is signed by."""

    port: int
    ca: Path
    host: str = "127.0.0.1"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False  # the loopback certificate names 127.0.0.1, not the host
        return ctx


def connect(target: Target, *, source: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    """A plain TCP connection from ``source`` (any 127.0.0.0/8 address): nothing sent."""
    return socket.create_connection(
        (target.host, target.port), timeout=timeout, source_address=(source, 0)
    )


def tls_connect(
    target: Target, *, source: str = "127.0.0.1", timeout: float = 5.0
) -> ssl.SSLSocket:
    raw = connect(target, source=source, timeout=timeout)
    try:
        return target.context().wrap_socket(raw)
    except BaseException:
        raw.close()
        raise


@dataclass
class Answer:
    status: int
    body: bytes
    seconds: float
    headers: dict[str, str] = field(default_factory=dict)


def post(
    target: Target,
    path: str,
    body: bytes,
    *,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    source: str = "127.0.0.1",
) -> Answer:
    """One request on a fresh TLS connection from ``source`` (handshake included in the
    time)."""
    start = time.perf_counter()
    conn = http.client.HTTPSConnection(
        target.host,
        target.port,
        timeout=timeout,
        context=target.context(),
        source_address=(source, 0),
    )
    try:
        return _exchange(conn, method, path, body, headers or {}, start)
    finally:
        conn.close()


def _exchange(
    conn: http.client.HTTPSConnection,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    start: float,
) -> Answer:
    """One request on ``conn`` and its whole answer, timed from ``start``."""
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    data = resp.read()
    return Answer(
        resp.status,
        data,
        time.perf_counter() - start,
        {k.lower(): v for k, v in resp.getheaders()},
    )


class KeptAlive:
    """Requests over one TLS connection kept alive between them, as the API server's webhook
    client keeps its connections (a new one only when the server closed the last): the time
    of each is the exchange alone, the handshake counted only when one was needed."""

    def __init__(self, target: Target, *, timeout: float = 10.0) -> None:
        self._target, self._timeout = target, timeout
        self._conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, body: bytes) -> Answer:
        start = time.perf_counter()
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(
                self._target.host,
                self._target.port,
                timeout=self._timeout,
                context=self._target.context(),
            )
        try:
            answer = _exchange(self._conn, "POST", path, body, {}, start)
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if self._conn.sock is None:  # the answer closed it (http.client): a new one next time
            self.close()
        return answer

    def socket(self) -> socket.socket | None:
        """The socket of the connection open now, if one is."""
        return None if self._conn is None else self._conn.sock

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def raw_exchange(target: Target, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` as it is over TLS and read one answer: until its ``Content-Length``
    is complete, the server closes, or ``timeout``."""
    with tls_connect(target, timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not _complete(received):
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ssl.SSLError, ConnectionError):
                break
            if not chunk:
                break
            received += chunk
        return received


def _complete(received: bytes) -> bool:
    head, sep, rest = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(rest) >= int(value.strip())
    return False


def status_of(raw: bytes) -> int:
    """The status code of a raw HTTP/1.1 answer (0 when there is none)."""
    first = raw.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) >= 2 and first[1].isdigit() else 0


class Abusers:
    """Misbehaving connections held open until :meth:`close`.

    ``idle``: TCP connections that never start the TLS handshake; ``slowloris``: TLS
    connections that started a request and send one more header byte every ``interval``
    seconds; ``half_bodies``: TLS connections that sent headers announcing a body and only
    part of it. Connections are spread over the ``sources`` addresses round-robin.
    A background thread trickles the slowloris bytes; a connection the server closes is
    counted in ``closed_by_server`` and not reopened.
    """

    def __init__(
        self,
        target: Target,
        *,
        idle: int,
        slowloris: int,
        half_bodies: int,
        path: str,
        sources: Sequence[str] = ("127.0.0.1",),
        interval: float = 0.5,
        connect_timeout: float = 5.0,
    ) -> None:
        self._timeout = connect_timeout
        self.target, self.path, self.interval = target, path, interval
        self._sources = list(sources)
        self._n = 0
        self.idle: list[socket.socket] = []
        self.slow: list[socket.socket] = []
        self.half: list[socket.socket] = []
        self.setup_failures = 0
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, name="slowloris", daemon=True)
        for _ in range(slowloris):
            self._open(self.slow, f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
        for _ in range(half_bodies):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 100000\r\n\r\n"
            ).encode()
            self._open(self.half, head + b'{"apiVersion": "admission.k8s.io/v1", ')
        for _ in range(idle):
            try:
                self.idle.append(connect(target, source=self._source(), timeout=self._timeout))
            except OSError:
                self.setup_failures += 1
        self._thread.start()

    def _source(self) -> str:
        self._n += 1
        return self._sources[self._n % len(self._sources)]

    def _open(self, into: list[socket.socket], first: bytes) -> None:
        try:
            sock = tls_connect(self.target, source=self._source(), timeout=self._timeout)
            sock.sendall(first)
            into.append(sock)
        except OSError:
            self.setup_failures += 1

    def _trickle(self) -> None:
        while not self._stop.wait(self.interval):
            for sock in list(self.slow):
                try:
                    sock.sendall(b"x")
                except OSError:
                    self.slow.remove(sock)
                    sock.close()
                    self.closed_by_server += 1

    @property
    def held(self) -> int:
        return len(self.idle) + len(self.slow) + len(self.half)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.idle + self.slow + self.half:
            sock.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest-rank method."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def rss_kib(pid: int) -> int:
    """The resident set size of process ``pid`` (Linux), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Flood:
    """``connections`` kept-alive TLS connections (spread over ``sources`` round-robin)
    that each post ``body`` to ``path`` again as soon as the previous answer arrives, from
    one background thread, until :meth:`close`. Answers are counted by status in
    ``statuses``; a connection the server closes is counted in ``closed`` and opened again
    (a flood does not give up)."""

    def __init__(
        self,
        target: Target,
        *,
        connections: int,
        path: str,
        body: bytes,
        sources: Sequence[str] = ("127.0.0.2",),
    ) -> None:
        self.target = target
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.statuses: dict[int, int] = {}
        self.closed = 0
        self.setup_failures = 0
        self._sources = list(sources)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: dict[ssl.SSLSocket, tuple[str, bytes]] = {}
        for n in range(connections):
            self._open(self._sources[n % len(self._sources)])
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._thread.start()

    def _open(self, source: str) -> ssl.SSLSocket | None:
        try:
            sock = tls_connect(self.target, source=source, timeout=5.0)
            sock.sendall(self.request)
        except OSError:
            self.setup_failures += 1
            return None
        self._socks[sock] = (source, b"")
        return sock

    def answers(self) -> int:
        with self._lock:
            return sum(self.statuses.values())

    def _receive(self, sock: ssl.SSLSocket) -> bytes:
        """What arrived on ``sock`` (b"" when it is closed), decrypted records included."""
        try:
            data = sock.recv(65536)
            while data and sock.pending():
                data += sock.recv(sock.pending())
        except OSError:
            return b""
        return data

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for opened in self._socks:
            selector.register(opened, selectors.EVENT_READ, opened)
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                sock: ssl.SSLSocket = key.data
                source, pending = self._socks[sock]
                chunk = self._receive(sock)
                if not chunk:
                    selector.unregister(sock)
                    del self._socks[sock]
                    sock.close()
                    self.closed += 1
                    again = None if self._stop.is_set() else self._open(source)
                    if again is not None:
                        selector.register(again, selectors.EVENT_READ, again)
                    continue
                pending += chunk
                while _complete(pending):
                    head, _, rest = pending.partition(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")[1:]
                        if line.lower().startswith(b"content-length:")
                    )
                    with self._lock:
                        status = status_of(head)
                        self.statuses[status] = self.statuses.get(status, 0) + 1
                    pending = rest[length:]
                    try:
                        sock.sendall(self.request)
                    except OSError:
                        break
                self._socks[sock] = (source, pending)
        selector.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in list(self._socks):
            sock.close()
