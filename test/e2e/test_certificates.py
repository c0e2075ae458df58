"""Self-managed webhook certificates on a cluster without cert-manager (docs/design.md §9): a fresh
install issues its CA and serving certificate into the shipped (empty) Secret, injects the
caBundle and decides orders through its webhook; certificates rotate while the webhooks keep
answering."""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pykube
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from gpuoperator import names, pki
from harness.operator import Deployed, OperatorProcess
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, ca_bundle, secret_name, webhook_operator
from localcluster.cluster import apply_docs, kubectl

pytestmark = pytest.mark.operator_process  # it starts its own replicas

ORDER_WEBHOOK = f"orders.{names.DOMAIN}"


def reset_secret(deployed: Deployed) -> None:
    """The certificate Secret as shipped: empty (what a fresh install starts from)."""
    secret = deployed.rendered.one("Secret", secret_name(deployed))
    kubectl(
        deployed.admin_kubeconfig,
        "delete",
        "secret",
        secret["metadata"]["name"],
        f"--namespace={deployed.namespace}",
        "--ignore-not-found",
    )
    apply_docs(deployed.admin_kubeconfig, [secret])


@pytest.fixture
def fresh(deployed: Deployed) -> Iterator[Deployed]:
    reset_secret(deployed)
    yield deployed
    reset_secret(deployed)  # short-lived test certificates do not outlive the test


def served(port: int, bundle_b64: str, server_name: str) -> x509.Certificate:
    """The certificate the webhook server presents to a client that trusts only
    ``bundle_b64`` and checks ``server_name`` (OpenSSL's verification, not ours)."""
    ctx = ssl.create_default_context(cadata=base64.b64decode(bundle_b64).decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def first_ca(bundle_b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificates(base64.b64decode(bundle_b64))[0]


def order_for_a_missing_class(api: pykube.HTTPClient, namespace: str) -> str:
    """Dry-run an order of a class that does not exist: the order webhook refuses it. The
    API server's message, '' if it was admitted."""
    doc = {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {"className": "no-such-class", "count": 1},
    }
    r = api.post(
        version=names.API_VERSION,
        namespace=namespace,
        url=names.GPU_CLAIMS,
        params={"dryRun": "All"},
        data=json.dumps(doc),
    )
    return "" if r.ok else str(r.json().get("message", r.text))


def decided_by_the_webhook(message: str) -> bool:
    return f'admission webhook "{ORDER_WEBHOOK}" denied the request' in message


def test_a_fresh_install_issues_its_certificate_and_decides_orders_through_its_webhook(
    api: pykube.HTTPClient, fresh: Deployed, tmp_path: Path
) -> None:
    with webhook_operator(api, fresh, tmp_path) as hooks:
        secret = pykube.Secret.objects(api, namespace=fresh.namespace).get(name=secret_name(fresh))
        assert set(secret.obj["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
        bundle = ca_bundle(api, fresh, secret_name(fresh))
        service = f"{names.WEBHOOK_SERVICE}.{fresh.namespace}.svc"
        port = hooks.replica.webhook_port
        # The name the API server checks for a Service clientConfig, and the loopback IP.
        assert fingerprint(served(port, bundle, service)) == fingerprint(
            served(port, bundle, "127.0.0.1")
        )
        tenant = hooks.tenant(api)
        message = order_for_a_missing_class(api, tenant)
        assert decided_by_the_webhook(message), message
        assert "no-such-class" in message


@dataclass
class Prober:
    """Orders sent through the webhook, one after another, until stopped."""

    api: pykube.HTTPClient
    namespace: str
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            message = order_for_a_missing_class(self.api, self.namespace)
            if decided_by_the_webhook(message):
                self.answered += 1
            else:
                self.failures.append(message)
            self.stop.wait(0.1)


@dataclass
class Seen:
    bundles: list[str] = field(default_factory=list)
    serving: list[str] = field(default_factory=list)


def test_certificates_rotate_while_the_webhooks_keep_answering(
    api: pykube.HTTPClient, fresh: Deployed, tmp_path: Path
) -> None:
    """With 40-second certificates, both renew at two thirds of their life: the CA joins
    the caBundle beside the old one, the serving certificate moves to it once it settled,
    and the expired CA leaves the bundle; every order meanwhile is answered."""
    extra = ("--ca-validity=40s", "--cert-validity=40s")
    with webhook_operator(api, fresh, tmp_path, *extra) as hooks:
        secret = secret_name(fresh)
        port = hooks.replica.webhook_port
        tenant = hooks.tenant(api)
        first_bundle = ca_bundle(api, fresh, secret)
        first_serving = fingerprint(served(port, first_bundle, "127.0.0.1"))
        prober = Prober(api, tenant)
        thread = threading.Thread(target=prober.run, daemon=True)
        thread.start()
        seen = Seen()

        def rotated(hooks: WebhookOperator = hooks) -> bool:
            bundle = configured_bundle(api, fresh)
            if not seen.bundles or bundle != seen.bundles[-1]:
                seen.bundles.append(bundle)
            cert = served(port, bundle, "127.0.0.1")
            if not seen.serving or fingerprint(cert) != seen.serving[-1]:
                seen.serving.append(fingerprint(cert))
            # Served by the new CA, and the old CA gone from the bundle.
            return (
                bundle != first_bundle
                and cert.issuer == first_ca(bundle).subject
                and len(x509.load_pem_x509_certificates(base64.b64decode(bundle))) == 1
            )

        try:
            wait_for("the CA and serving certificate to rotate", rotated, timeout=90, interval=0.5)
            answered_before = prober.answered
            wait_for(
                "more orders answered after the rotation",
                lambda: prober.answered,
                until=lambda n: n >= answered_before + 5,
                timeout=30,
            )
        finally:
            prober.stop.set()
            thread.join(10)
        assert prober.failures == [], prober.failures[:5]
        assert prober.answered > 20
        assert seen.serving[-1] != first_serving
        assert first_ca(seen.bundles[-1]).subject != first_ca(first_bundle).subject
        log = hooks.replica.log_text()
        assert '"reason": "CARotated"' in log


def configured_bundle(api: pykube.HTTPClient, deployed: Deployed) -> str:
    """The caBundle the API server holds for the order webhook."""
    kind = pykube.object_factory(
        api, "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"
    )
    config = kind.objects(api).get(name=names.VALIDATING_WEBHOOK_CONFIGURATION)
    bundles = {w["clientConfig"].get("caBundle", "") for w in config.obj["webhooks"]}
    assert len(bundles) == 1, bundles
    return str(bundles.pop())


def test_mounted_certificates_are_served_as_mounted_and_the_secret_is_left_alone(
    api: pykube.HTTPClient, fresh: Deployed, tmp_path: Path
) -> None:
    """``--certificates=mounted`` (the cert-manager component): the replica serves the files
    in ``--webhook-cert-dir`` and neither issues nor injects anything."""
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.new_ca(now, datetime.timedelta(days=30))
    pair = pki.issue_serving(ca, {"127.0.0.1"}, now, datetime.timedelta(days=30))
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(pair.cert_pem)
    (certs / "tls.key").write_bytes(pair.key_pem)
    op = OperatorProcess(
        fresh, "mounted-replica", tmp_path, "--certificates=mounted", f"--webhook-cert-dir={certs}"
    )
    try:
        op.wait_ready()
        bundle = base64.b64encode(ca.cert_pem).decode()
        assert fingerprint(served(op.webhook_port, bundle, "127.0.0.1")) == pki.fingerprint(
            pair.cert_pem
        )
        secret = pykube.Secret.objects(api, namespace=fresh.namespace).get(name=secret_name(fresh))
        assert not secret.obj.get("data"), "mounted mode leaves the Secret as shipped"
    finally:
        op.stop()
