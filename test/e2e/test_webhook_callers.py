"""Authenticated callers: with the webhooks' client CA set to the CA of the API server's
webhook client certificate (the local control plane's admission configuration presents it),
the real API server's calls get through and orders are judged, while a forged review sent
straight to the webhook port without that certificate ends at the TLS handshake and changes
nothing in the cluster."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from harness.claims import bound_node, create_claim
from harness.fleet import Fleet, published
from harness.kube import refused
from harness.operator import Deployed
from harness.webhooks import WebhookOperator, ca_bundle, secret_name, webhook_operator

pytestmark = pytest.mark.operator_process  # it starts its own replica

VMI_PATH = "/mutate-vmi"


@pytest.fixture(scope="module")
def certified(
    api: pykube.HTTPClient, deployed: Deployed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookOperator]:
    """A replica whose webhooks require a client certificate of the API server's webhook
    client CA."""
    cluster = deployed.cluster
    if cluster is None:
        pytest.skip("needs the local control plane: its API server presents the certificate")
    ca = cluster.pki.webhook_client_ca
    with webhook_operator(
        api, deployed, tmp_path_factory.mktemp("callers"), f"--webhook-client-ca={ca}"
    ) as w:
        yield w


@pytest.fixture
def fleet(fleet: Fleet, certified: WebhookOperator) -> Fleet:
    return fleet


#: How a TLS 1.3 client sees the server end the session at its end of the handshake: the
#: end of the TLS stream (or a reset, when the request it already sent was left unread).
SESSION_ENDED = (ssl.SSLEOFError, ConnectionResetError)


def forged_vmi_review(namespace: str, claim: str) -> bytes:
    """A VMI review nobody asked the API server for, naming another tenant's held claim."""
    vmi = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": "forged",
            "namespace": namespace,
            "labels": {names.CLAIMS_LABEL: "true"},
            "annotations": {names.CLAIMS_ANNOTATION: json.dumps([{"claim": claim}])},
        },
        "spec": {"domain": {"devices": {}}},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "operation": "CREATE",
            "namespace": namespace,
            "name": "forged",
            "object": vmi,
            "userInfo": {"username": "system:serviceaccount:kubevirt:kubevirt-controller"},
            "dryRun": False,
        },
    }
    return json.dumps(review).encode()


def send(
    port: int,
    serving_ca: str,
    data: bytes,
    *,
    client: tuple[Path, Path] | None = None,
    tls_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3,
) -> bytes:
    """POST ``data`` to the VMI webhook over TLS, trusting the webhooks' caBundle; the end of
    the TLS session before an answer raises ``ssl.SSLEOFError``."""
    ctx = ssl.create_default_context(cadata=base64.b64decode(serving_ca).decode())
    ctx.check_hostname = False  # the loopback URL's certificate names 127.0.0.1
    ctx.maximum_version = tls_version
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    head = (
        f"POST {VMI_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, suppress_ragged_eofs=False) as tls,
    ):
        tls.sendall(head + data)
        return tls.recv(65536)


def test_only_the_api_server_gets_past_the_handshake(
    api: pykube.HTTPClient, deployed: Deployed, certified: WebhookOperator, fleet: Fleet
) -> None:
    assert deployed.cluster is not None
    # The API server's calls get through: an order is judged by the webhook.
    ns = certified.tenant(api)
    with refused(403) as r:
        create_claim(api, ns, "nowhere", "no-such-class", 1)
    assert "spec.className: class no-such-class does not exist" in r[0].message
    cls = fleet.gpu_class()
    fleet.node(4)
    published(api, cls, 4)
    create_claim(api, ns, "hold", cls, 1)
    bound_node(api, ns, "hold")
    before = GPUClaim.objects(api, namespace=ns).get(name="hold").obj

    port = certified.replica.webhook_port
    serving_ca = ca_bundle(api, deployed, secret_name(deployed))
    forged = forged_vmi_review(ns, "hold")
    # Without a certificate the session ends at the server's end of the handshake: with
    # TLS 1.3 the client's side completes first and its first read meets the end, with
    # TLS 1.2 the handshake itself fails. Not a byte of HTTP comes back.
    with pytest.raises(SESSION_ENDED):
        send(port, serving_ca, forged)
    with pytest.raises(ssl.SSLError):
        send(port, serving_ca, forged, tls_version=ssl.TLSVersion.TLSv1_2)
    # The cluster's own CA signs the admin's client certificate: not the webhook client CA.
    pki = deployed.cluster.pki
    with pytest.raises(SESSION_ENDED):
        send(port, serving_ca, forged, client=(pki.admin_cert, pki.admin_key))
    assert "ClientCertificateRefused" in certified.replica.log_text()

    # Nothing changed: the held claim is as it was, attached to nothing.
    after = GPUClaim.objects(api, namespace=ns).get(name="hold").obj
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "attachment" not in (after.get("status") or {})
    # And the API server's calls still get through.
    create_claim(api, ns, "second", cls, 1)
