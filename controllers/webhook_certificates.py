"""Self-managed webhook certificates (``--certificates=self-managed``, the default).

For clusters without cert-manager, as Kueue and Gatekeeper ship:

* **Every replica** watches the certificate Secret (one object, by field selector) and
  serves the ``tls.crt``/``tls.key`` it holds, swapping them into the webhook server without
  a restart; it is not ready until it serves one (no kubelet mount is needed, so a process
  run outside the cluster works alike).
* **The leader** (controller ``webhook-certificates``) keeps a CA and a serving certificate
  in that Secret, issuing and renewing them as ``gpuoperator.model.certificates`` decides,
  and keeps the caBundle of every webhook of the named configurations equal to the Secret's
  ``ca.crt``. It is woken by changes to the Secret and to the configurations, and looks again
  when the next renewal or expiry is due (at least every 12 hours).

The Secret must exist (the deployment ships it empty): the operator only gets, watches and
updates it, so RBAC can name it. Configurations that do not exist are skipped.
"""

from __future__ import annotations

import base64
import datetime
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pykube
import structlog
from prometheus_client import CollectorRegistry, Gauge

from gpuoperator import pki
from gpuoperator.model import certificates
from gpuoperator.runtime import managing, protocols
from gpuoperator.runtime.client import Kind, Obj
from gpuoperator.runtime.clock import Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.informing import Handlers, Informer, InformerOptions
from gpuoperator.runtime.kinds import MutatingWebhookConfiguration, ValidatingWebhookConfiguration
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

NAME = "webhook-certificates"
CONFIGURATION_KINDS: tuple[Kind, ...] = (
    ValidatingWebhookConfiguration,
    MutatingWebhookConfiguration,
)


@dataclass(frozen=True)
class Options:
    namespace: str
    secret: str
    service: str
    configurations: tuple[str, ...]
    extra_sans: tuple[str, ...] = ()
    policy: certificates.Policy = field(default_factory=certificates.Policy)

    def wanted_names(self) -> frozenset[str]:
        return certificates.serving_names(self.service, self.namespace, self.extra_sans)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.expiry = Gauge(
            "gpuoperator_certificate_expiry_timestamp_seconds",
            "When a certificate this replica uses expires (Unix time): the webhooks' serving "
            "certificate it serves and the CA its caBundle carries",
            ["certificate"],
            registry=registry,
        )


_metrics = per_registry(_Metrics)


def decode(secret: Obj | None) -> dict[str, bytes]:
    """A Secret's ``data``, base64-decoded (broken entries read as empty)."""
    out = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value or "", validate=True)
        except ValueError:
            out[key] = b""
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Loader:
    """Serves what the Secret holds, on every replica. ``serve(cert_pem, key_pem)`` is the
    webhook server's seam (``serving.Server.reload``)."""

    def __init__(
        self,
        serve: Callable[[bytes, bytes], None],
        secret_ref: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._serve = serve
        self._ref = secret_ref
        self._serving: str | None = None
        self._loaded = threading.Event()
        self._lock = threading.Lock()
        self._metrics = _metrics(registry)

    def ready(self) -> bool:
        return self._loaded.is_set()

    def handlers(self) -> Handlers:
        return Handlers(on_add=self.load, on_update=lambda _old, new: self.load(new))

    def load(self, secret: Obj) -> None:
        data = decode(secret)
        pair = pki.serving_pair(data)
        if pair is None:
            log.debug("no serving certificate in the Secret yet", secret=self._ref)
            return
        fingerprint = pki.fingerprint(pair.cert_pem)
        with self._lock:
            if fingerprint == self._serving:
                return
            try:
                self._serve(pair.cert_pem, pair.key_pem)
            except (OSError, ValueError) as exc:
                log.warning(
                    "serving certificate not loaded; keeping the old one",
                    secret=self._ref,
                    reason=type(exc).__name__,
                    error=str(exc),
                )
                return
            self._serving = fingerprint
        expires = pki.expiry(pair.cert_pem)
        self._metrics.expiry.labels("webhook-serving").set(expires.timestamp())
        cas = pki.split(data.get(certificates.CA_CERT_KEY, b""))
        if cas:
            self._metrics.expiry.labels("webhook-ca").set(pki.expiry(cas[0]).timestamp())
        self._loaded.set()
        log.info(
            "serving certificate loaded",
            reason="CertificateLoaded",
            secret=self._ref,
            fingerprint=fingerprint[:16],
            expires=expires.isoformat(),
        )


class ApiAccess(protocols.Replaces, Protocol):
    """What the controller asks of the API server: the Secret and the webhook
    configurations replaced."""


class WebhookCertificates:
    """The leader's reconciler: one key, the Secret's."""

    def __init__(
        self,
        options: Options,
        secret: Informer,
        configurations: Iterable[tuple[Kind, Informer]],
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        clock: Clock,
    ) -> None:
        self.options = options
        self.secret = secret
        self.configurations = list(configurations)
        self.writer = writer
        self.recorder = recorder
        self.clock = clock
        self._ref = f"{options.namespace}/{options.secret}"

    def reconcile(self, key: Key) -> Result | None:
        secret = self.secret.store.get(key)
        if secret is None:
            log.warning(
                "certificate Secret not found; the deployment ships it (empty)",
                reason="SecretNotFound",
                secret=self._ref,
            )
            return Result(requeue_after=30.0)
        now = self.clock.now()
        data = decode(secret)
        configs = [(kind, c) for kind, inf in self.configurations for c in inf.store.values()]
        bundle_b64 = _b64(data.get(certificates.CA_CERT_KEY, b""))
        injected = all(certificates.ca_bundle_holds(c, bundle_b64) for _, c in configs)
        facts = pki.read(data)
        plan = certificates.plan(
            facts, self.options.wanted_names(), now, injected=injected, policy=self.options.policy
        )
        if plan.writes:
            data = self._write(secret, data, facts, plan, now)
            bundle_b64 = _b64(data[certificates.CA_CERT_KEY])
        for kind, config in configs:
            updated = certificates.with_ca_bundle(config, bundle_b64)
            if updated is None:
                continue
            body = {**updated, "apiVersion": kind.version, "kind": kind.kind}
            self.writer.replace(kind, body)
            log.info(
                "caBundle injected",
                reason="CABundleInjected",
                configuration=config["metadata"]["name"],
                kind=kind.kind,
                webhooks=len(config.get("webhooks") or []),
            )
        assert plan.next_check is not None
        wait = (plan.next_check - self.clock.now()).total_seconds()
        return Result(requeue_after=max(1.0, wait))

    def _write(
        self,
        secret: Obj,
        data: dict[str, bytes],
        facts: certificates.SecretFacts,
        plan: certificates.Plan,
        now: datetime.datetime,
    ) -> dict[str, bytes]:
        policy = self.options.policy
        existing = {
            pki.fingerprint(p): p for p in pki.split(data.get(certificates.CA_CERT_KEY, b""))
        }
        kept = [existing[f] for f in plan.bundle if f in existing]
        out = dict(data)
        if plan.issue_ca:
            ca = pki.new_ca(now, policy.ca_validity)
            out[certificates.CA_KEY_KEY] = ca.key_pem
            out[certificates.CA_CERT_KEY] = pki.bundle([ca.cert_pem, *kept])
        else:
            current = pki.split(data[certificates.CA_CERT_KEY])[0]
            ca = pki.Pair(current, data[certificates.CA_KEY_KEY])
            out[certificates.CA_CERT_KEY] = pki.bundle(kept)
        if plan.issue_serving:
            serving = pki.issue_serving(
                ca, self.options.wanted_names(), now, policy.serving_validity
            )
            out[certificates.TLS_CERT_KEY] = serving.cert_pem
            out[certificates.TLS_KEY_KEY] = serving.key_pem
        body: dict[str, Any] = {
            **secret,
            "apiVersion": "v1",
            "kind": "Secret",
            "data": {k: _b64(v) for k, v in out.items()},
        }
        self.writer.replace(pykube.Secret, body)
        reason, message = _describe(plan, rotated=facts.ca is not None)
        log.info(message, reason=reason, secret=self._ref)
        self.recorder.event(secret, "Normal", reason, message, kind="Secret", api_version="v1")
        return out


def _describe(plan: certificates.Plan, *, rotated: bool) -> tuple[str, str]:
    """The reason and message of a write to the Secret (log line and Event)."""
    issued = [
        what
        for what, done in (("a CA", plan.issue_ca), ("a serving certificate", plan.issue_serving))
        if done
    ]
    why = "; ".join(plan.reasons)
    if not issued:
        return "CABundlePruned", f"expired CA dropped from ca.crt ({why})"
    reason = "CARotated" if plan.issue_ca and rotated else "CertificateIssued"
    return reason, f"issued {' and '.join(issued)} ({why})"


class ManagerAccess(
    managing.Informs, managing.Controls, managing.Clocked, managing.Measured, Protocol
):
    """What ``register`` uses of the manager: the informers, a readiness gate, the fenced
    writer."""

    @property
    def writer(self) -> ApiAccess: ...

    def add_readiness_gate(self, name: str, check: Callable[[], bool]) -> None: ...


def register(
    manager: ManagerAccess,
    recorder: protocols.RecordsEvents,
    options: Options,
    serve: Callable[[bytes, bytes], None],
) -> tuple[Loader, Controller[Key]]:
    """The loader on every replica (a readiness gate of the manager) and the leader's
    controller."""
    secret = manager.informer(
        pykube.Secret,
        InformerOptions(
            namespace=options.namespace, field_selector=f"metadata.name={options.secret}"
        ),
        name=NAME + "-secret",
    )
    loader = Loader(serve, f"{options.namespace}/{options.secret}", manager.registry)
    secret.add_handlers(loader.handlers())
    manager.add_readiness_gate("serving certificate", loader.ready)

    configurations = [
        (
            kind,
            manager.informer(
                kind,
                InformerOptions(field_selector=f"metadata.name={name}"),
                name=f"{NAME}-{kind.endpoint}-{name}",
            ),
        )
        for name in options.configurations
        for kind in CONFIGURATION_KINDS
    ]
    key: Key = (options.namespace, options.secret)
    controller = manager.controller(
        NAME,
        WebhookCertificates(
            options, secret, configurations, manager.writer, recorder, manager.clock
        ),
        workers=1,
        seed=lambda: [key],
    )
    manager.add_controller(
        controller,
        [(secret, lambda _o: [key])] + [(inf, lambda _o: [key]) for _, inf in configurations],
    )
    return loader, controller
