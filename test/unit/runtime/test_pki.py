"""The self-managed certificates' cryptography, checked by OpenSSL itself: a client that
trusts only the CA bundle completes a TLS handshake, hostname checked, with the webhook
server after the certificate is handed to it in memory (``MemoryCertificates.reload``)."""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from gpuoperator import pki
from gpuoperator.model import certificates
from gpuoperator.runtime import servercerts, serving
from localcluster.cluster import free_ports

NOW = datetime.datetime.now(datetime.UTC)
YEAR = datetime.timedelta(days=365)
NAMES = certificates.serving_names("gpu-operator-webhook", "gpu-operator-system", ["127.0.0.1"])


@dataclass
class Served:
    """A TLS server on loopback and the in-memory certificate source it serves."""

    port: int
    source: servercerts.MemoryCertificates

    def reload(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.source.reload(cert_pem, key_pem)


@pytest.fixture
def server() -> Iterator[Served]:
    (port,) = free_ports(1)
    cert, key = servercerts.self_signed()
    source = servercerts.MemoryCertificates(cert.read_bytes(), key.read_bytes())
    s = serving.Server(
        "test",
        f"127.0.0.1:{port}",
        serving.app({"/": lambda _e: serving.text(200, "ok")}),
        tls=source,
    )
    s.start()
    yield Served(s.port, source)
    s.stop()


def handshake(port: int, ca_bundle: bytes, server_name: str) -> str:
    """The SHA-256 fingerprint of the certificate a verifying client accepted."""
    ctx = ssl.create_default_context(cadata=ca_bundle.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).fingerprint(hashes.SHA256()).hex()


@pytest.mark.parametrize(
    "server_name", ["gpu-operator-webhook.gpu-operator-system.svc", "127.0.0.1"]
)
def test_a_serving_certificate_handed_over_in_memory_is_trusted_through_its_ca(
    server: Served, server_name: str
) -> None:
    ca = pki.new_ca(NOW, 10 * YEAR)
    pair = pki.issue_serving(ca, NAMES, NOW, YEAR)
    server.reload(pair.cert_pem, pair.key_pem)
    assert handshake(server.port, ca.cert_pem, server_name) == pki.fingerprint(pair.cert_pem)


def test_a_reload_serves_the_new_certificate_to_new_connections(server: Served) -> None:
    old_ca, new_ca = pki.new_ca(NOW, 10 * YEAR), pki.new_ca(NOW, 10 * YEAR)
    first = pki.issue_serving(old_ca, NAMES, NOW, YEAR)
    server.reload(first.cert_pem, first.key_pem)
    second = pki.issue_serving(new_ca, NAMES, NOW, YEAR)
    server.reload(second.cert_pem, second.key_pem)
    both = pki.bundle([new_ca.cert_pem, old_ca.cert_pem])
    assert handshake(server.port, both, "127.0.0.1") == pki.fingerprint(second.cert_pem)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server.port, old_ca.cert_pem, "127.0.0.1")


def test_a_certificate_for_other_names_fails_the_hostname_check(server: Served) -> None:
    ca = pki.new_ca(NOW, 10 * YEAR)
    pair = pki.issue_serving(ca, certificates.serving_names("other", "ns"), NOW, YEAR)
    server.reload(pair.cert_pem, pair.key_pem)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server.port, ca.cert_pem, "gpu-operator-webhook.gpu-operator-system.svc")


def test_reading_a_secret_finds_the_ca_the_serving_certificate_and_its_issuer() -> None:
    old, new = pki.new_ca(NOW, 10 * YEAR), pki.new_ca(NOW, 10 * YEAR)
    serving_pair = pki.issue_serving(old, NAMES, NOW, YEAR)
    facts = pki.read(
        {
            "ca.crt": pki.bundle([new.cert_pem, old.cert_pem]),
            "ca.key": new.key_pem,
            "tls.crt": serving_pair.cert_pem,
            "tls.key": serving_pair.key_pem,
        }
    )
    assert facts.ca is not None and facts.ca.fingerprint == pki.fingerprint(new.cert_pem)
    assert [c.fingerprint for c in facts.bundle] == [
        pki.fingerprint(new.cert_pem),
        pki.fingerprint(old.cert_pem),
    ]
    assert facts.serving is not None
    assert facts.serving.issuer == pki.fingerprint(old.cert_pem)
    assert facts.serving.names == NAMES
    assert facts.serving.not_before == (NOW - certificates.BACKDATE).replace(microsecond=0)


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    ca = pki.new_ca(NOW, datetime.timedelta(days=30))
    pair = pki.issue_serving(ca, NAMES, NOW, YEAR)
    assert pki.expiry(pair.cert_pem) == pki.expiry(ca.cert_pem)


def test_mismatched_or_missing_keys_read_as_absent() -> None:
    ca, other = pki.new_ca(NOW, YEAR), pki.new_ca(NOW, YEAR)
    pair = pki.issue_serving(ca, NAMES, NOW, YEAR)
    facts = pki.read(
        {"ca.crt": ca.cert_pem, "ca.key": other.key_pem, "tls.crt": pair.cert_pem, "tls.key": b""}
    )
    assert facts.ca is None and facts.serving is None and len(facts.bundle) == 1
    assert pki.read({}) == certificates.SecretFacts()
    assert pki.serving_pair({"tls.crt": pair.cert_pem, "tls.key": other.key_pem}) is None
