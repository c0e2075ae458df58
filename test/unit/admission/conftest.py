"""The webhook server as it ships, over TLS on loopback, with offline caches (no API
server: the handlers' decisions read stores filled by the test). Nothing between the
client and the handlers is mocked: the requests cross a real TLS socket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.webhook_world import World, webhook_server


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The production limits."""
    with webhook_server(tmp_path_factory.mktemp("webhooks")) as w:
        yield w


@pytest.fixture(scope="module")
def hasty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Deadlines of half a second, so expiring them takes no time."""
    with webhook_server(
        tmp_path_factory.mktemp("hasty"),
        handshake_timeout=0.5,
        header_timeout=0.5,
        body_timeout=0.5,
        idle_timeout=0.5,
    ) as w:
        yield w
