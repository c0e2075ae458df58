"""TLS serving certificates are re-read when their files change (cert-manager rotates them
in place): new connections get the new certificate, without a restart."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from gpuoperator.runtime import servercerts, serving
from harness.waiting import wait_for
from localcluster import pki
from localcluster.cluster import free_ports


def served_serial(port: int) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    ca, ca_key = pki.new_ca("test-ca")
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first, first_key = pki.issue(ca, ca_key, "one", server=True, ips=("127.0.0.1",))
    pki.write_pair(first, first_key, crt, key)
    (port,) = free_ports(1)
    server = serving.Server(
        "test",
        f"127.0.0.1:{port}",
        serving.app({"/": lambda _r: serving.text(200, "ok")}),
        tls=(crt, key),
    )
    server.start()
    try:
        assert served_serial(port) == first.serial_number
        second, second_key = pki.issue(ca, ca_key, "two", server=True, ips=("127.0.0.1",))
        pki.write_pair(second, second_key, crt, key)
        wait_for(
            "the rotated certificate",
            lambda: served_serial(port),
            until=lambda s: s == second.serial_number,
            timeout=10,
        )
    finally:
        server.stop()


def test_a_pair_handed_over_in_memory_serves_the_next_connections(tmp_path: Path) -> None:
    ca, ca_key = pki.new_ca("test-ca")
    first, first_key = pki.issue(ca, ca_key, "one", server=True, ips=("127.0.0.1",))
    pki.write_pair(first, first_key, tmp_path / "a.crt", tmp_path / "a.key")
    source = servercerts.MemoryCertificates(
        (tmp_path / "a.crt").read_bytes(), (tmp_path / "a.key").read_bytes()
    )
    server = serving.Server(
        "test", "127.0.0.1:0", serving.app({"/": lambda _r: serving.text(200, "ok")}), tls=source
    )
    server.start()
    try:
        assert served_serial(server.port) == first.serial_number
        second, second_key = pki.issue(ca, ca_key, "two", server=True, ips=("127.0.0.1",))
        pki.write_pair(second, second_key, tmp_path / "b.crt", tmp_path / "b.key")
        source.reload((tmp_path / "b.crt").read_bytes(), (tmp_path / "b.key").read_bytes())
        assert served_serial(server.port) == second.serial_number
        # A pair that does not match is refused, and the previous one goes on serving.
        with pytest.raises(ValueError, match="do not load"):
            source.reload((tmp_path / "a.crt").read_bytes(), (tmp_path / "b.key").read_bytes())
        assert served_serial(server.port) == second.serial_number
    finally:
        server.stop()


def test_a_certificate_file_that_is_not_a_pair_is_a_clear_startup_error(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ValueError, match=r"tls\.crt and .*tls\.key do not load"):
        servercerts.FileCertificates(tmp_path / "tls.crt", tmp_path / "tls.key")


def test_limits_name_the_field_that_is_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"Limits\.header_timeout: 0"):
        serving.Limits(header_timeout=0)
    with pytest.raises(ValueError, match=r"Limits\.max_body"):
        serving.Limits(max_body=10, max_buffered_bytes=5)


def test_a_source_whose_connections_are_all_being_answered_gets_no_more(tmp_path: Path) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow(_request: serving.Request) -> serving.Response:
        entered.release()
        release.wait(10)
        return serving.text(200, "done")

    server = serving.Server(
        "test",
        "127.0.0.1:0",
        serving.app({"/slow": slow}),
        limits=serving.Limits(max_connections_per_source=2, workers=2),
    )
    server.start()
    busy = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in busy:
            assert entered.acquire(timeout=5)
        # Both are being answered: nothing to make room with, so the third is closed.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as third:
            third.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):
                assert third.recv(1) == b""
        release.set()
        for sock in busy:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        release.set()
        for sock in busy:
            sock.close()
        server.stop()


def exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(65536)


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
