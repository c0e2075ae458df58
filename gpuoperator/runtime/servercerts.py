"""TLS for the operator's servers: where a server's certificate comes from, asked at every
handshake.

A TLS server (:mod:`gpuoperator.runtime.serving`) asks its :class:`CertificateSource` for
an ``ssl.SSLContext`` at every handshake, so a new certificate serves the next connection
without a restart. Two sources are provided:

* :class:`FileCertificates` re-reads ``tls.crt``/``tls.key`` when their files change
  (cert-manager rotates them in place), checked at most once a second;
* :class:`MemoryCertificates` holds a pair handed over in memory: another component (for
  example one that keeps the serving certificate in a Secret) calls
  ``reload(cert_pem, key_pem)``; a pair that does not load raises ``ValueError`` and the
  previous one goes on serving.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = structlog.get_logger(__name__)


class CertificateSource(Protocol):
    """What a TLS server asks at every handshake: the context to serve it with."""

    def context(self) -> ssl.SSLContext: ...


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS ≥ 1.2 server context for the PEM pair in ``cert``/``key``; ``ValueError``
    naming the files when they do not load as a matching pair (``OSError`` when they
    cannot be read)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise ValueError(
            f"{cert} and {key} do not load as a PEM certificate and its key: {exc}"
        ) from None
    return ctx


class FileCertificates:
    """A certificate and key read from files and re-read when the files change (checked
    at most once a second, at a handshake); a pair that fails to load is logged and the
    previous one goes on serving. The first load happens here: a missing or bad pair is
    a startup error."""

    def __init__(self, cert: Path, key: Path, *, check_every: float = 1.0) -> None:
        self.files = (cert, key)
        self._check_every = check_every
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._context = server_context(cert, key)
        self._checked = time.monotonic()

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(p.stat().st_mtime_ns for p in self.files)

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self._check_every:
            return self._context
        with self._lock:
            if now - self._checked < self._check_every:
                return self._context
            self._checked = now
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._context = server_context(*self.files)
                    self._stamp = stamp
                    log.info(
                        "serving certificate reloaded", cert=str(self.files[0]), reason="Rotated"
                    )
            except (OSError, ValueError) as exc:
                log.warning(
                    "serving certificate reload failed; keeping the old one",
                    cert=str(self.files[0]),
                    reason=type(exc).__name__,
                    error=str(exc),
                )
            return self._context


class MemoryCertificates:
    """A certificate and key handed over in memory (PEM bytes); :meth:`reload` swaps them
    for the next handshakes."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        self._context = _context_from_pem(cert_pem, key_pem)

    def reload(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve ``cert_pem``/``key_pem`` from the next handshake on. Raises ``ValueError``
        (and keeps serving the previous pair) when they do not load or do not match."""
        self._context = _context_from_pem(cert_pem, key_pem)
        log.info("serving certificate reloaded", reason="Handed")

    def context(self) -> ssl.SSLContext:
        return self._context


def _context_from_pem(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    # ssl loads chains from files only: a private directory, removed at once.
    directory = Path(tempfile.mkdtemp(prefix="gpuoperator-tls-"))
    try:
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(cert_pem)
        _write_private(key, key_pem)
        return server_context(cert, key)
    except ValueError as exc:
        raise ValueError(
            "the certificate and key do not load as a PEM certificate and its key: "
            + str(exc).rsplit(": ", 1)[-1]
        ) from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
    _write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return cert_path, key_path
