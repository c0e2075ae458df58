"""E2E fixtures: a real control plane for the session, a fresh namespace per test.

Nothing here mocks the API server. Without ``E2E_KUBECONFIG`` the session starts the local
control plane (``hack/localcluster``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with the default simulated GPU nodes) and stops it at the end; with
it, the suite runs against that cluster (kind included) after applying the CRDs.
``E2E_CLUSTER_NAME`` (default ``e2e``) names the local cluster, so two runs can coexist.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from functools import partial
from pathlib import Path

import pluggy
import pykube
import pytest

from harness import kube
from localcluster.cluster import REPO, LocalCluster, kubectl, wait_servable

CRDS = REPO / "config" / "crd"
TEST_CRDS = REPO / "test" / "harness" / "crds"
PROFILE = REPO / "hack" / "profiles" / "default.yaml"

_timings: dict[str, float] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    """The control plane this session started, or None under ``E2E_KUBECONFIG``."""
    if os.environ.get("E2E_KUBECONFIG"):
        yield None
        return
    cluster = LocalCluster(os.environ.get("E2E_CLUSTER_NAME", "e2e"))
    took = cluster.up(PROFILE, crds=[CRDS, TEST_CRDS], log=lambda _msg: None)
    _timings["cluster start"] = took
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: LocalCluster | None) -> Path:
    if local_cluster is not None:
        return local_cluster.kubeconfig
    path = Path(os.environ["E2E_KUBECONFIG"])
    for crds in (CRDS, TEST_CRDS):
        kubectl(path, "apply", "--server-side", "--force-conflicts", "-k", str(crds))
        kubectl(path, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    wait_servable(path)
    return path


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> pykube.HTTPClient:
    return kube.client(kubeconfig)


@pytest.fixture
def namespace(api: pykube.HTTPClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (without waiting) afterwards."""
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    ns = pykube.Namespace(
        api, {"metadata": {"name": name, "labels": {"gpuoperator.test/e2e": "true"}}}
    )
    ns.create()
    yield name
    ns.delete()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for what, seconds in _timings.items():
        terminalreporter.write_line(f"e2e: {what} took {seconds:.1f}s")


@pytest.fixture(scope="session")
def kubevirt(api: pykube.HTTPClient) -> Iterator[object]:
    """The KubeVirt stand-in (``harness.kubevirt.KubeVirtSimulator``), running for the session.

    It acts on every VMI in the cluster, so a test that creates VMIs asks for this fixture;
    it yields the simulator (typed ``object`` here: import the class in the test to use it).
    """
    from harness.kubevirt import KubeVirtSimulator

    simulator = KubeVirtSimulator(api)
    simulator.start()
    try:
        yield simulator
    finally:
        simulator.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, pluggy.Result[None], None]:
    """Right after every e2e test body (before its fixtures clean up): for every node and
    GPU resource, bound claims plus other GPU pods fit the allocatable units. A test that
    overcommits on purpose (pods that bypass the holds) says so with
    ``@pytest.mark.overcommits``."""
    outcome = yield
    if outcome.excinfo is not None or item.get_closest_marker("overcommits"):
        return
    api = getattr(item, "funcargs", {}).get("api")
    if api is None:
        return
    from harness.ledger import overallocations
    from harness.waiting import wait_for

    # Lists may briefly get 429 while the API server refills a CRD's cache: retry them.
    problems = wait_for(
        "the over-allocation check's lists",
        partial(overallocations, api),
        until=lambda _p: True,
        timeout=30,
    )
    if problems:
        outcome.force_exception(AssertionError(f"over-allocated: {problems}"))
