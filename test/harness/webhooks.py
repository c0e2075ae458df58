"""An operator replica serving its webhooks over TLS on loopback, registered with the API
server by ``clientConfig.url`` and a ``caBundle`` (no Service, no kube-proxy needed), and
scoped to namespaces carrying a label of its own so other tests are not affected."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pykube
from cryptography.hazmat.primitives import serialization

from admission import registration
from harness.operator import OperatorProcess
from localcluster import pki


@dataclass
class WebhookOperator:
    operator: OperatorProcess
    label: tuple[str, str]
    namespace: str  # the operator's own namespace (Lease, settings)

    def tenant(self, api: pykube.HTTPClient, *, entitled: bool = False) -> str:
        """A fresh tenant namespace under these webhooks."""
        name = f"tenant-{uuid.uuid4().hex[:6]}"
        labels = {self.label[0]: self.label[1], "gpuoperator.test/e2e": "true"}
        if entitled:
            labels["gpu.cozystack.io/vgpu-entitled"] = "true"
        pykube.Namespace(api, {"metadata": {"name": name, "labels": labels}}).create()
        return name


@contextmanager
def webhook_operator(
    api: pykube.HTTPClient, kubeconfig: Path, workdir: Path, *extra: str
) -> Iterator[WebhookOperator]:
    token = uuid.uuid4().hex[:8]
    ca_cert, ca_key = pki.new_ca("webhook-test-ca")
    certs = pki.write_loopback_serving_pair(ca_cert, ca_key, workdir / "certs")
    ns = f"gpu-operator-{token}"
    pykube.Namespace(api, {"metadata": {"name": ns}}).create()
    op = OperatorProcess(
        kubeconfig,
        ns,
        f"webhooks-{token}",
        workdir,
        "--certificates=mounted",
        f"--webhook-cert-dir={certs}",
        *extra,
    )
    label = ("gpuoperator.test/webhooks", token)
    configs = registration.configurations(
        f"https://127.0.0.1:{op.webhook_port}",
        ca_cert.public_bytes(serialization.Encoding.PEM),
        namespace_selector={"matchLabels": {label[0]: label[1]}},
    )
    objects = []
    try:
        op.wait_ready()
        for config in configs:
            config["metadata"]["name"] = f"{config['metadata']['name']}-{token}"
            kind = pykube.object_factory(api, "admissionregistration.k8s.io/v1", config["kind"])
            obj = kind(api, config)
            obj.create()
            objects.append(obj)
        yield WebhookOperator(op, label, ns)
    finally:
        for obj in objects:
            obj.delete()
        op.stop()
        pykube.Namespace(api, {"metadata": {"name": ns}}).delete()
