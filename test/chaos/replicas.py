"""Two operator replicas the way the Deployment runs them, and the faults done to them.

* ``config/overlays/dev`` is rendered and applied (``localcluster.deployment``); each
  replica is the Deployment's container run as a local process (``harness.operator``): its
  args and env, a token of its ServiceAccount, self-managed certificates. It reaches the API
  server through a :class:`harness.proxy.PartitionableProxy`, so a test can cut every watch
  and request connection of both replicas at once.
* Both replicas serve the webhooks with the serving certificate the leader keeps in the
  rendered Secret; the API server calls them through one
  :class:`harness.failover.WebhookFailover` address (a Service's ready endpoints, with
  failover when one dies mid-request), registered once as the rendered configurations with
  only the URL's port changed; the leader injects its CA into them, as deployed. The proxy
  presents that same serving certificate (what a Service's endpoints present) and verifies
  the replicas with the Secret's CA. Killing a replica therefore never refuses an order:
  only a replica's decision does.
* A replica that is killed is replaced by a new process with a new identity, as a new pod
  of the Deployment would be (a pod's identity is its name).
"""

from __future__ import annotations

import base64
import datetime
import signal
import time
from pathlib import Path

import pykube
import yaml

from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness import webhooks as harness_webhooks
from harness.failover import WebhookFailover
from harness.operator import Deployed, ForbiddenRequests, OperatorProcess
from harness.proxy import PartitionableProxy
from harness.waiting import wait_for
from localcluster import deployment
from localcluster.cluster import LocalCluster, deploy_to, kubectl_binary, register_webhooks


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
        #: Arguments every replica started from now on gets after the Deployment's
        #: (``renew`` sets them).
        self.extra: tuple[str, ...] = ()
        rendered = deployment.render(kubectl_binary())
        deploy_to(cluster.kubeconfig, rendered, log=lambda _msg: None)
        self.apiserver_proxy = PartitionableProxy(("127.0.0.1", cluster.ports().apiserver))
        token = deployment.token_kubeconfig(
            kubectl_binary(), cluster.kubeconfig, rendered, workdir / "operator-kubeconfig"
        )
        self.deployed = Deployed(rendered, cluster.kubeconfig, self._via_proxy(token), cluster)
        self.namespace = rendered.namespace
        self.forbidden = ForbiddenRequests(self.deployed)
        self.webhooks: WebhookFailover | None = None
        self._certs = workdir / "webhook-certs"

    def _via_proxy(self, kubeconfig: Path) -> Path:
        config = yaml.safe_load(kubeconfig.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{self.apiserver_proxy.port}"
        kubeconfig.write_text(yaml.safe_dump(config))
        return kubeconfig

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> OperatorProcess:
        """One more replica (waiting only for its servers to listen, not for it to be
        ready)."""
        self._serial += 1
        identity = f"gpu-operator-{self._serial}"
        op = OperatorProcess(self.deployed, identity, self.logs, *self.extra)
        self.live[identity] = op
        if self.webhooks is not None:
            self.webhooks.add(identity, op.webhook_port, op.health_port)
        return op

    def up(self, count: int = 2) -> None:
        """Start replicas until ``count`` run, wait for all to be ready and one to lead,
        and register the webhooks behind the failover address (once)."""
        while len(self.live) < count:
            self.start()
        for op in self.live.values():
            op.wait_ready(timeout=120)
        self.wait_leader()
        if self.webhooks is None:
            self._serve_webhooks()

    def _serve_webhooks(self) -> None:
        self.refresh_certificates()
        self.webhooks = WebhookFailover(self._certs, self._certs / "ca.crt")
        for identity, op in self.live.items():
            self.webhooks.add(identity, op.webhook_port, op.health_port)
        configs = register_webhooks(
            self.cluster.kubeconfig, self.deployed.rendered, self.webhooks.port
        )
        harness_webhooks.wait_injected(self.api, self.deployed, configs)

    def refresh_certificates(self) -> None:
        """Write the serving pair and CA the leader keeps in the Secret for the proxy (and
        have a running proxy load them, in case the leader rotated them)."""
        secret = harness_webhooks.secret_name(self.deployed)

        def pair() -> dict[str, str]:
            found = pykube.Secret.objects(self.api, namespace=self.namespace).get_or_none(
                name=secret
            )
            return dict((found.obj.get("data") or {}) if found is not None else {})

        data = wait_for(
            f"the serving certificate in Secret {secret}",
            pair,
            until=lambda d: all(d.get(k) for k in ("tls.crt", "tls.key", "ca.crt")),
            timeout=60,
        )
        self._certs.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key", "ca.crt"):
            path = self._certs / name
            path.write_bytes(base64.b64decode(data[name]))
            path.chmod(0o600)
        if self.webhooks is not None:
            self.webhooks.load_certificates(self._certs, self._certs / "ca.crt")

    def close(self) -> None:
        for op in list(self.live.values()):
            op.stop()
        for op in self.dead:
            op.stop()
        if self.webhooks is not None:
            self.webhooks.close()
        self.apiserver_proxy.close()

    # ---- the Lease ---------------------------------------------------------------------
    def lease(self) -> dict[str, object]:
        lease = Lease.objects(self.api, namespace=self.namespace).get_or_none(
            name=names.LEADER_LEASE
        )
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
        if self.webhooks is not None:
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

    def renew(self, *extra: str) -> None:
        """Stop every replica gracefully (the leader releases the Lease) and start a fresh
        pair, run with the Deployment's arguments and ``extra`` (so far as this pair and its
        replacements live): a test that starts with it is not judged on what an earlier one
        left."""
        self.extra = extra
        for identity in list(self.live):
            op = self.live.pop(identity)
            if self.webhooks is not None:
                self.webhooks.remove(identity)
            op.stop()
            self.dead.append(op)
        self.up()

    def cut_connections(self) -> None:
        """Cut every connection of the replicas to the API server (watches included)."""
        self.apiserver_proxy.partition()
        self.apiserver_proxy.heal()

    def log_count(self, needle: str) -> int:
        """Occurrences of ``needle`` in the logs of every replica started so far."""
        ops = [*self.live.values(), *self.dead]
        return sum(op.log.read_text(errors="replace").count(needle) for op in ops)
