"""The CLI refuses to start, with one line, when the license namespace is the operator's own
(a class naming the webhooks' certificate Secret would copy its CA key to tenants)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuoperator import cli, settings
from gpuoperator.runtime.client import Client

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_run_refuses_the_operators_namespace_as_license_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)

    def offline_settings(_client: Client, _ns: str, args: argparse.Namespace) -> settings.Settings:
        # The settings as the CLI merges them, without reading the ConfigMap.
        return settings.load(None, {}, {k: getattr(args, k, None) for k in settings.OVERRIDES})

    monkeypatch.setattr(cli, "load_settings", offline_settings)

    code = cli.main(
        [
            "run",
            f"--kubeconfig={kubeconfig}",
            "--namespace=gpu-operator-system",
            "--license-namespace=gpu-operator-system",
            "--health-address=",
            "--metrics-address=",
            "--webhook-address=",
            "--leader-elect=false",
        ]
    )

    assert code == 2
    *logged, said = capsys.readouterr().err.strip().splitlines()  # JSON log lines, then it
    assert said.startswith(
        "gpuoperator: licenseNamespace='gpu-operator-system' is the operator's own namespace"
    )
    assert any('"event": "startup failed"' in line for line in logged)
