"""The webhook server as it ships, over TLS on loopback, with offline caches (no API
server: the handlers' decisions read stores filled by the test). Nothing between the
client and the handlers is mocked: the requests cross a real TLS socket."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from harness.webhook_world import World, webhook_server


@pytest.fixture(scope="module", autouse=True)
def info_logs() -> Iterator[None]:
    """The servers log each closed connection at debug, from their own thread and after
    the answer: at info and above here, so nothing is printed between tests."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    yield
    structlog.configure(**saved)  # the suite's own routing, not structlog's stdout default


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, info_logs: None) -> Iterator[World]:
    """The production limits."""
    with webhook_server(tmp_path_factory.mktemp("webhooks")) as w:
        yield w


@pytest.fixture(scope="module")
def hasty(tmp_path_factory: pytest.TempPathFactory, info_logs: None) -> Iterator[World]:
    """Deadlines of half a second, so expiring them takes no time."""
    with webhook_server(
        tmp_path_factory.mktemp("hasty"),
        handshake_timeout=0.5,
        header_timeout=0.5,
        body_timeout=0.5,
        idle_timeout=0.5,
    ) as w:
        yield w
