"""Run ``gpuoperator run`` as a real process against the test cluster, as deployed.

A replica is the dev overlay's Deployment container run locally
(``localcluster.deployment.operator_command``): its command, args and env, in the
Deployment's namespace, authenticated with a token of the rendered ServiceAccount, never as
cluster admin, so every e2e test exercises the shipped RBAC. Tests may append flags
(``*extra``), which win over the Deployment's.

Replicas share the deployment's namespace (its Lease, settings and certificate Secret), as
the Deployment's pods do: a test that starts replicas is the only one running them.
"""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pykube

from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness.waiting import HopelessWaitError, wait_for
from localcluster import deployment
from localcluster.cluster import LocalCluster

if TYPE_CHECKING:
    from harness.replicas import Replicas
    from harness.scaled import ScaledDeployment


@dataclass(frozen=True)
class Deployed:
    """The dev overlay as the e2e session deployed it."""

    rendered: deployment.Rendered
    #: The cluster admin's kubeconfig (for the tests themselves).
    admin_kubeconfig: Path
    #: A kubeconfig holding a token of the rendered ServiceAccount (for the replicas).
    kubeconfig: Path
    #: The local control plane, or None under ``E2E_KUBECONFIG``.
    cluster: LocalCluster | None
    #: ``E2E_OPERATOR=deployed``: the operator runs in the cluster (users' CI on kind); the
    #: suite starts no replica of its own and uses that one's webhooks.
    in_cluster: bool = False
    #: ``E2E_OPERATOR=podman``: the session's replicas of the image (in_cluster is set too:
    #: the suite starts no process replica).
    replicas: Replicas | None = None
    #: ``E2E_OPERATOR=deployed``: the cluster's Deployment, scaled up only while a module
    #: asks for the operator (``harness.scaled``).
    scaled: ScaledDeployment | None = None

    @property
    def namespace(self) -> str:
        return self.rendered.namespace

    @property
    def username(self) -> str:
        return self.rendered.username

    def release_lease(self, api: pykube.HTTPClient) -> None:
        """Delete the leader Lease (after replicas were killed, so the next ones need not
        wait out a dead holder's lease)."""
        lease = Lease.objects(api, namespace=self.namespace).get_or_none(name=names.LEADER_LEASE)
        if lease is not None:
            lease.delete()


class ForbiddenRequests:
    """The requests of the operator's ServiceAccount the API server answered 403, read from
    the local control plane's audit log (``LocalCluster.forbidden``)."""

    def __init__(self, deployed: Deployed) -> None:
        self.cluster = deployed.cluster
        self.username = deployed.username
        self._offset = 0

    def take(self) -> list[str]:
        """Those logged since the last ``take`` (each is reported once)."""
        if self.cluster is None:
            return []
        self._offset, found = self.cluster.forbidden(self.username, self._offset)
        return found


class ExitedError(HopelessWaitError):
    """The replica exited while something waited for it."""


#: Every replica started in this session, oldest first (their logs outlive them).
STARTED: list[OperatorProcess] = []


def log_tails(lines: int = 40, width: int = 600) -> list[tuple[str, str]]:
    """``(title, text)``: the last ``lines`` lines of the log of each replica still running
    (each cut at ``width`` characters), for the report of a failed test (its fixtures have
    not stopped them yet)."""
    tails = []
    for op in STARTED:
        if op.proc.poll() is not None:
            continue
        text = op.log.read_text(errors="replace").splitlines()[-lines:]
        cut = [line if len(line) <= width else line[:width] + " …" for line in text]
        tails.append((f"operator {op.identity}: last {len(cut)} log lines", "\n".join(cut)))
    return tails


class OperatorProcess:
    """One replica, with its own health, metrics and webhook ports and its log in ``log``.

    Each server binds a port the kernel picks (``deployment.ANY_PORTS``) and the ports are
    read from the replica's "serving" log lines: no other process of a shared machine can
    take one between a choice and the bind. Reading a port waits for that line (and fails at
    once if the replica exited)."""

    def __init__(self, deployed: Deployed, identity: str, log_dir: Path, *extra: str) -> None:
        if deployed.in_cluster:
            raise AssertionError(
                "E2E_OPERATOR=deployed: the suite starts no replica; a test that needs its own "
                "is marked operator_process"
            )
        self.identity = identity
        self.deployed = deployed
        self.log = log_dir / f"{identity}.log"
        argv, env = deployment.operator_command(
            deployed.rendered,
            kubeconfig=deployed.kubeconfig,
            pod_name=identity,
            ports=deployment.ANY_PORTS,
            extra=extra,
        )
        self.argv = argv
        self._servers = deployment.servers(argv)
        self._ports: dict[str, int] = {}
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        STARTED.append(self)

    # ---- ports ---------------------------------------------------------------------------
    def ports(self, timeout: float = 60) -> dict[str, int]:
        """The port each server bound, by server name (``health``, ``metrics``,
        ``webhooks``; those the flags disable are absent), once every one is serving."""
        found = wait_for(f"{self.identity}'s servers to listen", self._bound, timeout=timeout)
        assert found is not None
        return found

    def _logged(self) -> dict[str, int] | None:
        """The ports once every server logged its own (None before), without waiting."""
        if self._servers - self._ports.keys():
            self._ports = deployment.serving_ports(self.log_text())
        return None if self._servers - self._ports.keys() else self._ports

    def _bound(self) -> dict[str, int] | None:
        ports = self._logged()
        if ports is None:
            self._raise_if_exited()
        return ports

    @property
    def health_port(self) -> int:
        return self.ports()["health"]

    @property
    def metrics_port(self) -> int:
        return self.ports()["metrics"]

    @property
    def webhook_port(self) -> int:
        return self.ports()["webhooks"]

    # ---- readiness -----------------------------------------------------------------------
    def ready(self) -> bool:
        ports = self._logged()
        if ports is None:
            return False
        url = f"http://127.0.0.1:{ports['health']}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(f"{self.identity} to be ready", self._ready_or_dead, timeout=timeout)

    def _ready_or_dead(self) -> bool:
        self._raise_if_exited()
        return self.ready()

    def _raise_if_exited(self) -> None:
        if self.proc.poll() is not None:
            raise ExitedError(
                f"{self.identity} exited with {self.proc.returncode}:\n" + self.log_text()[-3000:]
            )

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the replica releases the Lease it holds), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


#: Starts a replica with extra flags and waits for it to be ready (the e2e
#: ``start_operator`` fixture).
Start = Callable[..., OperatorProcess]
