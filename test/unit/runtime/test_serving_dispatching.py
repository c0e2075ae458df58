"""Handing requests to handlers: a late answer is a 503, a raising handler a 500, inline
paths are answered on the event loop, a full queue answers 429 to the source with most
waiting."""

from __future__ import annotations

import threading

from gpuoperator.runtime import serving
from harness.http_peers import answer_of, exchange, gated_server, queued
from harness.waiting import wait_for


def test_a_handler_that_does_not_answer_in_time_is_a_503_and_one_that_raises_a_500() -> None:
    release = threading.Event()

    def stuck(_request: serving.Request) -> serving.Response:
        release.wait(10)
        return serving.text(200, "late")

    def broken(_request: serving.Request) -> serving.Response:
        raise RuntimeError("boom")

    routes = {"/stuck": stuck, "/broken": broken}
    server = serving.Server(
        "test",
        "127.0.0.1:0",
        lambda request: routes[request.path](request),  # no app(): the server's own net
        limits=serving.Limits(handler_timeout=0.2),
    )
    server.start()
    try:
        late = exchange(server.port, b"GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
        assert late.startswith(b"HTTP/1.1 503") and b"did not answer in time" in late
        raised = exchange(server.port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raised.startswith(b"HTTP/1.1 500")
    finally:
        release.set()
        server.stop()


def test_inline_paths_are_answered_on_the_event_loop_unless_their_body_is_large() -> None:
    def where(_request: serving.Request) -> serving.Response:
        return serving.text(200, threading.current_thread().name)

    def broken(_request: serving.Request) -> serving.Response:
        raise RuntimeError("boom")

    routes = {"/inline": where, "/pooled": where, "/broken": broken}
    server = serving.Server(
        "test",
        "127.0.0.1:0",
        lambda request: routes[request.path](request),  # no app(): the server's own net
        limits=serving.Limits(small_body=16, max_body=1024),
        inline=("/inline", "/broken"),
    )
    server.start()
    try:

        def thread_of(path: str, body: bytes = b"") -> str:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            answer = exchange(server.port, head.encode() + body)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            return answer.rsplit(b"\r\n\r\n", 1)[1].decode().strip()

        assert thread_of("/inline") == "http-test-loop"
        assert thread_of("/inline", b"x" * 16) == "http-test-loop"
        assert thread_of("/inline", b"x" * 17).startswith("http-test_")  # the handler pool
        assert thread_of("/pooled").startswith("http-test_")
        raised = exchange(server.port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raised.startswith(b"HTTP/1.1 500")
    finally:
        server.stop()


def test_a_full_handler_queue_answers_429_to_the_source_with_most_waiting() -> None:
    with gated_server(serving.Limits(workers=1, max_queued=2, retry_after=3)) as gated:
        first = gated.send("127.0.0.2")  # runs, and holds the worker
        assert gated.gate.entered.acquire(timeout=5)
        queued_ones = [gated.send("127.0.0.2") for _ in range(2)]  # fill the queue
        wait_for("two queued", lambda: queued(gated.registry, "pool"), until=lambda n: n == 2)
        # The flooding source's next request is the one refused: 429 with Retry-After.
        refused = answer_of(gated.send("127.0.0.2"))
        assert refused.startswith(b"HTTP/1.1 429"), refused
        assert b"\r\nRetry-After: 3\r\n" in refused
        assert b"the limit is 2; 2 of them from 127.0.0.2" in refused
        assert b"retry after 3s" in refused
        # Another source, with none waiting, takes the place of the flood's newest.
        other = gated.send("127.0.0.1")
        displaced = answer_of(queued_ones[1])
        assert displaced.startswith(b"HTTP/1.1 429"), displaced
        gated.gate.release.set()
        assert answer_of(other).startswith(b"HTTP/1.1 200")
        assert answer_of(first).startswith(b"HTTP/1.1 200")
        assert answer_of(queued_ones[0]).startswith(b"HTTP/1.1 200")
        throttled = gated.registry.get_sample_value(
            "gpuoperator_http_requests_throttled_total", {"server": "test", "queue": "pool"}
        )
        assert throttled == 2
