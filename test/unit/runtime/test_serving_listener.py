"""The listener: TLS serving certificates are re-read when their files change (cert-manager
rotates them in place) and new connections get the new one, without a restart; connection
limits per source and in all, with their evictions; a source's turns; the client CA."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from gpuoperator.runtime import servercerts, serving
from harness.http_peers import GET_SLOW, Gate, answer_of, gated_server, plain, queued, turn_waits
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


def test_at_the_server_limit_the_source_holding_most_gives_up_even_a_busy_connection() -> None:
    gate = Gate()
    registry = CollectorRegistry()
    server = serving.Server(
        "test",
        "127.0.0.1:0",
        serving.app({"/slow": gate, "/fast": lambda _r: serving.text(200, "fast")}),
        limits=serving.Limits(max_connections=4, max_connections_per_source=4, workers=4),
        registry=registry,
        inline=("/fast",),
    )
    server.start()
    busy: list[socket.socket] = []
    try:
        for _ in range(4):
            busy.append(plain("127.0.0.2", server.port, GET_SLOW))
            assert gate.entered.acquire(timeout=5)
        # Every slot is held by one source's requests being answered: the API server's
        # connection still gets in, in place of the oldest of them.
        with plain("127.0.0.1", server.port, b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n") as mine:
            assert answer_of(mine).startswith(b"HTTP/1.1 200")
        with contextlib.suppress(ConnectionResetError):
            assert busy[0].recv(1) == b""  # closed unanswered
        evicted = registry.get_sample_value(
            "gpuoperator_http_connections_refused_total",
            {"server": "test", "reason": "EvictedHeaviestSource"},
        )
        assert evicted == 1
        # The server is full again (three busy, one waiting). The source that holds the
        # most cannot push the others out: with none of its own waiting, it is refused.
        wait_for("three open", lambda: server.open_connections, until=lambda n: n == 3)
        waiting = socket.create_connection(
            ("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.1", 0)
        )
        busy.append(waiting)
        wait_for("four open", lambda: server.open_connections, until=lambda n: n == 4)
        with (
            plain("127.0.0.2", server.port, GET_SLOW) as fifth,
            contextlib.suppress(ConnectionResetError),
        ):
            assert fifth.recv(1) == b""
        waiting.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer_of(waiting).startswith(b"HTTP/1.1 200")
        gate.release.set()
        for sock in busy[1:4]:
            assert answer_of(sock).startswith(b"HTTP/1.1 200")
    finally:
        gate.release.set()
        for sock in busy:
            sock.close()
        server.stop()


def test_a_source_with_its_turns_taken_waits_and_past_its_heads_deadline_is_a_429() -> None:
    limits = serving.Limits(workers=2, max_active_per_source=1, header_timeout=0.5)
    with gated_server(limits) as gated:
        holder = gated.send("127.0.0.2")  # holds the source's only turn
        assert gated.gate.entered.acquire(timeout=5)
        waiting = gated.send("127.0.0.2")
        wait_for("a wait for a turn", partial(turn_waits, gated.registry), until=(1.0).__eq__)
        # Another source has turns of its own: its request reaches the handler meanwhile.
        other = gated.send("127.0.0.1")
        assert gated.gate.entered.acquire(timeout=5)
        assert queued(gated.registry, "pool") == 0  # the waiting request was never parsed
        # Its turn does not come within its head's deadline: a 429, and the connection ends.
        refused = answer_of(waiting)
        assert refused.startswith(b"HTTP/1.1 429"), refused
        assert b"\r\nRetry-After: 1\r\n" in refused and b"\r\nConnection: close\r\n" in refused
        assert b"of 127.0.0.2 are in progress at once (the limit is 1 per source" in refused
        assert waiting.recv(1) == b""
        gated.gate.release.set()
        assert answer_of(holder).startswith(b"HTTP/1.1 200")
        assert answer_of(other).startswith(b"HTTP/1.1 200")


# -- client certificates -----------------------------------------------------------------------


#: How a TLS 1.3 client sees the server end the session at its end of the handshake: the
#: end of the TLS stream (or a reset, when the request it already sent was left unread).
SESSION_ENDED = (ssl.SSLEOFError, ConnectionResetError)


def ca_file(path: Path, ca: x509.Certificate) -> Path:
    path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return path


def client_exchange(
    port: int,
    server_ca: Path,
    client: tuple[Path, Path] | None,
    tls_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3,
) -> bytes:
    """One request over TLS, presenting ``client`` (a cert and key) or no certificate. The
    end of the TLS session before an answer is an error (``ssl.SSLEOFError``), not b""."""
    ctx = ssl.create_default_context(cafile=str(server_ca))
    ctx.check_hostname = False
    ctx.maximum_version = tls_version
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, suppress_ragged_eofs=False) as tls,
    ):
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return tls.recv(65536)


class ClientWorld:
    """A TLS server that requires client certificates of ``callers``' CA, and the files."""

    def __init__(self, tmp_path: Path, *, in_memory: bool = False) -> None:
        serving_ca, serving_key = pki.new_ca("serving-ca")
        self.server_ca = ca_file(tmp_path / "serving-ca.crt", serving_ca)
        cert, key = pki.issue(serving_ca, serving_key, "webhooks", server=True, ips=("127.0.0.1",))
        pki.write_pair(cert, key, tmp_path / "tls.crt", tmp_path / "tls.key")
        self.callers, self.callers_key = pki.new_ca("callers")
        self.client_ca_file = ca_file(tmp_path / "client-ca.crt", self.callers)
        self.dir = tmp_path
        self.client_ca = servercerts.ClientCA(self.client_ca_file, check_every=0.05)
        source: servercerts.CertificateSource
        if in_memory:
            source = servercerts.MemoryCertificates(
                (tmp_path / "tls.crt").read_bytes(),
                (tmp_path / "tls.key").read_bytes(),
                client_ca=self.client_ca,
            )
        else:
            source = servercerts.FileCertificates(
                tmp_path / "tls.crt", tmp_path / "tls.key", client_ca=self.client_ca
            )
        self.registry = CollectorRegistry()
        self.answered = 0

        def ok(_request: serving.Request) -> serving.Response:
            self.answered += 1
            return serving.text(200, "ok")

        self.server = serving.Server(
            "test", "127.0.0.1:0", serving.app({"/": ok}), tls=source, registry=self.registry
        )

    def client(self, name: str, ca: x509.Certificate, ca_key: Any) -> tuple[Path, Path]:
        cert, key = pki.issue(ca, ca_key, name)
        pair = (self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pki.write_pair(cert, key, *pair)
        return pair

    def refused(self) -> float:
        value = self.registry.get_sample_value(
            "gpuoperator_http_connections_dropped_total",
            {"server": "test", "reason": "ClientCertificateRefused"},
        )
        return value or 0.0


@pytest.mark.parametrize("in_memory", [False, True], ids=["mounted", "self-managed"])
def test_with_a_client_ca_only_callers_with_its_certificates_get_past_the_handshake(
    tmp_path: Path, in_memory: bool
) -> None:
    world = ClientWorld(tmp_path, in_memory=in_memory)
    apiserver = world.client("kube-apiserver", world.callers, world.callers_key)
    stranger_ca, stranger_key = pki.new_ca("strangers")
    stranger = world.client("stranger", stranger_ca, stranger_key)
    world.server.start()
    try:
        port = world.server.port
        assert client_exchange(port, world.server_ca, apiserver).startswith(b"HTTP/1.1 200")
        # No certificate: the server ends the session at its end of the handshake (with
        # TLS 1.3 the client's handshake completes first, so its first read meets the end;
        # with TLS 1.2 its handshake fails); the request is never read.
        with pytest.raises(SESSION_ENDED):
            client_exchange(port, world.server_ca, None)
        with pytest.raises(ssl.SSLError):
            client_exchange(port, world.server_ca, None, ssl.TLSVersion.TLSv1_2)
        # A certificate of another CA: likewise.
        with pytest.raises(SESSION_ENDED):
            client_exchange(port, world.server_ca, stranger)
        wait_for("three refusals counted", world.refused, until=lambda n: n == 3)
        assert world.answered == 1
        # The CA file changes: the next handshakes trust the new CA, and the old one no more.
        ca_file(world.client_ca_file, stranger_ca)
        wait_for(
            "the new client CA",
            lambda: client_exchange(port, world.server_ca, stranger),
            until=lambda answer: answer.startswith(b"HTTP/1.1 200"),
            timeout=10,
        )
        with pytest.raises(SESSION_ENDED):
            client_exchange(port, world.server_ca, apiserver)
        # A file that no longer loads keeps the CA that did.
        version = world.client_ca.version
        world.client_ca_file.write_text("not a certificate")
        wait_for(
            "the broken file read",
            lambda: world.client_ca.current() == version and world.client_ca.failures,
        )
        assert client_exchange(port, world.server_ca, stranger).startswith(b"HTTP/1.1 200")
    finally:
        world.server.stop()


def test_a_client_ca_file_that_holds_no_certificate_is_a_clear_startup_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(ValueError, match=r"ca\.crt holds no PEM certificate"):
        servercerts.ClientCA(tmp_path / "ca.crt")
    with pytest.raises(FileNotFoundError):
        servercerts.ClientCA(tmp_path / "missing.crt")


def test_answers_and_handshakes_are_timed_by_connection(tmp_path: Path) -> None:
    """Each answer written is one observation, labelled fresh for the first request after
    a handshake and kept-alive for a later one on the same connection; each handshake
    one more; and the gate held open makes the timed answer at least that long."""
    ca, ca_key = pki.new_ca("test-ca")
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert, cert_key = pki.issue(ca, ca_key, "one", server=True, ips=("127.0.0.1",))
    pki.write_pair(cert, cert_key, crt, key)
    registry = CollectorRegistry()
    held = threading.Event()

    def slow(_r: serving.Request) -> serving.Response:
        held.wait(0.2)  # never set: the answer takes at least 0.2 s
        return serving.text(200, "slow")

    server = serving.Server(
        "test",
        "127.0.0.1:0",
        serving.app({"/": lambda _r: serving.text(200, "ok"), "/slow": slow}),
        tls=(crt, key),
        registry=registry,
    )
    server.start()
    client = ssl.create_default_context()
    client.load_verify_locations(cadata=ca.public_bytes(serialization.Encoding.PEM).decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            for path in ("/", "/slow", "/"):
                tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert _read_answer(tls).startswith(b"HTTP/1.1 200")

        def count(name: str, labels: dict[str, str]) -> float:
            return registry.get_sample_value(name, labels) or 0.0

        answered = "gpuoperator_http_request_duration_seconds"
        fresh = {"server": "test", "connection": "fresh"}
        kept = {"server": "test", "connection": "kept-alive"}
        wait_for(
            "three answers timed",
            lambda: count(f"{answered}_count", fresh) + count(f"{answered}_count", kept),
            until=lambda n: n == 3,
        )
        assert count(f"{answered}_count", fresh) == 1
        assert count(f"{answered}_count", kept) == 2
        assert count(f"{answered}_sum", kept) >= 0.2
        assert count(f"{answered}_sum", fresh) < 0.2
        handshakes = "gpuoperator_http_handshake_duration_seconds_count"
        assert count(handshakes, {"server": "test"}) == 1
    finally:
        server.stop()


def _read_answer(tls: ssl.SSLSocket) -> bytes:
    """One HTTP answer with a Content-Length body, read whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, "closed before the head"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = tls.recv(65536)
        assert chunk, "closed before the body"
        body += chunk
    return head + b"\r\n\r\n" + body
