"""The image's container run under podman as the rendered Deployment's pod runs it.

The container's settings are read from the rendered Deployment (``config/manager`` through
an overlay), so whoever runs it follows the manifest: its securityContext mapped to
podman's flags (a setting with no mapping fails), its command, args and env, its /tmp
emptyDir, its memory limit, its grace period. The kubelet's part is played by hand: a token
of the Deployment's ServiceAccount from the TokenRequest API with the cluster's CA and the
namespace, mounted read-only where the kubelet mounts them, and
``KUBERNETES_SERVICE_HOST``/``PORT`` naming the local API server. The container shares the
host's network (the API server listens on loopback); its servers bind ports the kernel picks
(as the e2e suite's replicas do), read from its "serving" log lines, so any number of
replicas run side by side.

podman always runs through ``hack/image/podman.sh`` (the repository's containers.conf).
The image tests (``test/image``) and the e2e suite's ``E2E_OPERATOR=podman`` mode
(``harness.replicas``) both start their containers here.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykube
import yaml

from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness.waiting import HopelessWaitError, wait_for
from localcluster import deployment
from localcluster.cluster import REPO, LocalCluster, kubectl_binary

PODMAN = REPO / "hack" / "image" / "podman.sh"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
Obj = dict[str, Any]


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run hack/image/podman.sh (podman with the repository's containers.conf); its stdout."""
    proc = subprocess.run(
        [str(PODMAN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout


def require_image(name: str) -> str:
    """``name`` if podman is installed and holds that image; otherwise an error naming the
    command to run (a missing prerequisite fails, never skips)."""
    if shutil.which("podman") is None:
        raise MissingPrerequisiteError(
            "podman is not installed: apt-get install podman buildah runc mmdebstrap, "
            "then make image"
        )
    proc = subprocess.run(
        [str(PODMAN), "image", "exists", name], capture_output=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        tag = name.removeprefix("localhost/")
        raise MissingPrerequisiteError(f"the image {name} is not built: run make image IMAGE={tag}")
    return name


class MissingPrerequisiteError(Exception):
    """What must be installed or built first, with the command."""


def image_name() -> str:
    """The image `make image` builds (IMAGE overrides, as for make)."""
    version = next(
        line.split('"')[1]
        for line in (REPO / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    name = os.environ.get("IMAGE", f"gpuoperator:{version}")
    return name if "/" in name.partition(":")[0] else f"localhost/{name}"


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

    def running(self) -> bool:
        return self.proc.poll() is None

    def probe(self) -> bool:
        """/readyz answers 200 now (the kubelet's readiness probe); False, never an error,
        while the container has not logged its ports or has exited."""
        if not self.running():
            return False
        found = deployment.serving_ports(self.log_text())
        if "health" not in found:
            return False
        try:
            url = f"http://127.0.0.1:{found['health']}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> int:
        """SIGTERM, SIGKILL after the grace period (the kubelet's pod deletion); the exit code."""
        podman("stop", f"--time={self.grace}", self.name, timeout=self.grace + 30, check=False)
        return self.proc.wait(30)

    def kill(self) -> None:
        """SIGKILL (a crashed or OOM-killed container): no chance to release the Lease."""
        podman("kill", self.name, check=False)
        self.proc.wait(30)

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
        self,
        image: str,
        cluster: LocalCluster,
        rendered: deployment.Rendered,
        work: Path,
        prefix: str = "gpuoperator",
        record: Path | None = None,
    ) -> None:
        self.image = image
        self.prefix = prefix
        #: A file kept holding the names of the containers started and not yet removed (a
        #: JSON list), for whoever must remove them if this process cannot.
        self.record = record
        self.rendered = rendered
        self.work = work
        self.pod = rendered.deployment["spec"]["template"]["spec"]
        self.grace = int(self.pod.get("terminationGracePeriodSeconds", 30))
        self.image_user = podman("image", "inspect", "--format", "{{.Config.User}}", image)
        self.host, self.port = service_account_files(cluster, rendered, work)
        self.started: list[Replica] = []

    def __call__(
        self, *, writable_root: bool = False, idle: bool = False, image: str | None = None
    ) -> Replica:
        """A replica (a container named ``<prefix>-<random>``, like a pod of the Deployment);
        ``writable_root`` drops only --read-only (to see what it would write); ``idle`` runs
        ``sleep`` instead of the operator, with the same flags and mounts; ``image`` runs
        another tag than the launcher's (a rolling update's new one)."""
        container = self.rendered.container
        name = f"{self.prefix}-{uuid.uuid4().hex[:6]}"
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
                [str(PODMAN), "run", *flags, image or self.image, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        servers = set() if idle else deployment.servers(args)
        replica = Replica(name, proc, log, self.grace, servers)
        self.started.append(replica)
        self._record()
        return replica

    def remove_all(self) -> None:
        for replica in self.started:
            podman("rm", "--force", "--time=0", replica.name, check=False)
            replica.proc.wait(30)
        self.started.clear()
        self._record()

    def _record(self) -> None:
        if self.record is not None:
            self.record.write_text(json.dumps([r.name for r in self.started]))
