"""The operator deployed in the cluster (``E2E_OPERATOR=deployed``, users' CI on kind),
running only while a module asks for it, as in the other modes.

The Deployment always runs on kind, but many e2e modules assume no operator at all: the
CRDs' own rules (the order webhook would refuse their claims of classes that do not
exist), the policies that must hold with none, controllers of the suite's own run
in-process (the license copier, the tamper policy) that the leader's would race. So the
session scales the Deployment to 0 and removes its webhook configurations (they fail
closed: with no endpoint every call would be refused); a block that asks for the operator
(``serving``, what ``harness.webhooks.webhook_operator`` opens for a module's ``hooks``)
applies the configurations as rendered (their Service reference; the operator injects
their caBundle), scales it back to its replicas and waits for the rollout; the last block
to end takes it out again, the configurations first (as the Service loses its endpoints),
then the pods, waited for until gone. At the end of the session the Deployment is left as
it was found: its replicas, its webhooks registered.

Every change goes through ``kubectl`` (``run``: the pinned kubectl on a kubeconfig, or a
fake in the unit tests), so the same path runs against kind and against the local control
plane, where kwok plays the kubelet of the Deployment's pods.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.waiting import wait_for
from localcluster import deployment

#: ``run(kubeconfig, *args, stdin=None) -> stdout`` (``localcluster.cluster.kubectl``).
Kubectl = Callable[..., str]


@dataclass
class Change:
    """One change of the operator's presence, with how long it took."""

    replicas: int
    seconds: float


@dataclass
class ScaledDeployment:
    """The rendered Deployment in the cluster at ``kubeconfig``, scaled on demand."""

    kubeconfig: Path
    rendered: deployment.Rendered
    run: Kubectl
    #: How many replicas serve (the count the Deployment was found with, ``adopt``).
    replicas: int = 0
    timeout: float = 300
    users: int = 0
    changes: list[Change] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return str(self.rendered.deployment["metadata"]["name"])

    @property
    def selector(self) -> str:
        labels = self.rendered.deployment["spec"]["selector"]["matchLabels"]
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.run(self.kubeconfig, "-n", self.rendered.namespace, *args, stdin=stdin)

    # ---- the session ------------------------------------------------------------------------
    def adopt(self) -> None:
        """Read the Deployment's replicas (what ``serving`` scales back to) and take the
        operator out until a block asks for it."""
        spec = json.loads(self._kubectl("get", "deployment", self.name, "-o", "json"))["spec"]
        self.replicas = int(spec.get("replicas", 1))
        assert self.replicas > 0, (
            f"deployment {self.name} has spec.replicas {self.replicas}: the suite needs the "
            "operator deployed with at least one replica (make e2e-kind deploys two)"
        )
        self.absent()

    def restore(self) -> None:
        """Leave the Deployment as ``adopt`` found it (its replicas, webhooks registered)."""
        if self.users == 0:
            self.present()

    # ---- the blocks -------------------------------------------------------------------------
    @contextmanager
    def serving(self) -> Iterator[None]:
        """The operator running for the block: the first block scales it up and waits for
        its rollout, the last one to end scales it to 0 and waits for its pods to go."""
        with self._lock:
            self.users += 1
            first = self.users == 1
        try:
            if first:
                self.present()
            yield
        finally:
            with self._lock:
                self.users -= 1
                last = self.users == 0
            if last:
                self.absent()

    def present(self) -> None:
        """Register the webhooks as rendered, scale to ``replicas``, wait for the rollout."""
        start = time.monotonic()
        docs = self.rendered.webhook_configurations
        if docs:
            self.run(
                self.kubeconfig,
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                "-",
                stdin=yaml.safe_dump_all(docs),
            )
        self._kubectl("scale", f"deployment/{self.name}", f"--replicas={self.replicas}")
        self._kubectl(
            "rollout", "status", f"deployment/{self.name}", f"--timeout={self.timeout:.0f}s"
        )
        self.changes.append(Change(self.replicas, time.monotonic() - start))

    def absent(self) -> None:
        """Remove the webhooks, scale to 0, wait until no pod of the Deployment is left."""
        start = time.monotonic()
        for config in self.rendered.webhook_configurations:
            self.run(
                self.kubeconfig,
                "delete",
                config["kind"],
                config["metadata"]["name"],
                "--ignore-not-found",
            )
        self._kubectl("scale", f"deployment/{self.name}", "--replicas=0")
        wait_for(
            f"the pods of deployment {self.name} to be gone",
            self.pods,
            until=lambda pods: not pods,
            timeout=self.timeout,
        )
        self.changes.append(Change(0, time.monotonic() - start))

    def pods(self) -> list[str]:
        """The names of the Deployment's pods (terminating ones included)."""
        out = self._kubectl("get", "pods", "-l", self.selector, "-o", "name")
        return out.split()
