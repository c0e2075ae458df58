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
import subprocess
import tomllib
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykube
import pytest
import yaml
from packaging.utils import canonicalize_name

from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness import kube
from harness.operator import Deployed
from harness.waiting import HopelessWaitError, wait_for
from harness.webhooks import wait_injected
from image.podman import PODMAN, podman
from localcluster import deployment
from localcluster.cluster import (
    REPO,
    LocalCluster,
    kubectl_binary,
    register_webhooks,
    unregister_webhooks,
)

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ORDER_WEBHOOK = f"orders.{names.DOMAIN}"
Obj = dict[str, Any]


# ---- the manifest, mapped to podman ---------------------------------------------------------
def quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * units.get(unit, 1)


def numeric_user(image_user: str) -> int:
    """The image's USER as the kubelet checks it for runAsNonRoot: numeric and not 0."""
    uid = image_user.partition(":")[0]
    assert uid.isdigit(), f"runAsNonRoot needs a numeric USER in the image, not {image_user!r}"
    assert int(uid) != 0, "runAsNonRoot: the image's USER is root"
    return int(uid)


def security_flags(pod: Obj, container: Obj, image_user: str) -> list[str]:
    """podman flags for the pod's and the container's securityContext (the container's wins).
    Fails on any setting not mapped here, so a change of the manifest fails until mapped."""
    merged = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
    flags: list[str] = []
    for key, value in merged.items():
        if key == "runAsNonRoot":
            assert value is True, "the manifest must run the operator as non-root"
            if "runAsUser" not in merged:
                numeric_user(image_user)
        elif key == "runAsUser":
            assert int(value) != 0
            flags.append(f"--user={value}")
        elif key == "seccompProfile":
            # podman's default seccomp profile is the runtime's default.
            assert value == {"type": "RuntimeDefault"}, f"seccompProfile {value} is not mapped"
        elif key == "allowPrivilegeEscalation":
            if value is False:
                flags.append("--security-opt=no-new-privileges")
        elif key == "readOnlyRootFilesystem":
            if value is True:
                # podman would add tmpfs of its own on /tmp, /var/tmp and /run: none here,
                # the Deployment's volumes are the only writable paths.
                flags += ["--read-only", "--read-only-tmpfs=false"]
        elif key == "capabilities":
            flags += [f"--cap-drop={c}" for c in value.get("drop") or []]
            flags += [f"--cap-add={c}" for c in value.get("add") or []]
        else:
            raise AssertionError(f"securityContext.{key} is not mapped to podman")
    return flags


def volume_flags(pod: Obj, container: Obj) -> list[str]:
    """The container's volumeMounts: emptyDirs become tmpfs of their sizeLimit."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    flags = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        assert "emptyDir" in volume, f"volume {volume} is not mapped to podman"
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        opts = "rw,mode=1777" + (f",size={quantity_bytes(size)}" if size else "")
        flags.append(f"--tmpfs={mount['mountPath']}:{opts}")
    return flags


def resource_flags(container: Obj) -> list[str]:
    limits = (container.get("resources") or {}).get("limits") or {}
    return [f"--memory={quantity_bytes(limits['memory'])}"] if "memory" in limits else []


def container_args(rendered: deployment.Rendered, pod_name: str) -> tuple[list[str], list[str]]:
    """(command, args): the Deployment's, the servers on loopback ports the kernel picks."""
    argv, _ = deployment.operator_command(
        rendered, kubeconfig=Path("/unused"), pod_name=pod_name, ports=deployment.ANY_PORTS
    )
    command = list(rendered.container["command"])
    # operator_command's argv: python -m gpuoperator.cli <command[1:]> <args> --kubeconfig
    # --identity. In the container the identity is the hostname (the pod's name) and the
    # configuration is the service account's: both flags go.
    rest = [a for a in argv[3:] if not a.startswith(("--kubeconfig=", "--identity="))]
    return command, rest[len(command) - 1 :]


def service_account_files(
    cluster: LocalCluster, rendered: deployment.Rendered, where: Path
) -> tuple[str, int]:
    """What the kubelet mounts for the pod's ServiceAccount: token (TokenRequest), ca.crt,
    namespace; world-readable as the kubelet's default mode 0644. Returns the API server's
    host and port for KUBERNETES_SERVICE_HOST/PORT."""
    tokenconfig = deployment.token_kubeconfig(
        kubectl_binary(), cluster.kubeconfig, rendered, where / "token.kubeconfig"
    )
    doc = yaml.safe_load(tokenconfig.read_text())
    cluster_entry = doc["clusters"][0]["cluster"]
    sa = where / "serviceaccount"
    sa.mkdir(mode=0o755)
    (sa / "token").write_text(doc["users"][0]["user"]["token"])
    if "certificate-authority-data" in cluster_entry:
        ca = base64.b64decode(cluster_entry["certificate-authority-data"]).decode()
    else:
        ca = Path(cluster_entry["certificate-authority"]).read_text()
    (sa / "ca.crt").write_text(ca)
    (sa / "namespace").write_text(rendered.namespace)
    for f in sa.iterdir():
        f.chmod(0o644)
    tokenconfig.unlink()
    server = urllib.parse.urlsplit(cluster_entry["server"])
    assert server.hostname is not None
    assert server.port is not None
    return server.hostname, server.port


# ---- the running container ------------------------------------------------------------------
@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    grace: int
    servers: set[str]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def ports(self) -> dict[str, int]:
        def bound() -> dict[str, int] | None:
            if self.proc.poll() is not None:
                raise HopelessWaitError(f"the container exited:\n{self.log_text()[-3000:]}")
            found = deployment.serving_ports(self.log_text())
            return None if self.servers - found.keys() else found

        ports = wait_for(
            "the container's servers to listen", bound, until=lambda p: p is not None, timeout=90
        )
        assert ports is not None
        return ports

    def exec(self, *argv: str) -> str:
        return podman("exec", self.name, *argv)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise HopelessWaitError(f"the container exited:\n{self.log_text()[-3000:]}")
        health = self.ports()["health"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self) -> None:
        wait_for(f"{self.name} to be ready on /readyz", self.ready, timeout=120)

    def holds_the_lease(self, api: pykube.HTTPClient, namespace: str) -> bool:
        lease = Lease.objects(api, namespace=namespace).get_or_none(name=names.LEADER_LEASE)
        holder = str(((lease.obj.get("spec") or {}) if lease else {}).get("holderIdentity", ""))
        # The default identity is the hostname (in a pod, its name) and a random suffix.
        return holder.startswith(f"{self.name}_")

    def diff(self) -> set[str]:
        """What changed in the container's root filesystem layer (podman diff)."""
        return set(podman("diff", self.name).splitlines())


class Launcher:
    """Starts containers of the image as the rendered Deployment's pod (see the module's
    docstring); removes them all at the end."""

    def __init__(
        self, image: str, cluster: LocalCluster, rendered: deployment.Rendered, work: Path
    ) -> None:
        self.image = image
        self.rendered = rendered
        self.work = work
        self.pod = rendered.deployment["spec"]["template"]["spec"]
        self.grace = int(self.pod.get("terminationGracePeriodSeconds", 30))
        self.image_user = podman("image", "inspect", "--format", "{{.Config.User}}", image)
        self.host, self.port = service_account_files(cluster, rendered, work)
        self.started: list[Replica] = []

    def __call__(self, *, writable_root: bool = False, idle: bool = False) -> Replica:
        """A replica; ``writable_root`` drops only --read-only (to see what it would write);
        ``idle`` runs ``sleep`` instead of the operator, with the same flags and mounts."""
        container = self.rendered.container
        name = f"gpuoperator-{uuid.uuid4().hex[:6]}"
        command, args = container_args(self.rendered, name)
        if idle:
            command, args = ["sleep"], ["600"]
        env = {
            **deployment.container_env(self.rendered, name),
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
        }
        security = security_flags(self.pod, container, self.image_user.strip())
        if writable_root:
            security = [f for f in security if not f.startswith("--read-only")]
        flags = [
            f"--name={name}",
            f"--hostname={name}",
            "--network=host",
            "--rm",
            *security,
            *volume_flags(self.pod, container),
            *resource_flags(container),
            f"--volume={self.work / 'serviceaccount'}:{SA_DIR}:ro",
            *[f"--env={k}={v}" for k, v in env.items()],
            f"--entrypoint={json.dumps(command)}",
        ]
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(PODMAN), "run", *flags, self.image, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        servers = set() if idle else deployment.servers(args)
        replica = Replica(name, proc, log, self.grace, servers)
        self.started.append(replica)
        return replica

    def remove_all(self) -> None:
        for replica in self.started:
            podman("rm", "--force", "--time=0", replica.name, check=False)
            replica.proc.wait(30)


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
