"""``make up OPERATOR=image``: the local cluster's operator as two replicas of the image.

The command line ``make up`` and ``make down`` run (``python -m localcluster``), on a
cluster of its own (``E2E_CLUSTER_NAME`` with ``-up``): the replicas start as podman
containers, one holds the Lease, the API server calls their order webhook; ``down``
stops them (each exits 0, as its supervisor logs) and no container is left. When the
supervisor itself is killed, ``down`` still removes the containers by the names it kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from harness.containers import podman
from localcluster.cluster import HACK, REPO, LocalCluster, kubectl, kubectl_binary

CLAIM = """apiVersion: cozystack.io/v1alpha1
kind: GPUClaim
metadata: {name: probe, namespace: default}
spec: {className: no-such-class, count: 1}
"""


def localcluster(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "localcluster", "--name", name, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(HACK)},
    )
    assert proc.returncode == 0, f"localcluster {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def containers() -> set[str]:
    return set(podman("ps", "--all", "--format", "{{.Names}}").split())


@pytest.fixture
def up_cluster(image: str) -> Iterator[LocalCluster]:
    """The cluster's name; whatever the test leaves is stopped by ``down`` afterwards."""
    cluster = LocalCluster(os.environ.get("E2E_CLUSTER_NAME", "image") + "-up")
    try:
        yield cluster
    finally:
        localcluster(cluster.name, "down")


def up(cluster: LocalCluster) -> tuple[str, list[str]]:
    out = localcluster(cluster.name, "up", "--operator=image")
    names: list[str] = json.loads(cluster.image_names.read_text())
    return out, names


def test_up_runs_two_replicas_of_the_image_and_down_removes_them(
    up_cluster: LocalCluster, image: str
) -> None:
    out, names = up(up_cluster)
    print(f"\nmake up OPERATOR=image printed:\n{out}")
    assert len(names) == 2, names
    assert f"gpuoperator (image): 2 replicas of {image} ({', '.join(names)})" in out, out
    assert set(names) <= containers()
    holder = kubectl(
        up_cluster.kubeconfig,
        "-n",
        "gpu-operator-system",
        "get",
        "lease",
        "gpu-operator",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    )
    assert holder.partition("_")[0] in names, holder
    refused = subprocess.run(
        [
            kubectl_binary(),
            f"--kubeconfig={up_cluster.kubeconfig}",
            "create",
            "--dry-run=server",
            "-f",
            "-",
        ],
        input=CLAIM,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert refused.returncode != 0
    assert 'admission webhook "orders.gpu.cozystack.io" denied' in refused.stderr
    assert "spec.className: class no-such-class does not exist" in refused.stderr

    down = localcluster(up_cluster.name, "down")
    print(f"make down printed:\n{down}")
    assert down.startswith("stopped gpuoperator (image), "), down
    assert "removed containers" not in down, down
    assert not set(names) & containers()
    assert "stopped: every replica exited 0" in up_cluster.image_operator.log.read_text()


def test_down_removes_the_containers_of_a_killed_supervisor(up_cluster: LocalCluster) -> None:
    _, names = up(up_cluster)
    pid = up_cluster.image_operator.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert set(names) <= containers(), "the containers went with their supervisor"
    down = localcluster(up_cluster.name, "down")
    print(f"\nmake down after the supervisor was killed printed:\n{down}")
    assert f"removed containers left running: {', '.join(names)}" in down, down
    assert not set(names) & containers()
