"""One webhook address for several operator replicas, with failover: what a Service in front
of the replicas' ready endpoints does for the API server, plus the retry a dying endpoint
needs.

The webhook configurations are registered once, with ``clientConfig.url`` naming this proxy
(``https://127.0.0.1:<port>``); the proxy terminates TLS with the serving certificate the
replicas serve (so the ``caBundle`` the operator injects verifies it) and forwards each
AdmissionReview POST to a replica's webhook port over TLS, verified with that CA. A replica
receives requests only while its ``/readyz`` says ready (as a Service's endpoints are the
ready pods), probed every ``PROBE_SECONDS``.

Honesty rules, so that "fail closed" still means what it says:

* A request is re-sent to another ready replica only when the first one gave **no HTTP
  response at all** (connection refused, reset, closed mid-request: the replica died). A
  response — allowed or refused, any status — is passed back to the API server unchanged,
  so a refusal is always a replica's decision and never the proxy's.
* Re-sending is safe because every gpuoperator webhook is idempotent for one request (the
  order and pod webhooks have no side effects; the VMI webhook's one write records the same
  attachment again).
* When no replica answers within ``DEADLINE`` (shorter than the webhooks' 10 s timeout) the
  proxy returns 503 and the API server fails the request closed, as it would with no ready
  endpoint behind a Service.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

PROBE_SECONDS: Final = 0.2
DEADLINE: Final = 8.0
FORWARD_TIMEOUT: Final = DEADLINE


@dataclass
class Backend:
    """One replica: its webhook port (TLS) and its plain-HTTP health port."""

    name: str
    webhook_port: int
    health_port: int
    ready: bool = False


@dataclass
class Counters:
    forwarded: int = 0
    #: Requests re-sent to another replica after one gave no response.
    failovers: int = 0
    #: Requests answered 503 by the proxy because no replica answered in time.
    unanswered: int = 0
    by_backend: dict[str, int] = field(default_factory=dict)


class WebhookFailover:
    """A TLS reverse proxy on loopback over the ready replicas; ``close()`` stops it."""

    def __init__(self, cert_dir: Path, ca_file: Path) -> None:
        self._backends: list[Backend] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._next = 0
        self.counters = Counters()
        self._upstream = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks the host
        self._serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.load_certificates(cert_dir, ca_file)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, ctype, answer = proxy.forward(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = self._serving.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, name="failover", daemon=True).start()
        threading.Thread(target=self._probe, name="failover-probe", daemon=True).start()

    def load_certificates(self, cert_dir: Path, ca_file: Path) -> None:
        """(Re)load the serving pair (``tls.crt``, ``tls.key``) presented to the API server
        and the CA the replicas' certificates are verified with; new connections use them."""
        self._serving.load_cert_chain(str(cert_dir / "tls.crt"), str(cert_dir / "tls.key"))
        self._upstream.load_verify_locations(cafile=str(ca_file))

    # ---- endpoints ---------------------------------------------------------------------
    def add(self, name: str, webhook_port: int, health_port: int) -> None:
        with self._lock:
            self._backends.append(Backend(name, webhook_port, health_port))

    def remove(self, name: str) -> None:
        with self._lock:
            self._backends = [b for b in self._backends if b.name != name]

    def ready_backends(self) -> list[str]:
        with self._lock:
            return [b.name for b in self._backends if b.ready]

    def _probe(self) -> None:
        while not self._closed.wait(PROBE_SECONDS):
            with self._lock:
                backends = list(self._backends)
            for b in backends:
                b.ready = _ready(b.health_port)

    # ---- forwarding --------------------------------------------------------------------
    def forward(self, path: str, body: bytes) -> tuple[int, str, bytes]:
        deadline = time.monotonic() + DEADLINE
        failed = 0
        while time.monotonic() < deadline:
            for backend in self._rotation():
                answer = self._send(backend, path, body)
                if answer is not None:
                    with self._lock:
                        self.counters.forwarded += 1
                        self.counters.failovers += 1 if failed else 0
                        by = self.counters.by_backend
                        by[backend.name] = by.get(backend.name, 0) + 1
                    return answer
                failed += 1
                backend.ready = False  # until the next probe says otherwise
            time.sleep(PROBE_SECONDS / 2)  # no ready replica: wait for the probe
        with self._lock:
            self.counters.unanswered += 1
        return 503, "text/plain", b"no operator replica answered\n"

    def _rotation(self) -> list[Backend]:
        """The ready replicas, starting with the next in turn (requests alternate)."""
        with self._lock:
            ready = [b for b in self._backends if b.ready]
            self._next += 1
            start = self._next % len(ready) if ready else 0
        return ready[start:] + ready[:start]

    def _send(self, backend: Backend, path: str, body: bytes) -> tuple[int, str, bytes] | None:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", backend.webhook_port, context=self._upstream, timeout=FORWARD_TIMEOUT
        )
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()


def _ready(health_port: int) -> bool:
    url = f"http://127.0.0.1:{health_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
