"""Two operator replicas the way a Deployment runs them, and the faults done to them.

* Each replica is a real ``gpuoperator run`` process (``harness.operator``). It reaches the
  API server through a :class:`harness.proxy.PartitionableProxy`, so a test can cut every
  watch and request connection at once.
* Both replicas serve the webhooks with one serving certificate; the API server calls them
  through one :class:`harness.failover.WebhookFailover` address (a Service's ready
  endpoints, with failover when one dies mid-request), registered once. Killing a replica
  therefore never refuses an order: only a replica's decision does.
* A replica that is killed is replaced by a new process with a new identity, as a new pod
  of the Deployment would be (the default identity is ``<hostname>_<random>``).
"""

from __future__ import annotations

import datetime
import signal
import time
from pathlib import Path

import pykube
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from admission import registration
from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness.failover import WebhookFailover
from harness.operator import OperatorProcess
from harness.proxy import PartitionableProxy
from harness.waiting import wait_for
from localcluster import pki
from localcluster.cluster import LocalCluster

NAMESPACE = "gpu-operator"


def parse_micro_time(value: str) -> float:
    """A Lease MicroTime (``2026-01-02T03:04:05.123456Z``) as a POSIX timestamp."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Replicas:
    """The operator pair of the chaos suite; ``close()`` stops everything it started."""

    def __init__(self, cluster: LocalCluster, api: pykube.HTTPClient, workdir: Path) -> None:
        self.cluster = cluster
        self.api = api
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.live: dict[str, OperatorProcess] = {}
        self.dead: list[OperatorProcess] = []
        self._serial = 0
        pykube.Namespace(api, {"metadata": {"name": NAMESPACE}}).create()
        ca_cert = x509.load_pem_x509_certificate(cluster.pki.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(cluster.pki.ca_key.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        self.certs = pki.write_loopback_serving_pair(ca_cert, ca_key, workdir / "webhook-certs")
        self.apiserver_proxy = PartitionableProxy(("127.0.0.1", cluster.ports().apiserver))
        self.kubeconfig = self._proxied_kubeconfig()
        self.webhooks = WebhookFailover(self.certs, cluster.pki.ca_cert)
        self._registered: list[pykube.objects.APIObject] = []

    def _proxied_kubeconfig(self) -> Path:
        config = yaml.safe_load(self.cluster.kubeconfig.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.apiserver_proxy.port}"
        path = self.workdir / "kubeconfig-via-proxy"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> OperatorProcess:
        """One more replica (not waiting for it to be ready)."""
        self._serial += 1
        identity = f"replica-{self._serial}"
        op = OperatorProcess(
            self.kubeconfig,
            NAMESPACE,
            identity,
            self.logs,
            f"--webhook-cert-dir={self.certs}",
            "--metrics-address=",
        )
        self.live[identity] = op
        self.webhooks.add(identity, op.webhook_port, op.health_port)
        return op

    def up(self, count: int = 2) -> None:
        """Start replicas until ``count`` run, wait for all to be ready and one to lead,
        and register the webhooks (once)."""
        while len(self.live) < count:
            self.start()
        for op in self.live.values():
            op.wait_ready(timeout=120)
        self.wait_leader()
        if not self._registered:
            self._register()

    def _register(self) -> None:
        configs = registration.configurations(
            self.webhooks.url, self.cluster.pki.ca_cert.read_bytes()
        )
        for config in configs:
            kind = pykube.object_factory(
                self.api, "admissionregistration.k8s.io/v1", config["kind"]
            )
            obj = kind(self.api, config)
            obj.create()
            self._registered.append(obj)

    def close(self) -> None:
        for obj in self._registered:
            obj.delete()
        for op in list(self.live.values()):
            op.stop()
        for op in self.dead:
            op.stop()
        self.webhooks.close()
        self.apiserver_proxy.close()

    # ---- the Lease ---------------------------------------------------------------------
    def lease(self) -> dict[str, object]:
        lease = Lease.objects(self.api, namespace=NAMESPACE).get_or_none(name=names.LEADER_LEASE)
        return dict(lease.obj["spec"]) if lease is not None else {}

    def leader(self) -> str:
        """The identity holding the Lease when it is one of the live replicas, else ''."""
        holder = str(self.lease().get("holderIdentity") or "")
        return holder if holder in self.live else ""

    def wait_leader(self, timeout: float = 60) -> str:
        return wait_for(
            "a live replica to hold the Lease", self.leader, timeout=timeout, interval=0.05
        )

    # ---- faults ------------------------------------------------------------------------
    def kill(self, identity: str) -> float:
        """SIGKILL one replica; returns the wall-clock time of the kill."""
        op = self.live.pop(identity)
        self.webhooks.remove(identity)
        killed = time.time()
        op.signal(signal.SIGKILL)
        op.wait_exit(10)
        self.dead.append(op)
        return killed

    def kill_leader_and_replace(self) -> tuple[str, float]:
        """SIGKILL the leader and start its replacement at once (a new pod)."""
        leader = self.wait_leader()
        killed = self.kill(leader)
        self.start()
        return leader, killed

    def handover(self, killed: float, old: str, timeout: float = 60) -> tuple[str, float]:
        """Wait for another live replica to acquire the Lease after ``old`` was killed at
        ``killed``; returns it and the seconds from the kill to its acquireTime."""

        def taken() -> tuple[str, float] | None:
            spec = self.lease()
            holder = str(spec.get("holderIdentity") or "")
            if holder and holder != old and holder in self.live and spec.get("acquireTime"):
                return holder, parse_micro_time(str(spec["acquireTime"])) - killed
            return None

        found = wait_for(f"a new leader after {old}", taken, timeout=timeout, interval=0.05)
        assert found is not None
        return found

    def restart_all(self) -> float:
        """SIGKILL every replica and start a fresh pair (nothing in memory survives);
        returns the kill time. Waits until the new pair is ready and leads."""
        killed = time.time()
        for identity in list(self.live):
            self.kill(identity)
        self.up()
        return killed

    def cut_connections(self) -> None:
        """Cut every connection of the replicas to the API server (watches included)."""
        self.apiserver_proxy.partition()
        self.apiserver_proxy.heal()

    def log_count(self, needle: str) -> int:
        """Occurrences of ``needle`` in the logs of every replica started so far."""
        ops = [*self.live.values(), *self.dead]
        return sum(op.log_text().count(needle) for op in ops)
