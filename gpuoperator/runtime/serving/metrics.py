"""The HTTP servers' metrics, one set per registry, labelled by server."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

from gpuoperator.runtime.metrics import per_registry


@dataclass(frozen=True)
class Metrics:
    open: Gauge
    refused: PromCounter
    dropped: PromCounter
    throttled: PromCounter
    queued: Gauge
    waited: PromCounter
    answered: Histogram
    handshakes: Histogram


#: Bounds fine enough for a webhook answered in a fraction of a millisecond.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


@per_registry
def metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
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
        answered=Histogram(
            "gpuoperator_http_request_duration_seconds",
            "From a request's first bytes read to its answer written, by connection "
            "(fresh: the first request after the accept and handshake; kept-alive: a later "
            "one)",
            ["server", "connection"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        handshakes=Histogram(
            "gpuoperator_http_handshake_duration_seconds",
            "TLS handshakes, from the peer's first byte to the connection set up",
            ["server"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
    )
