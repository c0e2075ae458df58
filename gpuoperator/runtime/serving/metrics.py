"""The HTTP servers' metrics, one set per registry, labelled by server."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge
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
    )
