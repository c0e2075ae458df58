"""Run ``gpuoperator run`` as a real process against the test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from harness.waiting import wait_for
from localcluster import pki
from localcluster.cluster import free_ports


class OperatorProcess:
    """One replica, with its own health and metrics ports and its log in ``log``."""

    def __init__(
        self, kubeconfig: Path, namespace: str, identity: str, log_dir: Path, *extra: str
    ) -> None:
        self.identity = identity
        self.health_port, self.metrics_port, self.webhook_port = free_ports(3)
        self.log = log_dir / f"{identity}.log"
        if not any(a.startswith("--certificates") for a in extra):
            ca_cert, ca_key = pki.new_ca("operator-test-ca")
            certs = pki.write_loopback_serving_pair(ca_cert, ca_key, log_dir / f"{identity}-certs")
            extra = ("--certificates=mounted", f"--webhook-cert-dir={certs}", *extra)
        argv = [
            sys.executable,
            "-m",
            "gpuoperator.cli",
            "run",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--identity={identity}",
            f"--health-address=127.0.0.1:{self.health_port}",
            f"--metrics-address=127.0.0.1:{self.metrics_port}",
            f"--webhook-address=127.0.0.1:{self.webhook_port}",
            "--log-format=json",
            *extra,
        ]
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ},
        )

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(f"{self.identity} to be ready", self._ready_or_dead, timeout=timeout)

    def _ready_or_dead(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.identity} exited with {self.proc.returncode}:\n" + self.log_text()[-3000:]
            )
        return self.ready()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()
