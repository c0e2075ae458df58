"""Chaos fixtures: a control plane of its own, two operator replicas
behind one webhook address, the KubeVirt stand-in, and a record of every GPUClaim version
read from etcd for the whole package.

The product is deployed from ``config/overlays/dev`` and its replicas run as the Deployment's
container under its ServiceAccount (``chaos.replicas``); after every test the API server's
audit log must show no request of that account refused with 403.

The suite always starts its own local control plane (``CHAOS_CLUSTER_NAME``, default
``chaos``): it restarts kube-apiserver and compacts etcd, which it must not do to a cluster
it was merely given. It is started for this package only and stopped when the package is
done, so it never runs beside the e2e suite's cluster.

``CHAOS_SIZE`` picks the load: ``bounded`` (default; the form ``make test`` runs) or
``full`` (``make chaos``). The figures each test measured are printed at the end of the
session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pykube
import pytest

from chaos import history as historymod
from chaos import store
from chaos.replicas import Replicas
from harness import dra_driver, kube
from localcluster.cluster import KUBEVIRT_CRDS, LocalCluster

PROFILE = Path(__file__).parent / "cluster.yaml"

FIGURES: list[str] = []


@dataclass(frozen=True)
class Sizes:
    name: str
    orders: int
    burst: int
    burst_interval: float
    vms: int
    vm_parallel: int
    #: Leader kills during R1; ``None``: until the load ends.
    kills: int | None
    kill_interval: float = 10.0


SIZES = {
    "bounded": Sizes(
        "bounded", orders=300, burst=25, burst_interval=5.0, vms=10, vm_parallel=3, kills=3
    ),
    "full": Sizes(
        "full", orders=2000, burst=25, burst_interval=5.0, vms=50, vm_parallel=4, kills=None
    ),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.chaos)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in FIGURES:
        terminalreporter.write_line(f"chaos: {line}")


@pytest.fixture(scope="session")
def sizes() -> Sizes:
    name = os.environ.get("CHAOS_SIZE", "bounded")
    if name not in SIZES:
        raise pytest.UsageError(f"CHAOS_SIZE={name!r}: {' or '.join(SIZES)} are allowed")
    return SIZES[name]


@pytest.fixture(scope="package")
def chaos_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(os.environ.get("CHAOS_CLUSTER_NAME", "chaos"))
    took = cluster.up(PROFILE, crds=[KUBEVIRT_CRDS], log=lambda _msg: None)
    FIGURES.append(f"cluster started in {took:.1f}s")
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="package")
def api(chaos_cluster: LocalCluster) -> pykube.HTTPClient:
    return kube.client(chaos_cluster.kubeconfig)


@pytest.fixture(scope="package")
def etcd(chaos_cluster: LocalCluster) -> store.Etcd:
    return store.Etcd(f"http://127.0.0.1:{chaos_cluster.ports().etcd}")


@pytest.fixture(scope="package")
def history(etcd: store.Etcd) -> Iterator[historymod.ClaimHistory]:
    """Every GPUClaim and ResourceClaim version from now on, from etcd (see
    ``chaos.store``)."""
    record = historymod.ClaimHistory()
    watch = etcd.watch(
        "/registry/",
        etcd.revision() + 1,
        record.on_events,
        wanted=record.wanted,
        decode=record.decode,
    )
    record.watch = watch
    try:
        yield record
    finally:
        watch.stop()


@pytest.fixture(scope="package")
def replicas(
    chaos_cluster: LocalCluster,
    api: pykube.HTTPClient,
    tmp_path_factory: pytest.TempPathFactory,
    history: historymod.ClaimHistory,
) -> Iterator[Replicas]:
    pair = Replicas(chaos_cluster, api, tmp_path_factory.mktemp("replicas"))
    try:
        pair.up()
        yield pair
    finally:
        pair.close()


@pytest.fixture(scope="package")
def dra_driver_client(api: pykube.HTTPClient) -> Iterator[pykube.HTTPClient]:
    """A client acting as a DRA driver's ServiceAccount (it may manage ResourceSlices and
    nothing else), for the package: the slices a test publishes stay until the end, as its
    nodes and claims do."""
    namespace = "chaos-dra-driver"
    pykube.Namespace(api, {"metadata": {"name": namespace}}).create()
    dra_driver.install_account(api, namespace)
    yield dra_driver.driver_client(api, namespace)
    dra_driver.uninstall_account(api, namespace)


@pytest.fixture(autouse=True)
def no_forbidden_requests(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each chaos test: the API server refused no request of the operator's
    ServiceAccount (403) under the faults, read from its audit log: the shipped RBAC held."""
    if "replicas" not in request.fixturenames:
        yield
        return
    pair: Replicas = request.getfixturevalue("replicas")
    pair.forbidden.take()
    yield
    refused = pair.forbidden.take()
    if refused:
        pytest.fail(
            f"the API server refused {len(refused)} requests of the operator (403): "
            + "; ".join(sorted(set(refused))[:20]),
            pytrace=False,
        )


@pytest.fixture(scope="package")
def kubevirt(api: pykube.HTTPClient) -> Iterator[object]:
    from harness.kubevirt import KubeVirtSimulator, controller_client

    simulator = KubeVirtSimulator(controller_client(api))
    simulator.start()
    try:
        yield simulator
    finally:
        simulator.stop()
