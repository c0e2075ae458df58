"""Certificates and keys for a local control plane: one CA, the API server's serving
certificate, an admin client certificate and the service-account signing key; and, from a
CA of its own, the client certificate the API server presents to admission webhooks."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the files ``ensure_pki`` writes into one directory."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def webhook_client_ca(self) -> Path:
        """The CA that signs only the API server's webhook client certificate (a webhook
        server given it as its client CA admits the API server and nobody else)."""
        return self.dir / "webhook-client-ca.crt"

    @property
    def webhook_client_cert(self) -> Path:
        return self.dir / "webhook-client.crt"

    @property
    def webhook_client_key(self) -> Path:
        return self.dir / "webhook-client.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (created 0600, never widened)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    organization: str | None = None,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Issue a leaf certificate signed by the CA (client usage, plus server usage with SANs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + (
        [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def new_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(key, hashes.SHA256())
    )
    return cert, key


def write_pair(
    cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, crt: Path, pem: Path
) -> None:
    crt.write_bytes(_cert_pem(cert))
    _write_private(pem, _key_pem(key))


def ensure_pki(directory: Path) -> Pki:
    """Create the cluster's PKI once; an existing directory is reused as it is."""
    pki = Pki(directory)
    if pki.sa_pub.exists():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_cert, ca_key = new_ca("gpuoperator-local-ca")
    write_pair(ca_cert, ca_key, pki.ca_cert, pki.ca_key)
    server, server_key = issue(
        ca_cert,
        ca_key,
        "kube-apiserver",
        server=True,
        dns_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", "::1", "10.96.0.1"),
    )
    write_pair(server, server_key, pki.server_cert, pki.server_key)
    admin, admin_key = issue(ca_cert, ca_key, "kubernetes-admin", organization="system:masters")
    write_pair(admin, admin_key, pki.admin_cert, pki.admin_key)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write_private(pki.sa_key, _key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def ensure_webhook_client(pki: Pki) -> Pki:
    """The API server's webhook client certificate and its own CA, made once."""
    if pki.webhook_client_key.exists():
        return pki
    ca_cert, ca_key = new_ca("gpuoperator-local-webhook-callers")
    pki.webhook_client_ca.write_bytes(_cert_pem(ca_cert))
    cert, key = issue(ca_cert, ca_key, "kube-apiserver-webhook-client")
    write_pair(cert, key, pki.webhook_client_cert, pki.webhook_client_key)
    return pki


def write_loopback_serving_pair(
    ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, directory: Path
) -> Path:
    """A serving certificate for a server on 127.0.0.1 (webhooks called by URL), written
    as ``tls.crt``/``tls.key`` (cert-manager's Secret layout) into ``directory``."""
    cert, key = issue(
        ca_cert,
        ca_key,
        "gpuoperator-webhooks",
        server=True,
        ips=("127.0.0.1",),
        dns_names=("localhost",),
    )
    directory.mkdir(parents=True, exist_ok=True)
    write_pair(cert, key, directory / "tls.crt", directory / "tls.key")
    return directory
