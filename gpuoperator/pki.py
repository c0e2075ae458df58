"""X.509 for the self-managed webhook certificates: issue a CA and serving certificates,
and read a Secret's PEM into the facts ``gpuoperator.model.certificates`` decides on.

Keys are ECDSA P-256 (fast to make, accepted by every Kubernetes API server). Certificates
are backdated by ``certificates.BACKDATE`` for API servers whose clock is behind ours.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuoperator.model import certificates
from gpuoperator.model.certificates import Cert, SecretFacts

CA_COMMON_NAME = "gpuoperator-webhook-ca"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


def new_ca(now: datetime.datetime, validity: datetime.timedelta) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME),
            # A distinct subject per CA, so two CAs in one bundle never look alike.
            x509.NameAttribute(NameOID.SERIAL_NUMBER, format(x509.random_serial_number(), "x")),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(now, now + validity)
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(_cert_pem(cert), _key_pem(key))


def issue_serving(
    ca: Pair, names: Iterable[str], now: datetime.datetime, validity: datetime.timedelta
) -> Pair:
    """A serving certificate for ``names`` (DNS names and IP addresses), signed by ``ca``,
    expiring no later than the CA."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("ca.key: not an ECDSA private key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in sorted(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    first_dns = next((n for n in sorted(names) if not _is_ip(n)), "gpuoperator-webhook")
    cert = (
        _builder(now, not_after)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first_dns[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(_cert_pem(cert), _key_pem(key))


def bundle(pems: Iterable[bytes]) -> bytes:
    """PEM certificates concatenated, one after another."""
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in pems)


def split(bundle_pem: bytes) -> list[bytes]:
    """The PEM certificates of a bundle, in order (unparseable ones are skipped)."""
    out = []
    for cert in _load_all(bundle_pem):
        out.append(_cert_pem(cert))
    return out


def fingerprint(cert_pem: bytes) -> str:
    return x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256()).hex()


def read(data: dict[str, bytes]) -> SecretFacts:
    """The facts of a Secret's decoded ``data`` (missing or broken entries read as absent)."""
    bundle_certs = _load_all(data.get(certificates.CA_CERT_KEY, b""))
    ca_key = _load_key(data.get(certificates.CA_KEY_KEY, b""))
    ca = None
    if ca_key is not None and bundle_certs and _matches(bundle_certs[0], ca_key):
        ca = _facts(bundle_certs[0], issuer=None)
    serving = None
    tls = _load_all(data.get(certificates.TLS_CERT_KEY, b""))
    tls_key = _load_key(data.get(certificates.TLS_KEY_KEY, b""))
    if tls and tls_key is not None and _matches(tls[0], tls_key):
        issuer = next((c for c in bundle_certs if _signed_by(tls[0], c)), None)
        serving = _facts(tls[0], issuer=None if issuer is None else _fp(issuer))
    return SecretFacts(
        bundle=tuple(_facts(c, issuer=None) for c in bundle_certs), ca=ca, serving=serving
    )


def expiry(cert_pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def serving_pair(data: dict[str, bytes]) -> Pair | None:
    """``tls.crt`` and ``tls.key`` if they parse and belong together, else None."""
    certs = _load_all(data.get(certificates.TLS_CERT_KEY, b""))
    key = _load_key(data.get(certificates.TLS_KEY_KEY, b""))
    if not certs or key is None or not _matches(certs[0], key):
        return None
    return Pair(data[certificates.TLS_CERT_KEY], data[certificates.TLS_KEY_KEY])


# ---- helpers -------------------------------------------------------------------------------
def _builder(
    not_before: datetime.datetime, not_after: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before - certificates.BACKDATE)
        .not_valid_after(not_after)
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_all(pem: bytes) -> list[x509.Certificate]:
    if not pem.strip():
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey | None:
    if not pem.strip():
        return None
    try:
        key = serialization.load_pem_private_key(pem, None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _matches(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _fp(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _facts(cert: x509.Certificate, issuer: str | None) -> Cert:
    names: set[str] = set()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        names |= {str(n) for n in san.get_values_for_type(x509.DNSName)}
        names |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return Cert(
        fingerprint=_fp(cert),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        names=frozenset(names),
        issuer=issuer,
    )
