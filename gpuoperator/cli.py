"""The ``gpuoperator`` command: the composition root that wires the operator together.

``gpuoperator run`` starts one replica: caches, webhooks and metrics on every replica,
controllers on the one that holds the Lease.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pykube
import structlog

from admission import orders, pods, vmis
from controllers import (
    attachments,
    binder,
    claim_protection,
    claim_status,
    class_status,
    license_copier,
    node_inventory,
    placement,
    template_claims,
    usage_records,
)
from gpuoperator import __version__, caches, names, settings, status
from gpuoperator.inventory import Inventory
from gpuoperator.runtime import admitting, errors, logs, serving
from gpuoperator.runtime.client import Client, load_config
from gpuoperator.runtime.managing import Manager, ManagerOptions
from gpuoperator.runtime.recording import Recorder

log = structlog.get_logger("gpuoperator")


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
        help="directory with tls.crt and tls.key (cert-manager's Secret layout; re-read when "
        "they change; default: self-signed, for local use)",
    )
    run.add_argument("--log-format", choices=("json", "console"), default="json")
    run.add_argument("--log-level", default="info")
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
    s.add_argument("--status-interval", dest="statusInterval")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "version":
        print(f"gpuoperator {__version__}")
        return 0
    if args.command == "status":
        try:
            client = Client(lambda: load_config(args.kubeconfig))
            print(status.report(*status.collect(client)))
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


def run(args: argparse.Namespace) -> int:
    config_path = args.kubeconfig

    def config_factory() -> Any:
        return load_config(config_path)

    client = Client(config_factory, qps=args.qps, burst=args.burst)
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or client.namespace
    operator_settings = load_settings(client, namespace, args)
    identity = args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
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
    shared, inventory = wire(manager, operator_settings)
    if args.webhook_address:
        cert_dir = args.webhook_cert_dir
        webhook_tls = (
            (cert_dir / "tls.crt", cert_dir / "tls.key") if cert_dir else serving.self_signed()
        )
        routes = admitting.app(
            webhooks(shared, inventory, operator_settings, client),
            ready=lambda: manager.ready()[0],
            registry=manager.registry,
        )
        manager.options.extra_servers.append(
            serving.Server("webhooks", args.webhook_address, routes, tls=webhook_tls, threads=16)
        )

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; shutting down", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    manager.run(stop)
    return 0


def wire(manager: Manager, operator_settings: settings.Settings) -> tuple[caches.Caches, Inventory]:
    """The composition: shared caches, the inventory fed by them, and the controllers."""
    shared = caches.register(manager)
    inventory = Inventory(clock=manager.clock)
    inventory.connect(shared)
    # Events, the bindings, usage records and the status figures each write through a
    # client-side rate bucket of their own (Manager.writer_for); the others share one.
    recorder = Recorder(manager.writer_for("events"))
    node_inventory.register(manager, shared, inventory, recorder, operator_settings)
    class_status.register(manager, shared, inventory, recorder, operator_settings)
    license_copier.register(manager, shared, recorder, operator_settings, manager.options.namespace)
    # The one write-back of claim bindings, shared by the binder and placement.
    statuses = claim_status.ClaimStatus(
        manager.writer_for(binder.NAME), inventory, recorder, registry=manager.registry
    )
    binder.register(manager, shared, inventory, statuses, operator_settings)
    usage_records.register(manager, shared, workers=4)
    # Every new claim's first write is its protection finalizer, and the binder waits for
    # it: as many workers as the binder has writers, so it is not the bottleneck of a burst.
    claim_protection.register(manager, shared, recorder, workers=16)
    template_claims.register(manager, shared, recorder, operator_settings)
    attachments.register(manager, shared, recorder, operator_settings)
    placement.register(manager, shared, inventory, statuses, recorder, operator_settings)
    return shared, inventory


def webhooks(
    shared: caches.Caches,
    inventory: Inventory,
    operator_settings: settings.Settings,
    client: Client,
) -> dict[str, admitting.Handler]:
    """The admission handlers. They run on every replica, so their one write (the VMI
    webhook's claim attachment) goes through the plain client, not the leader's writer."""
    return {
        orders.PATH: orders.OrderWebhook(shared),
        vmis.PATH: vmis.VmiWebhook(shared, inventory, operator_settings, client),
        pods.PATH: pods.PodWebhook(shared),
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
    flags = {key: getattr(args, key) for key in settings.OVERRIDES}
    return settings.load(
        (cm or {}).get("data"),
        os.environ,
        flags,
        configmap_ref=f"ConfigMap {namespace}/{names.SETTINGS_CONFIGMAP}",
    )


if __name__ == "__main__":
    sys.exit(main())
