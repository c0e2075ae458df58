"""A hypothesis sweep of AdmissionReview-shaped input against the real server over TLS:
every answer is a 200 review (allowed, or refused naming a field, never by a handler
crash), or a 400/413 saying what is wrong; never a 5xx, never a traceback. A few hundred
examples here; ``make fuzz`` runs the same categories at ≥ 10,000 requests."""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.review_strategies import CATEGORIES, KeptAlive, check_answer
from harness.waiting import wait_for
from harness.webhook_world import ORDER_PATH, World, body, order

EXAMPLES_PER_CATEGORY = 60


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[KeptAlive]:
    sender = KeptAlive(world.target)
    yield sender
    sender.close()


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_no_admission_review_shaped_input_gets_a_5xx_or_an_unnamed_refusal(
    client: KeptAlive, category: str
) -> None:
    path, bodies = CATEGORIES[category]

    @settings(
        max_examples=EXAMPLES_PER_CATEGORY,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=bodies)
    def sweep(data: bytes) -> None:
        status, answer = client.send(path, data)
        check_answer(status, answer, data)

    sweep()


def test_the_categories_cover_every_webhook() -> None:
    assert {path for path, _ in CATEGORIES.values()} == {
        "/validate-gpuclaim",
        "/mutate-vmi",
        "/mutate-launcher-pod",
    }
    assert isinstance(CATEGORIES["bytes"][1], st.SearchStrategy)


def test_the_sweeps_connection_is_reopened_once_the_server_closed_it_between_requests(
    hasty: World,
) -> None:
    """The server closes a kept-alive connection idle past ``idle_timeout`` (half a second
    here); the next request of the sweep's client goes out on a new connection, as the API
    server's would, instead of failing the example it carries (or every later one)."""
    sender = KeptAlive(hasty.target)
    try:
        data = body(order())
        assert sender.send(ORDER_PATH, data)[0] == 200
        first = sender.connection()
        assert first is not None
        wait_for(
            "the server to close the idle connection",
            lambda: _closed_by_peer(first),
            timeout=10,
            interval=0.05,
        )
        status, answer = sender.send(ORDER_PATH, data)
        assert status == 200, answer
        assert sender.connection() is not first
    finally:
        sender.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (TLS close alert or a bare EOF), not waiting."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except (ssl.SSLError, ConnectionError):
        return True
