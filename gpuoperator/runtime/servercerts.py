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

Either source may be given a :class:`ClientCA`: its contexts then require a client
certificate signed by that CA (``CERT_REQUIRED``), so a peer without one is refused at the
handshake, before it can send a byte of HTTP. The CA file is re-read when it changes
(checked at most once a second, at a handshake), and the next handshakes verify against the
new CA alone: a CA taken out of the file is no longer trusted.
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


class ClientCA:
    """The CA bundle (a PEM file) that signs the client certificates a TLS server requires;
    re-read when the file changes, checked at most once a second. A file that does not load
    is a startup error here (``ValueError`` naming it); a changed file that does not load
    later is logged and the previous CA goes on being trusted."""

    def __init__(self, path: Path, *, check_every: float = 1.0) -> None:
        self.path = path
        self._check_every = check_every
        self._lock = threading.Lock()
        self._stamp = path.stat().st_mtime_ns
        self._pem = _load_ca(path)
        self._checked = time.monotonic()
        #: Incremented at every reload: contexts built for an older version are rebuilt.
        self.version = 0
        #: Reloads that failed (the previous CA kept).
        self.failures = 0

    def current(self) -> int:
        """The version of the CA to verify with, after re-reading a changed file."""
        now = time.monotonic()
        if now - self._checked < self._check_every:
            return self.version
        with self._lock:
            if now - self._checked < self._check_every:
                return self.version
            self._checked = now
            stamp = self._stamp
            try:
                stamp = self.path.stat().st_mtime_ns
                if stamp != self._stamp:
                    self._pem = _load_ca(self.path)
                    self._stamp = stamp
                    self.version += 1
                    log.info("client CA reloaded", ca=str(self.path), reason="Rotated")
            except (OSError, ValueError) as exc:
                self._stamp = stamp  # tried again when the file changes again
                self.failures += 1
                log.warning(
                    "client CA reload failed; keeping the old one",
                    ca=str(self.path),
                    reason=type(exc).__name__,
                    error=str(exc),
                )
            return self.version

    def require(self, ctx: ssl.SSLContext) -> None:
        """Make ``ctx`` require a client certificate signed by this CA."""
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self._pem)


def _load_ca(path: Path) -> str:
    """The PEM text of ``path`` once OpenSSL has loaded it as at least one certificate."""
    text = path.read_text(errors="replace")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(
            f"{path} holds no PEM certificate (a CA bundle: -----BEGIN CERTIFICATE-----)"
        )
    try:
        ssl.create_default_context(cadata=text)
    except ssl.SSLError as exc:
        raise ValueError(f"{path} does not load as a PEM CA bundle: {exc}") from None
    return text


def server_context(cert: Path, key: Path, client_ca: ClientCA | None = None) -> ssl.SSLContext:
    """A TLS ≥ 1.2 server context for the PEM pair in ``cert``/``key`` (requiring a client
    certificate signed by ``client_ca`` when given); ``ValueError`` naming the files when
    they do not load as a matching pair (``OSError`` when they cannot be read)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise ValueError(
            f"{cert} and {key} do not load as a PEM certificate and its key: {exc}"
        ) from None
    if client_ca is not None:
        client_ca.require(ctx)
    return ctx


class FileCertificates:
    """A certificate and key read from files and re-read when the files change (checked
    at most once a second, at a handshake); a pair that fails to load is logged and the
    previous one goes on serving. The first load happens here: a missing or bad pair is
    a startup error."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        *,
        check_every: float = 1.0,
        client_ca: ClientCA | None = None,
    ) -> None:
        self.files = (cert, key)
        self.client_ca = client_ca
        self._check_every = check_every
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._context = server_context(cert, key, client_ca)
        self._checked = time.monotonic()

    def _mtimes(self) -> tuple[int, ...]:
        stamps = tuple(p.stat().st_mtime_ns for p in self.files)
        return stamps if self.client_ca is None else (*stamps, self.client_ca.current())

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
                    self._context = server_context(*self.files, self.client_ca)
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

    def __init__(
        self, cert_pem: bytes, key_pem: bytes, *, client_ca: ClientCA | None = None
    ) -> None:
        self.client_ca = client_ca
        self._lock = threading.Lock()
        self._pair = (cert_pem, key_pem)
        self._version = client_ca.current() if client_ca is not None else 0
        self._context = _context_from_pem(cert_pem, key_pem, client_ca)

    def reload(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve ``cert_pem``/``key_pem`` from the next handshake on. Raises ``ValueError``
        (and keeps serving the previous pair) when they do not load or do not match."""
        with self._lock:
            self._context = _context_from_pem(cert_pem, key_pem, self.client_ca)
            self._pair = (cert_pem, key_pem)
        log.info("serving certificate reloaded", reason="Handed")

    def context(self) -> ssl.SSLContext:
        ca = self.client_ca
        if ca is not None and ca.current() != self._version:
            with self._lock:
                version = ca.current()
                if version != self._version:
                    self._context = _context_from_pem(*self._pair, ca)
                    self._version = version
        return self._context


def _context_from_pem(
    cert_pem: bytes, key_pem: bytes, client_ca: ClientCA | None = None
) -> ssl.SSLContext:
    # ssl loads chains from files only: a private directory, removed at once.
    directory = Path(tempfile.mkdtemp(prefix="gpuoperator-tls-"))
    try:
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(cert_pem)
        _write_private(key, key_pem)
        return server_context(cert, key, client_ca)
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
