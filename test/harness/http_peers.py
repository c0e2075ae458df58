"""Plain-HTTP peers of ``runtime.serving`` test servers on loopback: raw requests sent from
any 127.0.0.0/8 source, whole answers read, a handler that holds requests until released,
and the servers' queue and turn metrics."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gpuoperator.runtime import serving


def exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(65536)


def plain(source: str, port: int, request: bytes) -> socket.socket:
    """A plain-HTTP connection from ``source`` that has sent ``request``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.sendall(request)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """One whole answer (head and its Content-Length of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def queued(registry: CollectorRegistry, queue: str) -> float:
    value = registry.get_sample_value(
        "gpuoperator_http_queued_requests", {"server": "test", "queue": queue}
    )
    return value or 0.0


GET_SLOW = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"


class Gate:
    """A handler that records who it answers and, until released, holds each request."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.order: list[str] = []

    def __call__(self, request: serving.Request) -> serving.Response:
        self.order.append(request.headers.get("x-who", "?"))
        self.entered.release()
        self.release.wait(10)
        return serving.text(200, "done")


def turn_waits(registry: CollectorRegistry, phase: str = "request") -> float:
    value = registry.get_sample_value(
        "gpuoperator_http_source_turn_waits_total", {"server": "test", "phase": phase}
    )
    return value or 0.0


@dataclass
class Gated:
    """A server whose path ``/slow`` is ``gate``, and the sockets a test opened to it."""

    server: serving.Server
    gate: Gate
    registry: CollectorRegistry
    socks: list[socket.socket] = field(default_factory=list)

    def send(self, source: str, request: bytes = GET_SLOW) -> socket.socket:
        """A plain-HTTP connection from ``source`` that has sent ``request``."""
        sock = plain(source, self.server.port, request)
        self.socks.append(sock)
        return sock


@contextmanager
def gated_server(limits: serving.Limits) -> Iterator[Gated]:
    """A plain-HTTP server on loopback named ``test``, whose path ``/slow`` is a
    :class:`Gate`, counting into a registry of its own; on leaving, the gate is released,
    the sockets opened through ``send`` are closed and the server stopped."""
    gate = Gate()
    registry = CollectorRegistry()
    server = serving.Server(
        "test", "127.0.0.1:0", serving.app({"/slow": gate}), limits=limits, registry=registry
    )
    server.start()
    gated = Gated(server, gate, registry)
    try:
        yield gated
    finally:
        gate.release.set()
        for sock in gated.socks:
            sock.close()
        server.stop()
