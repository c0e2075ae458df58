"""HTTP(S) servers: health probes, metrics, and (later) webhooks, on cheroot.

cheroot is a maintained, threaded WSGI server with TLS; handlers here are plain functions.
Certificates are read from files and re-read when the files change (cert-manager rotates
them in place), checked at most once a second on new connections; or handed over in memory
with ``Server.reload`` (the operator's self-managed certificates).
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cheroot import wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = structlog.get_logger(__name__)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def app(routes: dict[str, Callable[[Environ], Response]]) -> WSGIApp:
    """A WSGI app dispatching on the exact path; a handler error is a logged 500."""

    def wsgi_app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        handler = routes.get(environ.get("PATH_INFO", ""))
        if handler is None:
            resp = text(404, "not found")
        else:
            try:
                resp = handler(environ)
            except Exception as exc:
                log.exception(
                    "request handler failed",
                    path=environ.get("PATH_INFO"),
                    reason=type(exc).__name__,
                )
                resp = text(500, "internal error")
        headers = [
            ("Content-Type", resp.content_type),
            ("Content-Length", str(len(resp.body))),
            *resp.headers,
        ]
        start_response(f"{resp.status} {_REASONS.get(resp.status, 'Status')}", headers)
        return [resp.body]

    return wsgi_app


class ReloadingTLS(BuiltinSSLAdapter):
    """cheroot's TLS adapter, re-reading the certificate and key when their files change."""

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__(str(cert), str(key))
        self._files = (cert, key)
        self._stamp = self._mtimes()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2

    def _mtimes(self) -> tuple[float, ...]:
        return tuple(p.stat().st_mtime_ns for p in self._files)

    def wrap(self, sock: socket.socket) -> Any:
        now = time.monotonic()
        if now - self._checked >= 1.0:
            with self._lock:
                self._checked = now
                try:
                    stamp = self._mtimes()
                    if stamp != self._stamp:
                        self.context.load_cert_chain(str(self._files[0]), str(self._files[1]))
                        self._stamp = stamp
                        log.info("serving certificate reloaded", cert=str(self._files[0]))
                except (OSError, ssl.SSLError) as exc:
                    log.warning(
                        "serving certificate reload failed; keeping the old one",
                        reason=type(exc).__name__,
                        error=str(exc),
                    )
        return super().wrap(sock)  # type: ignore[no-untyped-call]

    def use(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate on every new connection from now on (open ones keep
        theirs). A fresh context is swapped in whole, never changed while in use."""
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads certificates only from files: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="gpuoperator-tls-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert.write_bytes(cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key_pem)
            context.load_cert_chain(str(cert), str(key))
        with self._lock:
            self.context = context


def self_signed(hosts: Iterable[str] = ("localhost", "127.0.0.1")) -> tuple[Path, Path]:
    """A throwaway serving certificate in a private directory (for local runs only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuoperator")])
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="gpuoperator-tls-"))
    atexit.register(shutil.rmtree, directory, True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not an address such as :8080 or 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - probes come from kubelet


class Server:
    """One cheroot server in a background thread."""

    def __init__(
        self,
        name: str,
        address: str,
        wsgi_app: WSGIApp,
        *,
        tls: tuple[Path, Path] | None = None,
        threads: int = 8,
    ) -> None:
        self.name = name
        self._server = wsgi.Server(
            parse_address(address), wsgi_app, numthreads=threads, server_name=f"gpuoperator-{name}"
        )
        if tls is not None:
            self._server.ssl_adapter = ReloadingTLS(*tls)
        self.tls = tls is not None
        self._thread: threading.Thread | None = None

    def reload(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate (PEM) on new connections from now on, without a restart."""
        adapter = self._server.ssl_adapter
        if not isinstance(adapter, ReloadingTLS):
            raise ValueError(f"server {self.name} does not serve TLS")
        adapter.use(cert_pem, key_pem)

    @property
    def port(self) -> int:
        bound: tuple[str, int] = self._server.bind_addr
        return bound[1]

    def start(self) -> None:
        self._server.prepare()  # binds now: a taken port fails here, at startup
        self._thread = threading.Thread(
            target=self._server.serve, name=f"http-{self.name}", daemon=True
        )
        self._thread.start()
        log.info("serving", server=self.name, port=self.port, tls=self.tls)

    def stop(self) -> None:
        self._server.stop()
        if self._thread is not None:
            self._thread.join(5)
