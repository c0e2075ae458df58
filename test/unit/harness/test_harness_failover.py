"""The chaos suite's webhook failover (``harness.failover``): a request goes to a ready
replica; one that dies mid-request (no response) is replaced by another; any response —
a refusal included — is passed back unchanged, never retried."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from harness.failover import WebhookFailover
from harness.waiting import wait_for
from localcluster import pki


class _Replica:
    """A stand-in replica: a TLS webhook port and a plain health port."""

    def __init__(self, certs: Path, *, answer: bytes | None, ready: bool = True) -> None:
        self.calls = 0
        replica = self

        class Webhook(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                replica.calls += 1
                if answer is None:  # dies mid-request: the connection closes unanswered
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return

        class Health(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if ready else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
        self.webhook = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
        self.webhook.socket = ctx.wrap_socket(self.webhook.socket, server_side=True)
        self.health = ThreadingHTTPServer(("127.0.0.1", 0), Health)
        for server in (self.webhook, self.health):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.ports = (self.webhook.server_address[1], self.health.server_address[1])

    def close(self) -> None:
        for server in (self.webhook, self.health):
            server.shutdown()
            server.server_close()


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path]:
    ca_cert, ca_key = pki.new_ca("failover-test-ca")
    directory = pki.write_loopback_serving_pair(ca_cert, ca_key, tmp_path / "certs")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return directory, ca_file


@pytest.fixture
def replicas(certs: tuple[Path, Path]) -> Iterator[list[_Replica]]:
    made: list[_Replica] = []
    yield made
    for r in made:
        r.close()


def _proxy(certs: tuple[Path, Path], replicas: list[_Replica]) -> WebhookFailover:
    proxy = WebhookFailover(*certs)
    for i, r in enumerate(replicas):
        proxy.add(f"r{i}", *r.ports)
    return proxy


REFUSAL = json.dumps({"response": {"allowed": False, "status": {"message": "no"}}}).encode()
ALLOWED = json.dumps({"response": {"allowed": True}}).encode()


def test_a_replica_that_dies_mid_request_is_replaced_by_a_ready_one(
    certs: tuple[Path, Path], replicas: list[_Replica]
) -> None:
    replicas += [_Replica(certs[0], answer=None), _Replica(certs[0], answer=ALLOWED)]
    proxy = _proxy(certs, replicas)
    try:
        wait_for("both ready", proxy.ready_backends, until=lambda r: len(r) == 2)
        answers = {proxy.forward("/orders", b"{}")[2] for _ in range(4)}
        assert answers == {ALLOWED}
        assert proxy.counters.failovers >= 1
        assert proxy.counters.unanswered == 0
    finally:
        proxy.close()


def test_a_refusal_is_passed_back_and_never_retried(
    certs: tuple[Path, Path], replicas: list[_Replica]
) -> None:
    replicas += [_Replica(certs[0], answer=REFUSAL), _Replica(certs[0], answer=REFUSAL)]
    proxy = _proxy(certs, replicas)
    try:
        wait_for("both ready", proxy.ready_backends, until=lambda r: len(r) == 2)
        status, _, body = proxy.forward("/orders", b"{}")
        assert (status, body) == (200, REFUSAL)
        assert sum(r.calls for r in replicas) == 1
    finally:
        proxy.close()


def test_a_replica_that_is_not_ready_gets_no_request(
    certs: tuple[Path, Path], replicas: list[_Replica]
) -> None:
    replicas += [
        _Replica(certs[0], answer=REFUSAL, ready=False),
        _Replica(certs[0], answer=ALLOWED),
    ]
    proxy = _proxy(certs, replicas)
    try:
        wait_for("one ready", proxy.ready_backends, until=lambda r: r == ["r1"])
        assert {proxy.forward("/orders", b"{}")[2] for _ in range(4)} == {ALLOWED}
        assert replicas[0].calls == 0
    finally:
        proxy.close()
