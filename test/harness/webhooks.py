"""An operator replica serving its webhooks, registered with the API server as deployed.

The webhook configurations are the dev overlay's rendering, with only the port of their
loopback ``clientConfig.url`` set to the replica's (no Service, no kube-proxy needed). The
replica issues its serving certificate and injects the caBundle itself
(``--certificates=self-managed``, the Deployment's mode): nothing is made by hand. They
apply to the whole cluster, as deployed: the suite runs on a cluster of its own, and they
are registered only while the replica serves them (they fail closed).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pykube

from harness.operator import Deployed, OperatorProcess
from harness.waiting import wait_for
from localcluster import deployment
from localcluster.cluster import register_webhooks, unregister_webhooks


@dataclass
class WebhookOperator:
    #: The replica serving the webhooks (None: the operator deployed in the cluster).
    operator: OperatorProcess | None
    namespace: str  # the operator's own namespace (Lease, settings, certificate Secret)

    @property
    def replica(self) -> OperatorProcess:
        """The replica the suite started (tests that need it are marked operator_process)."""
        assert self.operator is not None, "the webhooks are the deployed operator's"
        return self.operator

    def tenant(self, api: pykube.HTTPClient, *, entitled: bool = False) -> str:
        """A fresh tenant namespace."""
        name = f"tenant-{uuid.uuid4().hex[:6]}"
        labels = {"gpuoperator.test/e2e": "true"}
        if entitled:
            labels["gpu.cozystack.io/vgpu-entitled"] = "true"
        pykube.Namespace(api, {"metadata": {"name": name, "labels": labels}}).create()
        return name


def ca_bundle(api: pykube.HTTPClient, deployed: Deployed, secret: str) -> str:
    """The Secret's ``ca.crt`` as a caBundle (base64), or "" while it has none."""
    obj = pykube.Secret.objects(api, namespace=deployed.namespace).get_or_none(name=secret)
    data = (obj.obj.get("data") or {}) if obj else {}
    return str(data.get("ca.crt") or "")


def injected(api: pykube.HTTPClient, configs: list[deployment.Obj], bundle: str) -> bool:
    """Every webhook of ``configs`` (as live on the cluster) carries ``bundle``."""
    for config in configs:
        kind = pykube.object_factory(api, "admissionregistration.k8s.io/v1", config["kind"])
        live = kind.objects(api).get(name=config["metadata"]["name"]).obj
        if any(w["clientConfig"].get("caBundle") != bundle for w in live["webhooks"]):
            return False
    return bool(bundle)


def wait_injected(api: pykube.HTTPClient, deployed: Deployed, configs: list[deployment.Obj]) -> str:
    """Wait until the operator injected its CA into every webhook; return the caBundle."""
    secret = secret_name(deployed)
    bundle: str = wait_for(
        "the operator to inject its CA into the webhook configurations",
        lambda: ca_bundle(api, deployed, secret),
        until=lambda bundle: injected(api, configs, bundle),
        timeout=30,
    )
    return bundle


def secret_name(deployed: Deployed) -> str:
    args = deployed.rendered.container.get("args") or []
    flag = next((a for a in args if a.startswith("--cert-secret=")), None)
    assert flag is not None, f"the Deployment's args name no --cert-secret: {json.dumps(args)}"
    return str(flag).partition("=")[2]


@contextmanager
def webhook_operator(
    api: pykube.HTTPClient, deployed: Deployed, workdir: Path, *extra: str
) -> Iterator[WebhookOperator]:
    """A replica serving the webhooks, registered; with ``E2E_OPERATOR=podman``, replicas
    of the image serving for the block (``Replicas.serving``); with
    ``E2E_OPERATOR=deployed``, the deployed operator scaled up for the block
    (``ScaledDeployment.serving``) and its webhooks once their caBundle is injected
    (``extra`` must be empty: those run with their Deployment's args)."""
    if deployed.replicas is not None:
        # E2E_OPERATOR=podman: replicas of the image serve for the block, the
        # configurations pointed at a ready one.
        assert not extra, f"E2E_OPERATOR=podman runs the Deployment's args, not {extra}"
        with deployed.replicas.serving():
            wait_injected(api, deployed, deployed.rendered.webhook_configurations)
            yield WebhookOperator(None, deployed.namespace)
        return
    if deployed.in_cluster:
        assert not extra, f"E2E_OPERATOR=deployed runs the Deployment's args, not {extra}"
        assert deployed.scaled is not None, "E2E_OPERATOR=deployed: the Deployment is not adopted"
        # The Deployment scaled up for the block, its webhooks registered (harness.scaled).
        with deployed.scaled.serving():
            wait_injected(api, deployed, deployed.rendered.webhook_configurations)
            yield WebhookOperator(None, deployed.namespace)
        return
    op = OperatorProcess(deployed, f"webhooks-{uuid.uuid4().hex[:6]}", workdir, *extra)
    try:
        op.wait_ready()
        configs = register_webhooks(deployed.admin_kubeconfig, deployed.rendered, op.webhook_port)
        wait_injected(api, deployed, configs)
        yield WebhookOperator(op, deployed.namespace)
    finally:
        unregister_webhooks(deployed.admin_kubeconfig, deployed.rendered)
        op.stop()
