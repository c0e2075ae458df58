"""The ``gpuoperator`` command: the composition root that wires the operator together.

``gpuoperator run`` starts one replica: caches, webhooks and metrics on every replica,
controllers on the one that holds the Lease.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykube
import structlog
from prometheus_client import CollectorRegistry

from admission import orders, pods, vmis
from controllers import (
    attachments,
    binder,
    claim_metrics,
    claim_protection,
    class_status,
    device_health,
    draining,
    gpu_hours,
    license_copier,
    migrations,
    node_inventory,
    placement,
    policy_params,
    preemption,
    quota_usage,
    template_claims,
    usage_records,
    webhook_certificates,
)
from gpuoperator import __version__, caches, claim_status, names, report, settings
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import certificates
from gpuoperator.runtime import admitting, errors, gcpauses, leading, logs, servercerts, serving
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.kubeconfig import load_config
from gpuoperator.runtime.managing import Manager, ManagerOptions
from gpuoperator.runtime.recording import Recorder

log = structlog.get_logger("gpuoperator")

#: The webhook server's limits: bodies as large as the API server sends, handler threads
#: for any path not answered inline; the deadlines are well inside the API server's webhook
#: timeout (serving.Limits' defaults).
WEBHOOK_LIMITS = serving.Limits(max_body=admitting.MAX_BODY, workers=8)
#: Webhooks answered on the server's event loop (``serving.Server``'s ``inline``): they
#: decide on the caches alone and write nothing.
INLINE_WEBHOOKS = (orders.PATH, vmis.PATH, pods.PATH)
#: The largest review each webhook accepts (413 beyond, naming the limit). A claim's review
#: is well under a KiB (its spec is a class name and a count): 64 KiB leaves room for tens
#: of KiB of labels, annotations and managedFields and keeps every claim's body within the
#: server's ``small_body`` (never waiting for the memory budget). A VMI's or launcher pod's
#: review is a few KiB to some tens: 1 MiB holds the API server's ceiling of 256 KiB of
#: annotations (KubeVirt copies a VMI's onto its pods) three times over.
WEBHOOK_BODY_LIMITS = {orders.PATH: 64 * 1024, vmis.PATH: 1024 * 1024, pods.PATH: 1024 * 1024}
#: The interpreter's switch interval in the operator process, in seconds (CPython's default
#: is 5 ms). A thread that wakes for an admission request or a watch event waits for the
#: GIL up to this long while another thread computes (a controller's reconcile, an informer
#: decoding a list); at 5 ms that wait is the tail of a webhook's round trip.
SWITCH_INTERVAL = 0.0005


def _bool(value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean (true or false)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuoperator", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    st = sub.add_parser("status", help="print the GPU catalog and the nodes' GPU figures")
    st.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    st.add_argument(
        "--node", help="what holds this node: its claims, and the tenants' VMs that block a drain"
    )
    st.add_argument(
        "--placement-policy",
        choices=("binpack", "spread"),
        default="binpack",
        help="the operator's placementPolicy, to tell where a take-back would happen "
        "(default: binpack)",
    )
    run = sub.add_parser("run", help="run one replica of the operator")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, or in-cluster)")
    run.add_argument(
        "--namespace",
        help="the operator's namespace: Lease and settings "
        "(default: $POD_NAMESPACE, else the kubeconfig context's)",
    )
    run.add_argument("--identity", help="leader-election identity (default: hostname_random)")
    run.add_argument(
        "--leader-elect",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="campaign for the Lease before running controllers (default true)",
    )
    run.add_argument("--health-address", default=":8081", help="plain-HTTP /healthz, /readyz")
    run.add_argument("--metrics-address", default=":8443", help="metrics; empty disables")
    run.add_argument(
        "--metrics-cert-dir",
        type=Path,
        help="directory with tls.crt and tls.key (default: self-signed)",
    )
    run.add_argument(
        "--metrics-insecure",
        action="store_true",
        help="serve metrics over plain HTTP with no authorisation (local use only)",
    )
    run.add_argument("--webhook-address", default=":9443", help="HTTPS admission webhooks")
    run.add_argument(
        "--webhook-cert-dir",
        type=Path,
        help="--certificates=mounted: directory with tls.crt and tls.key (cert-manager's Secret "
        f"layout; re-read when they change; default {names.WEBHOOK_CERT_DIR})",
    )
    add_certificate_arguments(run)
    run.add_argument("--log-format", choices=("json", "console"), default="json")
    run.add_argument("--log-level", default="info")
    run.add_argument(
        "--switch-interval",
        type=float,
        default=SWITCH_INTERVAL,
        help="the interpreter's thread switch interval in seconds (sys.setswitchinterval)",
    )
    run.add_argument("--qps", type=float, default=200.0, help="client-side API request rate")
    run.add_argument("--burst", type=int, default=400, help="client-side API burst")
    s = run.add_argument_group(
        "settings (override the gpu-operator-settings ConfigMap and the GPUOP_* environment)"
    )
    s.add_argument("--license-namespace", dest="licenseNamespace")
    s.add_argument("--placement-policy", dest="placementPolicy")
    s.add_argument("--refusal-ttl", dest="refusalTTL")
    s.add_argument("--operator-service-account", dest="operatorServiceAccount")
    s.add_argument("--gpu-for-vms", dest="gpuForVMs", type=_bool, metavar="BOOL")
    s.add_argument("--drain-moves", dest="drainMoves", type=_bool, metavar="BOOL")
    s.add_argument("--status-interval", dest="statusInterval")
    s.add_argument("--kubevirt-service-account", dest="kubevirtServiceAccount")
    s.add_argument("--exempt-namespaces", dest="exemptNamespaces")
    s.add_argument("--webhook-client-ca", dest="webhookClientCA")
    s.add_argument("--gpu-hours-series", dest="gpuHoursSeries", choices=("claim", "namespace"))
    s.add_argument("--preemption-grace", dest="preemptionGrace")
    return p


CERTIFICATE_MODES = ("self-managed", "mounted")


def _names(value: str) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{value!r} names nothing (a comma-separated list)")
    return items


def _duration(value: str) -> datetime.timedelta:
    try:
        return datetime.timedelta(seconds=settings.parse_duration(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_certificate_arguments(run: argparse.ArgumentParser) -> None:
    """The webhooks' certificate: issued and rotated by the operator, or mounted."""
    c = run.add_argument_group(
        "certificates",
        "where the webhooks' serving certificate comes from. self-managed (the default, for "
        "clusters without cert-manager): the leader keeps a CA and a serving certificate in "
        "--cert-secret, renews them before they expire and keeps the caBundle of every webhook "
        "in --webhook-configurations equal to the CA; every replica serves the certificate it "
        "reads from that Secret. mounted: the certificate is read from --webhook-cert-dir "
        "(cert-manager's Secret mounted by the kubelet; cert-manager's CA injector keeps the "
        "caBundle).",
    )
    c.add_argument(
        "--certificates",
        choices=CERTIFICATE_MODES,
        default="self-managed",
        help="self-managed (default) or mounted",
    )
    c.add_argument(
        "--cert-secret",
        default=names.WEBHOOK_CERT_SECRET,
        metavar="NAME",
        help="self-managed: the Secret in the operator's namespace holding ca.crt, ca.key, "
        f"tls.crt and tls.key (default {names.WEBHOOK_CERT_SECRET}; it must exist, the operator "
        "only reads and updates it)",
    )
    c.add_argument(
        "--webhook-service",
        default=names.WEBHOOK_SERVICE,
        metavar="NAME",
        help="self-managed: the webhooks' Service; the serving certificate names <svc>, "
        "<svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local "
        f"(default {names.WEBHOOK_SERVICE})",
    )
    c.add_argument(
        "--webhook-configurations",
        type=_names,
        default=[names.VALIDATING_WEBHOOK_CONFIGURATION, names.MUTATING_WEBHOOK_CONFIGURATION],
        metavar="NAME,...",
        help="self-managed: the Validating/MutatingWebhookConfigurations whose webhooks' "
        "caBundle the leader keeps equal to the CA (default "
        f"{names.VALIDATING_WEBHOOK_CONFIGURATION},{names.MUTATING_WEBHOOK_CONFIGURATION})",
    )
    c.add_argument(
        "--cert-extra-sans",
        type=_names,
        default=[],
        metavar="SAN,...",
        help="self-managed: more DNS names or IP addresses for the serving certificate, e.g. "
        "127.0.0.1 for a webhook registered with a loopback URL (default none)",
    )
    c.add_argument(
        "--ca-validity",
        type=_duration,
        default=certificates.CA_VALIDITY,
        metavar="DURATION",
        help="self-managed: lifetime of a new CA (default 87600h, 10 years; renewed a third of "
        "its lifetime, at most 90 days, before it expires; shorten only to try rotation)",
    )
    c.add_argument(
        "--cert-validity",
        type=_duration,
        default=certificates.SERVING_VALIDITY,
        metavar="DURATION",
        help="self-managed: lifetime of a serving certificate (default 8760h, 1 year; renewed "
        "likewise)",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "version":
        print(f"gpuoperator {__version__}")
        return 0
    if args.command == "status":
        try:
            client = Client(lambda: load_config(args.kubeconfig))
            if args.node:
                print(node_status(client, args.node))
            else:
                ledger, classes = report.collect(client)
                vmis = report.collect_vmis(client)
                print(report.catalog(ledger, classes, vmis, policy=args.placement_policy))
        except (FileNotFoundError, errors.ApiError) as exc:
            print(f"gpuoperator status: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        logs.configure(args.log_format, args.log_level)
    except ValueError as exc:
        print(f"gpuoperator: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args)
    except (settings.SettingsError, FileNotFoundError, ValueError) as exc:
        log.error("startup failed", reason=type(exc).__name__, error=str(exc))
        print(f"gpuoperator: {exc}", file=sys.stderr)
        return 2


def node_status(client: Client, node: str) -> str:
    """``gpuoperator status --node N``."""
    ledger, classes = report.collect(client)
    claims, _ = client.list(GPUClaim, field_selector=f"status.nodeName={node}")
    return report.node(
        ledger,
        classes,
        node,
        claims,
        report.collect_vmis(client),
        migrations=report.collect_migrations(client),
        kubevirt=report.collect_kubevirt(client),
    )


def leader_identity(flag: str | None) -> str:
    """The leader-election identity: ``--identity`` when given, else one unique to this
    process (``leading.unique_identity``: a restarted pod keeps its name, and two processes
    with one identity would both lead)."""
    return flag or leading.unique_identity()


def run(args: argparse.Namespace) -> int:
    if args.switch_interval <= 0:
        raise ValueError(f"--switch-interval: {args.switch_interval!r} is not > 0")
    sys.setswitchinterval(args.switch_interval)
    config_path = args.kubeconfig

    def config_factory() -> Any:
        return load_config(config_path)

    client = Client(config_factory, qps=args.qps, burst=args.burst)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or client.namespace
    operator_settings = load_settings(client, namespace, args)
    identity = leader_identity(args.identity)
    log.info(
        "starting",
        version=__version__,
        namespace=namespace,
        identity=identity,
        settings=operator_settings.model_dump(by_alias=True),
    )

    tls = None
    if args.metrics_cert_dir:
        tls = (args.metrics_cert_dir / "tls.crt", args.metrics_cert_dir / "tls.key")
    manager = Manager(
        client,
        ManagerOptions(
            namespace=namespace,
            identity=identity,
            leader_election=args.leader_elect,
            lease_name=names.LEADER_LEASE,
            health_address=args.health_address or None,
            metrics_address=args.metrics_address or None,
            metrics_tls=tls,
            metrics_insecure=args.metrics_insecure,
        ),
    )
    gcpauses.install(manager.registry)
    shared, ledger = wire(manager, operator_settings)
    if args.webhook_address:
        routes = admitting.app(
            webhooks(shared, ledger, operator_settings),
            ready=lambda: manager.ready()[0],
            registry=manager.registry,
        )
        certs = webhook_tls(args, client_ca(operator_settings))
        server = webhook_server(args.webhook_address, routes, certs, manager.registry)
        manager.options.extra_servers.append(server)
        if isinstance(certs, servercerts.MemoryCertificates):
            self_managed_certificates(args, manager, namespace, certs.reload)

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; shutting down", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    manager.run(stop)
    return 0


def webhook_server(
    address: str,
    routes: serving.App,
    certs: servercerts.CertificateSource,
    registry: CollectorRegistry,
    limits: serving.Limits = WEBHOOK_LIMITS,
) -> serving.Server:
    """The webhook server as it ships: its limits, inline paths and body limits."""
    return serving.Server(
        "webhooks",
        address,
        routes,
        tls=certs,
        limits=limits,
        registry=registry,
        inline=INLINE_WEBHOOKS,
        body_limits=WEBHOOK_BODY_LIMITS,
    )


def client_ca(operator_settings: settings.Settings) -> servercerts.ClientCA | None:
    """The CA the API server's client certificate must be signed by (the setting
    ``webhookClientCA``; re-read when the file changes), or None: no certificate asked."""
    path = operator_settings.webhook_client_ca
    if not path:
        return None
    ca = servercerts.ClientCA(Path(path))
    log.info(
        "webhooks require a client certificate signed by the client CA",
        ca=path,
        reason="ClientCA",
    )
    return ca


def webhook_tls(
    args: argparse.Namespace, ca: servercerts.ClientCA | None = None
) -> servercerts.CertificateSource:
    """What the webhook server starts with: the mounted pair (re-read when it rotates), or
    (self-managed) a throwaway pair in memory that it never serves while ready, replaced
    from the Secret; with ``ca``, requiring client certificates it signed."""
    if args.certificates == "mounted":
        cert_dir = args.webhook_cert_dir or Path(names.WEBHOOK_CERT_DIR)
        return servercerts.FileCertificates(
            cert_dir / "tls.crt", cert_dir / "tls.key", client_ca=ca
        )
    cert, key = servercerts.self_signed()
    return servercerts.MemoryCertificates(cert.read_bytes(), key.read_bytes(), client_ca=ca)


def self_managed_certificates(
    args: argparse.Namespace,
    manager: Manager,
    namespace: str,
    serve: Callable[[bytes, bytes], None],
) -> None:
    """The leader issues and rotates the certificates in the Secret and injects the
    caBundle; every replica serves what the Secret holds (and is ready once it does)."""
    options = webhook_certificates.Options(
        namespace=namespace,
        secret=args.cert_secret,
        service=args.webhook_service,
        configurations=tuple(args.webhook_configurations),
        extra_sans=tuple(args.cert_extra_sans),
        policy=certificates.Policy(
            ca_validity=args.ca_validity, serving_validity=args.cert_validity
        ),
    )
    options.wanted_names()  # a bad extra SAN fails here, at startup
    webhook_certificates.register(
        manager, Recorder(manager.writer, api_version=names.API_VERSION), options, serve
    )


def wire(manager: Manager, operator_settings: settings.Settings) -> tuple[caches.Caches, Ledger]:
    """The composition: shared caches, the ledger fed by them, and the controllers."""
    shared = caches.register(manager)
    ledger = Ledger(clock=manager.clock)
    ledger.connect(shared)
    # Events, the bindings, usage records and the status figures each write through a
    # client-side rate bucket of their own (Manager.writer_for); the others share one.
    recorder = Recorder(manager.writer_for("events"), api_version=names.API_VERSION)
    node_inventory.register(manager, shared, ledger, recorder, operator_settings)
    class_status.register(manager, shared, ledger, recorder, operator_settings)
    # Claims by phase and reason, and the oldest pending claim: computed on each scrape.
    claim_metrics.register(manager, shared)
    license_copier.register(manager, shared, recorder, operator_settings, manager.options.namespace)
    # The one write-back of claim status, shared by the binder, placement, GPU-hours and
    # draining.
    statuses = claim_status.ClaimStatus(
        manager.writer_for(binder.NAME), ledger, recorder, registry=manager.registry
    )
    binder.register(manager, shared, ledger, statuses, operator_settings)
    usage_records.register(manager, shared, workers=4)
    # Claims normally get their protection finalizer at admission (config/policy); where
    # they do not, a new claim's first write is that finalizer and the binder waits for it:
    # as many workers as the binder has writers, so it is not the bottleneck of a burst.
    claim_protection.register(manager, shared, recorder, workers=16)
    template_claims.register(manager, shared, ledger, recorder, operator_settings)
    attachments.register(manager, shared, recorder, operator_settings)
    placement.register(manager, shared, ledger, statuses, recorder, operator_settings)
    # Beyond the first catalog (docs/design.md §10): budgets shown in ResourceQuota status,
    # GPU-hours, idle holds moved off cordoned nodes.
    quota_usage.register(manager, shared)
    gpu_hours.register(manager, shared, statuses, series=operator_settings.gpu_hours_series)
    draining.register(manager, shared, ledger, statuses, recorder, operator_settings)
    # Live migration's transient holds: chosen, written, and ended with the migration.
    migrations.register(manager, shared, ledger, statuses, operator_settings)
    # DRA holds moved off unhealthy devices (docs/design.md §5 "DRA classes").
    device_health.register(manager, shared, ledger, statuses, operator_settings)
    # Running VMs on preemptible holds given notice, then stopped, for guaranteed orders.
    preemption.register(manager, shared, ledger, statuses, recorder, operator_settings)
    # The admission policies' parameter: the classes' resource names and the settings.
    policy_params.register(manager, shared, operator_settings)
    return shared, ledger


def webhooks(
    shared: caches.Caches, ledger: Ledger, operator_settings: settings.Settings
) -> dict[str, admitting.Handler]:
    """The admission handlers. They run on every replica and write nothing: they decide on
    the shared caches and the ledger alone."""
    return {
        orders.PATH: orders.OrderWebhook(shared),
        vmis.PATH: vmis.VmiWebhook(shared, ledger, operator_settings),
        pods.PATH: pods.PodWebhook(shared, operator_settings),
    }


def load_settings(client: Client, namespace: str, args: argparse.Namespace) -> settings.Settings:
    """Settings from the ConfigMap (if present), the environment and the flags."""
    cm = None
    try:
        cm = client.get_or_none(pykube.ConfigMap, names.SETTINGS_CONFIGMAP, namespace)
    except errors.ForbiddenError as exc:
        log.warning(
            "cannot read the settings ConfigMap; using defaults",
            reason="Forbidden",
            error=exc.message,
        )
    # Settings without a flag of their own come from the ConfigMap or the environment.
    flags = {key: getattr(args, key, None) for key in settings.OVERRIDES}
    return settings.load(
        (cm or {}).get("data"),
        os.environ,
        flags,
        configmap_ref=f"ConfigMap {namespace}/{names.SETTINGS_CONFIGMAP}",
    )


if __name__ == "__main__":
    sys.exit(main())
