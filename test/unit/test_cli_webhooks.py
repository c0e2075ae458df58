"""The CLI's webhook server: the client CA from the settings (flag, environment or
ConfigMap), the body limit of each webhook path, and the certificate sources it builds."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from gpuoperator import cli, settings
from gpuoperator.runtime import admitting, servercerts
from localcluster import pki


def ca_file(tmp_path: Path) -> Path:
    ca, _ = pki.new_ca("callers")
    path = tmp_path / "client-ca.crt"
    path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return path


def run_args(*argv: str) -> argparse.Namespace:
    return cli.parser().parse_args(["run", *argv])


def test_the_client_ca_flag_becomes_the_setting_and_the_servers_client_ca(tmp_path: Path) -> None:
    path = ca_file(tmp_path)
    args = run_args(f"--webhook-client-ca={path}", "--certificates=mounted")
    loaded = settings.load({}, {}, {k: getattr(args, k, None) for k in settings.OVERRIDES})
    assert loaded.webhook_client_ca == str(path)
    ca = cli.client_ca(loaded)
    assert ca is not None and ca.path == path
    pki.write_loopback_serving_pair(*pki.new_ca("serving"), tmp_path / "certs")
    args.webhook_cert_dir = tmp_path / "certs"
    mounted = cli.webhook_tls(args, ca)
    assert isinstance(mounted, servercerts.FileCertificates) and mounted.client_ca is ca
    self_managed = cli.webhook_tls(run_args(), ca)
    assert isinstance(self_managed, servercerts.MemoryCertificates)
    assert self_managed.client_ca is ca


def test_without_the_setting_no_client_certificate_is_asked_for() -> None:
    assert cli.client_ca(settings.load({}, {}, {})) is None


def test_a_client_ca_that_does_not_exist_is_a_startup_error(tmp_path: Path) -> None:
    loaded = settings.load({}, {"GPUOP_WEBHOOK_CLIENT_CA": str(tmp_path / "missing.crt")}, {})
    with pytest.raises(FileNotFoundError):
        cli.client_ca(loaded)


def test_the_shipped_server_limits_each_webhook_path() -> None:
    routes = admitting.app({}, ready=lambda: True, registry=CollectorRegistry())
    source = servercerts.MemoryCertificates(*(p.read_bytes() for p in servercerts.self_signed()))
    server = cli.webhook_server("127.0.0.1:0", routes, source, CollectorRegistry())
    assert server.body_limits == cli.WEBHOOK_BODY_LIMITS
    assert all(limit <= server.limits.max_body for limit in server.body_limits.values())
