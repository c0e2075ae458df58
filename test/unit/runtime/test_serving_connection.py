"""One connection's exchanges: a body beyond its path's limit is a 413 naming it, before
its bytes are read when it is announced."""

from __future__ import annotations

import pytest

from gpuoperator.runtime import serving
from harness.http_peers import exchange


def test_a_body_beyond_its_paths_limit_is_a_413_naming_the_limit() -> None:
    def echo_size(request: serving.Request) -> serving.Response:
        return serving.text(200, str(len(request.body)))

    server = serving.Server(
        "test",
        "127.0.0.1:0",
        serving.app({"/small": echo_size, "/large": echo_size}),
        limits=serving.Limits(max_body=4096, small_body=1024),
        body_limits={"/small": 100},
    )
    server.start()
    try:

        def post(path: str, size: int, *, chunked: bool = False) -> bytes:
            body = b"x" * size
            if chunked:
                head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                data = f"{size:x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
            else:
                head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
                data = body
            return exchange(server.port, head.encode() + data)

        assert post("/small", 100).startswith(b"HTTP/1.1 200")
        refused = post("/small", 101)
        assert refused.startswith(b"HTTP/1.1 413"), refused
        assert b"a body of 101 bytes exceeds the limit of 100 bytes for POST /small" in refused
        chunked = post("/small", 101, chunked=True)
        assert chunked.startswith(b"HTTP/1.1 413") and b"limit of 100 bytes" in chunked
        # Other paths keep the server's limit.
        assert post("/large", 4096).startswith(b"HTTP/1.1 200")
        assert post("/large", 4097).startswith(b"HTTP/1.1 413")
    finally:
        server.stop()
    with pytest.raises(ValueError, match=r"body_limits\['/x'\]: 5000 is not between 1 and"):
        serving.Server(
            "test",
            "127.0.0.1:0",
            serving.app({}),
            limits=serving.Limits(max_body=4096),
            body_limits={"/x": 5000},
        )
