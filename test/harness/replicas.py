"""Replicas of the image as podman containers, the Deployment's pods without a kubelet.

Each replica is the image run by ``harness.containers.Launcher``: the rendered Deployment's
securityContext, volumes, memory limit, command, args and env mapped to podman's flags, a
TokenRequest token of its ServiceAccount mounted where the kubelet mounts it, the host's
network with every server on a port the kernel picks (so replicas run side by side).

What a Service and the endpoints controller do for the pods is played here by one thread:
it probes every replica's ``/readyz`` (the Deployment's readinessProbe) and keeps the
webhook configurations pointed at a ready replica, the way ``harness.webhooks`` points them
at a process replica: only the port of their loopback ``clientConfig.url`` changes, so the
API server calls the container over TLS with the certificate the operator issued itself. A
replica that stops being ready, or is being replaced, is taken out first; a configuration's
single URL stands for the Service's one virtual IP, so one ready replica at a time serves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pykube

from gpuoperator import names
from gpuoperator.runtime.kinds import Lease
from harness.containers import Launcher, Replica
from harness.waiting import wait_for
from localcluster import deployment
from localcluster.cluster import register_webhooks, unregister_webhooks

#: How often the readiness of each replica is probed (the Deployment probes every 10 s; the
#: endpoints follow faster here so a test's kill shows in seconds, not a probe period).
PROBE_SECONDS = 0.5


@dataclass
class Endpoint:
    """A change of the replica the webhook configurations point at."""

    at: float  # time.monotonic()
    replica: str  # "" when no replica is ready


@dataclass
class Replicas:
    """``count`` replicas of the image, and the endpoints thread (see the module docstring)."""

    launcher: Launcher
    admin_kubeconfig: Path
    rendered: deployment.Rendered
    count: int = 2
    replicas: list[Replica] = field(default_factory=list)
    #: Replicas taken out of the endpoints (being replaced or deleted).
    terminating: set[str] = field(default_factory=set)
    target: Replica | None = None
    #: How many users asked for the webhooks (``webhooks()``); registered while above 0.
    users: int = 0
    history: list[Endpoint] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._error = None
        for _ in range(self.count):
            self.replicas.append(self.launcher())
        for replica in self.replicas:
            replica.wait_ready()
        self._thread = threading.Thread(target=self._follow, name="endpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Every replica stopped as a pod is deleted (each must exit 0 within its grace
        period), the webhooks unregistered first; the containers removed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        # Unregistered before the replicas go, as their Service would lose its endpoints.
        unregister_webhooks(self.admin_kubeconfig, self.rendered)
        self.target = None
        codes = {r.name: r.stop() for r in self.replicas if r.running()}
        logs = {r.name: r.log_text()[-3000:] for r in self.replicas}
        self.replicas.clear()
        self.terminating.clear()
        self.launcher.remove_all()
        failed = {name: code for name, code in codes.items() if code != 0}
        assert not failed, f"replicas exited non-zero on SIGTERM {failed}: " + "\n".join(
            logs[name] for name in failed
        )

    @contextmanager
    def serving(self) -> Iterator[None]:
        """The replicas running and the webhooks registered for the block, started for the
        first block and stopped after the last: the e2e suite's ``E2E_OPERATOR=podman``
        mode, where a module that asks for the operator gets it and the others (the CRDs'
        own rules, policies that must hold with no operator) run without one, as with
        process replicas."""
        with self._shared(self._serve_first, self.stop):
            yield

    def _serve_first(self) -> None:
        self.start()
        self._register()

    def _register(self) -> None:
        self._point()
        wait_for("the webhooks to be registered", lambda: self._error or self.target)
        self.check()

    def _unregister(self) -> None:
        with self._lock:
            self.target = None
            self.history.append(Endpoint(time.monotonic(), ""))
        unregister_webhooks(self.admin_kubeconfig, self.rendered)

    @contextmanager
    def _shared(self, first: Callable[[], None], last: Callable[[], None]) -> Iterator[None]:
        """A block nested blocks share: ``first`` as the first one starts, ``last`` as the
        last one ends (``users`` counts them)."""
        with self._lock:
            self.users += 1
            starting = self.users == 1
        try:
            if starting:
                first()
            yield
        finally:
            with self._lock:
                self.users -= 1
                ending = self.users == 0
            if ending:
                last()

    # ---- the endpoints --------------------------------------------------------------------
    def ready(self) -> list[Replica]:
        """The replicas whose /readyz answers 200, not being taken out, oldest first."""
        with self._lock:
            candidates = [r for r in self.replicas if r.name not in self.terminating]
        return [r for r in candidates if r.probe()]

    @contextmanager
    def webhooks(self) -> Iterator[None]:
        """The webhook configurations registered, pointed at a ready replica, for the block
        (as ``harness.webhooks`` registers them while a process replica serves: tests that
        ask for no webhooks run without them). Nested blocks share the registration."""
        with self._shared(self._register, self._unregister):
            yield

    def _point(self) -> None:
        ready = self.ready()
        with self._lock:
            if not self.users:
                return
            current = self.target
            if current is not None and current in ready:
                return
            chosen = ready[0] if ready else None
            if chosen is None and current is None:
                return
            if chosen is not None:
                register_webhooks(self.admin_kubeconfig, self.rendered, chosen.ports()["webhooks"])
            self.target = chosen
            self.history.append(Endpoint(time.monotonic(), chosen.name if chosen else ""))

    def _follow(self) -> None:
        while not self._stop.wait(PROBE_SECONDS):
            try:
                self._point()
            except Exception as exc:  # reported by check(), never swallowed
                self._error = exc
                return

    def check(self) -> None:
        """Fail if the endpoints thread died."""
        if self._error is not None:
            raise AssertionError(f"the endpoints thread failed: {self._error!r}")

    def endpoint(self) -> str:
        with self._lock:
            return self.target.name if self.target else ""

    # ---- what a test does to the pods ---------------------------------------------------
    def take_out(self, replica: Replica) -> None:
        """Remove ``replica`` from the endpoints (the pod is being deleted) and wait until the
        webhook configurations point elsewhere."""
        with self._lock:
            self.terminating.add(replica.name)
        wait_for(
            f"the webhooks to point away from {replica.name}",
            lambda: self._repointed(replica),
            timeout=30,
        )

    def _repointed(self, replica: Replica) -> bool:
        self.check()
        return self.endpoint() not in ("", replica.name)

    def add(self, image: str | None = None) -> Replica:
        """A new replica (the ReplicaSet's new pod), once ready; the endpoints may use it."""
        new = self.launcher(image=image)
        with self._lock:
            self.replicas.append(new)
        new.wait_ready()
        return new

    def retire(self, old: Replica) -> None:
        """Delete a pod: out of the endpoints first, then stopped within its grace period;
        it must exit 0."""
        self.take_out(old)
        code = old.stop()
        assert code == 0, f"{old.name} exited {code} on SIGTERM:\n{old.log_text()[-3000:]}"
        with self._lock:
            self.replicas.remove(old)
            self.terminating.discard(old.name)

    def replace(self, old: Replica, image: str | None = None) -> Replica:
        """One step of a rolling update (maxSurge 1, maxUnavailable 0): a new replica, ready;
        then the old one retired."""
        new = self.add(image)
        self.retire(old)
        return new

    def kill(self, replica: Replica) -> None:
        """SIGKILL the container (no Lease released); the endpoints notice by its probe."""
        replica.kill()
        with self._lock:
            self.replicas.remove(replica)

    def leader(self, api: pykube.HTTPClient) -> Replica | None:
        lease = Lease.objects(api, namespace=self.rendered.namespace).get_or_none(
            name=names.LEADER_LEASE
        )
        holder = str(((lease.obj.get("spec") or {}) if lease else {}).get("holderIdentity", ""))
        with self._lock:
            return next((r for r in self.replicas if holder.startswith(f"{r.name}_")), None)

    def log_tails(self, lines: int = 40) -> list[tuple[str, str]]:
        with self._lock:
            running = [r for r in self.replicas if r.running()]
        return [
            (f"container {r.name}: last log lines", "\n".join(r.log_text().splitlines()[-lines:]))
            for r in running
        ]


#: The replica sets running now (for the report of a failed test).
RUNNING: list[Replicas] = []


def log_tails(lines: int = 40) -> list[tuple[str, str]]:
    """``(title, text)``: the last log lines of every container of every running set."""
    return [tail for replicas in RUNNING for tail in replicas.log_tails(lines)]


@contextmanager
def podman_replicas(
    launcher: Launcher, admin_kubeconfig: Path, rendered: deployment.Rendered, count: int = 2
) -> Iterator[Replicas]:
    """``count`` replicas of the image serving, with the endpoints thread; all removed after."""
    replicas = Replicas(launcher, admin_kubeconfig, rendered, count)
    RUNNING.append(replicas)
    try:
        replicas.start()
        yield replicas
    finally:
        RUNNING.remove(replicas)
        replicas.stop()
