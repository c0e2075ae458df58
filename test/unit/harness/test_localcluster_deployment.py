"""The dev overlay as the local processes run it (hack/localcluster/deployment.py): the
webhook configurations change only in their loopback URL's port, and a replica's command
line and environment are the Deployment container's, its listen addresses moved to
loopback ports and the downward API filled in."""

from __future__ import annotations

import copy
import json
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import structlog
from unit.config.manifests import render

from gpuoperator import cli
from gpuoperator.runtime import serving
from localcluster import deployment
from localcluster.processes import ClusterError

#: Every test here renders the manifests with the pinned kubectl.
pytestmark = pytest.mark.needs_tools

PORTS = deployment.Ports(health=18081, metrics=18443, webhook=19443)


@pytest.fixture(scope="module")
def dev() -> deployment.Rendered:
    return deployment.Rendered(tuple(render("overlays/dev")))


def without_urls(configs: list[deployment.Obj]) -> list[deployment.Obj]:
    out = copy.deepcopy(configs)
    for c in out:
        for w in c["webhooks"]:
            w["clientConfig"].pop("url")
    return out


def test_the_loopback_rewrite_changes_nothing_but_the_port_of_each_url(
    dev: deployment.Rendered,
) -> None:
    rewritten = deployment.loopback_webhooks(dev, 40123)
    assert without_urls(rewritten) == without_urls(dev.webhook_configurations)
    for before, after in zip(dev.webhook_configurations, rewritten, strict=True):
        for old, new in zip(before["webhooks"], after["webhooks"], strict=True):
            o, n = urlsplit(old["clientConfig"]["url"]), urlsplit(new["clientConfig"]["url"])
            assert (n.scheme, n.hostname, n.port, n.path) == ("https", o.hostname, 40123, o.path)
    untouched = [
        w["clientConfig"]["url"] for c in dev.webhook_configurations for w in c["webhooks"]
    ]
    assert all(urlsplit(u).port == 9443 for u in untouched), "the rendering is left as it was"


def test_a_service_client_config_cannot_be_run_locally_and_says_so(
    dev: deployment.Rendered,
) -> None:
    objs = [copy.deepcopy(o) for o in dev.objects]
    for o in objs:
        if o["kind"] in deployment.WEBHOOK_KINDS:
            o["webhooks"][0]["clientConfig"] = {"service": {"name": "svc", "namespace": "ns"}}
    with pytest.raises(ClusterError, match=r"has no clientConfig.url"):
        deployment.loopback_webhooks(deployment.Rendered(tuple(objs)), 1)


def test_a_replica_runs_the_containers_args_with_loopback_ports_and_its_token(
    dev: deployment.Rendered,
) -> None:
    argv, env = deployment.operator_command(
        dev, kubeconfig=Path("sa.kubeconfig"), pod_name="gpu-operator-0", ports=PORTS
    )
    container = dev.container
    assert argv[:3] == [sys.executable, "-m", "gpuoperator.cli"]
    listen = {"--health-address": 18081, "--metrics-address": 18443, "--webhook-address": 19443}
    expected = []
    for arg in [*container["command"][1:], *container["args"]]:
        flag = arg.partition("=")[0]
        expected.append(f"{flag}=127.0.0.1:{listen[flag]}" if flag in listen else arg)
    assert argv[3:] == [*expected, "--kubeconfig=sa.kubeconfig", "--identity=gpu-operator-0"]
    # What the CLI makes of it: the Deployment's certificate mode and names.
    args = cli.parser().parse_args(argv[3:])
    assert args.certificates == "self-managed"
    assert "127.0.0.1" in args.cert_extra_sans
    assert env["POD_NAMESPACE"] == dev.namespace == "gpu-operator-system"
    assert "KUBECONFIG" not in env


def test_extra_flags_come_last_so_they_win(dev: deployment.Rendered) -> None:
    argv, _ = deployment.operator_command(
        dev,
        kubeconfig=Path("k"),
        pod_name="p",
        ports=PORTS,
        extra=("--placement-policy=spread", "--metrics-address="),
    )
    args = cli.parser().parse_args(argv[3:])
    assert (args.placementPolicy, args.metrics_address) == ("spread", "")


def test_an_env_source_the_harness_cannot_fill_is_refused_naming_it(
    dev: deployment.Rendered,
) -> None:
    objs = [copy.deepcopy(o) for o in dev.objects]
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}
    ]
    with pytest.raises(ClusterError, match=r"env LIMIT: .*resourceFieldRef.* is not simulated"):
        deployment.container_env(deployment.Rendered(tuple(objs)), "p")


def test_a_replica_on_any_ports_says_in_its_log_which_port_each_server_bound() -> None:
    argv, _ = deployment.operator_command(
        deployment.Rendered(tuple(render("overlays/dev"))),
        kubeconfig=Path("k"),
        pod_name="p",
        ports=deployment.ANY_PORTS,
        extra=("--metrics-address=",),
    )
    assert "--health-address=127.0.0.1:0" in argv
    assert deployment.servers(argv) == {"health", "webhooks"}  # metrics disabled last
    server = serving.Server(
        "health",
        "127.0.0.1:0",
        serving.app({"/readyz": lambda _r: serving.text(200, "ok")}),
    )
    with structlog.testing.capture_logs() as logs:
        server.start()
    try:
        log = "\n".join(["not json", *(json.dumps(entry) for entry in logs)])
        ports = deployment.serving_ports(log)
        assert ports == {"health": server.port} and server.port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['health']}/readyz") as resp:
            assert resp.status == 200
    finally:
        server.stop()
