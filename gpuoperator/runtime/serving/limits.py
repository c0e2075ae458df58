"""What one server grants its peers: deadlines, sizes and counts (the package docstring
says where each applies)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one server grants its peers (see the package docstring for each phase)."""

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
    #: others wait their turn, unparsed; see :class:`fairness.Turns`).
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
