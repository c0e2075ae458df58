"""The image as it ships, run as the Deployment runs it.

The container's settings are read from the rendered Deployment (``config/manager`` through
``config/overlays/dev``), so this test follows the manifest: its securityContext mapped to
podman's flags (a setting with no mapping fails the test), its command, args and env, its
/tmp emptyDir, its grace period. The kubelet's part is played by hand: a token of the
Deployment's ServiceAccount from the TokenRequest API with the cluster's CA and the
namespace, mounted read-only where the kubelet mounts them, and
``KUBERNETES_SERVICE_HOST``/``PORT`` naming the local API server. The container shares the
host's network (the API server listens on loopback); its servers bind ports the kernel picks
(as the e2e suite's replicas do), read from its "serving" log lines.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator

import pykube
import pytest
from packaging.utils import canonicalize_name

from gpuoperator import names
from harness import kube
from harness.containers import SA_DIR, Launcher, Replica, podman, security_flags, volume_flags
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import wait_injected
from localcluster import deployment
from localcluster.cluster import (
    REPO,
    LocalCluster,
    register_webhooks,
    unregister_webhooks,
)

ORDER_WEBHOOK = f"orders.{names.DOMAIN}"


@pytest.fixture(scope="module")
def launch(
    image: str,
    cluster: LocalCluster,
    rendered: deployment.Rendered,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Launcher]:
    launcher = Launcher(image, cluster, rendered, tmp_path_factory.mktemp("image"))
    try:
        yield launcher
    finally:
        launcher.remove_all()


@pytest.fixture(scope="module")
def replica(launch: Launcher) -> Replica:
    """The replica the tests below share, in order (the last one stops it)."""
    return launch()


# ---- the tests ------------------------------------------------------------------------------
def test_help_runs_under_the_deployments_security_context(
    image: str, rendered: deployment.Rendered
) -> None:
    pod = rendered.deployment["spec"]["template"]["spec"]
    image_user = podman("image", "inspect", "--format", "{{.Config.User}}", image).strip()
    flags = [
        "--rm",
        "--network=none",
        *security_flags(pod, rendered.container, image_user),
        *volume_flags(pod, rendered.container),
    ]
    out = podman("run", *flags, image, "--help")
    assert "run" in out
    assert "status" in out
    run_help = podman("run", *flags, image, "run", "--help")
    for flag in ("--webhook-address", "--health-address", "--certificates"):
        assert flag in run_help


def test_the_process_runs_as_the_manifest_says(replica: Replica) -> None:
    replica.ports()  # started and serving
    status = replica.exec("cat", "/proc/1/status")
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[:2] == ["65532", "65532"]
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["CapPrm"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # a filter: the runtime's default profile
    mounts = {
        line.split()[1]: line.split()[3].split(",")
        for line in replica.exec("cat", "/proc/1/mounts").splitlines()
    }
    assert "ro" in mounts["/"]
    assert "rw" in mounts["/tmp"]
    # /var/run is a link to /run on both bases: the mount shows under its target.
    assert "ro" in mounts.get(SA_DIR, mounts.get(SA_DIR.removeprefix("/var"), []))


def test_it_becomes_ready_with_the_in_cluster_configuration(
    replica: Replica, cluster: LocalCluster, rendered: deployment.Rendered
) -> None:
    replica.wait_ready()
    health = replica.ports()["health"]
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as r:
        assert r.status == 200
    # It leads (the only replica), under the identity a pod has: its hostname, the pod's name.
    api = kube.client(cluster.kubeconfig)
    wait_for(
        f"{replica.name} to hold the leader Lease",
        lambda: replica.holds_the_lease(api, rendered.namespace),
        timeout=60,
    )


def test_its_webhooks_answer_the_api_server_over_tls(
    replica: Replica, cluster: LocalCluster, rendered: deployment.Rendered
) -> None:
    api = kube.client(cluster.kubeconfig)
    port = replica.ports()["webhooks"]
    configs = register_webhooks(cluster.kubeconfig, rendered, port)
    ns = pykube.Namespace(api, {"metadata": {"name": f"image-{uuid.uuid4().hex[:6]}"}})
    try:
        # What harness.webhooks reads of a deployment: its rendering and namespace (no replica
        # of the suite's own runs here, so no token kubeconfig either).
        deployed = Deployed(rendered, cluster.kubeconfig, cluster.kubeconfig, cluster)
        bundle = wait_injected(api, deployed, configs)
        # The certificate the container serves is the one its CA (in the Secret, injected
        # into the configurations) signed for the Service's name.
        ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
        server_name = f"{_webhook_service(rendered)}.{rendered.namespace}.svc"
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            assert tls.version() is not None
        ns.create()
        doc = {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": "probe", "namespace": ns.name},
            "spec": {"className": "no-such-class", "count": 1},
        }
        r = api.post(
            version=names.API_VERSION,
            namespace=ns.name,
            url=names.GPU_CLAIMS,
            params={"dryRun": "All"},
            data=json.dumps(doc),
        )
        assert r.status_code == 403, r.text
        message = r.json()["message"]
        assert f'admission webhook "{ORDER_WEBHOOK}" denied the request' in message
        assert "class no-such-class does not exist" in message
    finally:
        unregister_webhooks(cluster.kubeconfig, rendered)
        if ns.exists():
            ns.delete()


def test_a_write_outside_tmp_fails_and_it_stops_within_its_grace_period(
    replica: Replica, cluster: LocalCluster, rendered: deployment.Rendered
) -> None:
    replica.ports()
    # The root is read-only: a write elsewhere fails (the next test shows none is tried).
    probe = podman(
        "exec",
        replica.name,
        "python3",
        "-c",
        "import os\n"
        "try:\n open('/opt/gpuoperator/probe','w')\nexcept OSError as e:\n print(e.errno)\n",
    )
    assert probe.strip() == "30"  # EROFS
    podman("stop", f"--time={replica.grace}", replica.name, timeout=replica.grace + 30)
    code = replica.proc.wait(30)
    assert code == 0, f"the operator exited {code} on SIGTERM:\n{replica.log_text()[-3000:]}"
    # All along it used the shipped RBAC through the mounted token: the API server's audit
    # log shows requests of the ServiceAccount and none refused.
    user = json.dumps(rendered.username)
    made = sum(user in line for line in cluster.audit_log.read_text().splitlines())
    assert made > 0, f"the audit log shows no request of {rendered.username}"
    _, refused = cluster.forbidden(rendered.username, 0)
    assert refused == [], refused


# ---- helpers --------------------------------------------------------------------------------
def _webhook_service(rendered: deployment.Rendered) -> str:
    args = rendered.container.get("args") or []
    flag = next(a for a in args if a.startswith("--webhook-service="))
    return str(flag).partition("=")[2]


def test_with_a_writable_root_it_still_writes_nothing_outside_tmp(
    launch: Launcher, cluster: LocalCluster, rendered: deployment.Rendered
) -> None:
    """The read-only root would make a write elsewhere fail, but a failure the operator
    swallowed would go unseen: so once more with a writable root layer, leading and ready,
    its changes to that layer must be none beyond what podman itself makes for the mounts
    (those of an idle container with the same flags)."""
    api = kube.client(cluster.kubeconfig)
    idle = launch(writable_root=True, idle=True)
    op = launch(writable_root=True)
    op.wait_ready()
    wait_for(
        f"{op.name} to hold the leader Lease",
        lambda: op.holds_the_lease(api, rendered.namespace),
        timeout=60,
    )
    wait_for("the idle container to run", lambda: idle.diff() or None, timeout=30)
    assert op.diff() - idle.diff() == set()
    podman("stop", f"--time={op.grace}", op.name, timeout=op.grace + 30)
    assert op.proc.wait(30) == 0, op.log_text()[-3000:]


def test_the_image_holds_exactly_the_locked_wheels(image: str) -> None:
    """The venv's distributions are requirements/runtime.txt's pins and gpuoperator, no
    more (pip and setuptools were removed), no other version."""
    listed = podman(
        "run",
        "--rm",
        "--network=none",
        '--entrypoint=["python3"]',
        image,
        "-c",
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
    )
    found: dict[str, str] = {canonicalize_name(k): v for k, v in json.loads(listed).items()}
    lock = (REPO / "requirements" / "runtime.txt").read_text()
    pinned: dict[str, str] = {
        canonicalize_name(name): version
        for name, version in re.findall(r"(?m)^([A-Za-z0-9_.-]+)==(\S+) ", lock)
    }
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert found == {**pinned, "gpuoperator": version}
