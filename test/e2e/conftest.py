"""E2E fixtures: a real control plane for the session, the product deployed on it, a fresh
namespace per test, the test's fleet of nodes and objects, and a webhook-serving operator per
module (``hooks``).

Nothing here mocks the API server. Without ``E2E_KUBECONFIG`` the session starts the local
control plane (``hack/localcluster``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with the default simulated GPU nodes) and stops it at the end; with
it, the suite runs against that cluster (kind included). ``E2E_CLUSTER_NAME`` (default
``e2e``) names the local cluster, so two runs can coexist.

Either way the session renders ``config/overlays/dev`` with the kustomize built into the
pinned kubectl and server-side-applies it (``deployed``): CRDs, namespace, RBAC, the
Deployment (at 0 replicas: its args and env are what the suite's replicas run with), PDB,
Services, settings, the certificate Secret, the tamper policy and its binding; the webhook
configurations are applied while a replica serves them (``harness.webhooks``). Replicas
authenticate with a token of the rendered ServiceAccount, and after every test the API
server's audit log must show no request of that account answered 403.

``E2E_OPERATOR`` says which operator the suite tests: ``process`` (default) starts replicas
of this checkout as processes, per module or test; ``deployed`` uses the operator deployed in
an ``E2E_KUBECONFIG`` cluster (kind); ``podman`` runs ``E2E_REPLICAS`` (default 2) replicas
of the built image (``IMAGE``, as for ``make image``) as podman containers with the
Deployment's settings against the local control plane, the webhooks pointed at a ready one
(``harness.replicas``), wherever process mode would start the module's webhook-serving
operator (``hooks``, ``harness.webhooks.webhook_operator``). In ``deployed`` mode the
cluster's Deployment is scaled to 0 with its webhooks removed, and scaled back (its rollout
waited for) only where process mode would start that operator (``harness.scaled``), so the
modules that assume no operator run without one there too. In the last two, tests marked
``operator_process`` are deselected at collection (the reason is printed after it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pluggy
import pykube
import pytest

from harness import kube
from harness.containers import Launcher, MissingPrerequisiteError, image_name, require_image
from harness.fleet import Fleet
from harness.operator import Deployed, ForbiddenRequests, OperatorProcess, Start
from harness.replicas import RUNNING, Replicas
from harness.scaled import ScaledDeployment
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, webhook_operator
from localcluster import deployment
from localcluster.cluster import (
    KUBEVIRT_CRDS,
    REPO,
    LocalCluster,
    deploy_to,
    kubectl,
    kubectl_binary,
    wait_servable,
)

TEST_CRDS = KUBEVIRT_CRDS
KIND_OVERLAY = REPO / "config" / "overlays" / "kind"
OPERATOR = os.environ.get("E2E_OPERATOR", "process")
if OPERATOR not in ("process", "deployed", "podman"):
    raise pytest.UsageError(f"E2E_OPERATOR={OPERATOR}: one of process, deployed, podman")
#: ``E2E_OPERATOR=deployed`` (with ``E2E_KUBECONFIG``): use the operator deployed in the
#: cluster instead of starting replicas (tests marked ``operator_process`` are deselected).
#: ``E2E_OPERATOR=podman``: the session's replicas of the image serve (the same for the
#: tests: an operator the suite does not control process by process).
IN_CLUSTER = OPERATOR != "process"
PODMAN = OPERATOR == "podman"
PROFILE = REPO / "hack" / "profiles" / "default.yaml"

_timings: dict[str, float] = {}


#: Why tests marked ``operator_process`` are deselected under an in-cluster operator.
DESELECTED_REASON = (
    f"E2E_OPERATOR={OPERATOR}: deselected the tests marked operator_process (they start or "
    "control the operator's own processes; the suite uses replicas it does not control)"
)
_deselected: list[pytest.Item] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the e2e tests; with an in-cluster operator, deselect (never skip) those that
    must control the operator's process: they are not run, and the report says why."""
    here = Path(__file__).parent
    keep, drop = [], []
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.e2e)
            if IN_CLUSTER and item.get_closest_marker("operator_process"):
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        _deselected.extend(drop)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_collectionfinish() -> list[str]:
    return [f"{DESELECTED_REASON}: {len(_deselected)}"] if _deselected else []


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    """The control plane this session started, or None under ``E2E_KUBECONFIG``."""
    if os.environ.get("E2E_KUBECONFIG"):
        yield None
        return
    cluster = LocalCluster(os.environ.get("E2E_CLUSTER_NAME", "e2e"))
    took = cluster.up(PROFILE, crds=[TEST_CRDS], log=lambda _msg: None)
    _timings["cluster start"] = took
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)


def wait_published(kubeconfig: Path, timeout: float = 60) -> None:
    """Wait until the API server publishes every CRD's schema in its OpenAPI v3: the
    MutatingAdmissionPolicy that sets the claim-protection finalizer patches a GPUClaim
    through that schema, and until it is there a create is refused with 503 ("Resource kind
    ... not found"), which a first test right after the deployment can meet."""
    crds = json.loads(kubectl(kubeconfig, "get", "crd", "-o", "json"))["items"]
    for crd in crds:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        prefix = ".".join(reversed(group.split(".")))
        for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served")):
            path = f"/openapi/v3/apis/{group}/{version}"
            wanted = f'"{prefix}.{version}.{kind}"'
            wait_for(
                f"the API server to publish the schema of {kind} ({group}/{version})",
                lambda path=path: kubectl(kubeconfig, "get", "--raw", path),  # type: ignore[misc]
                lambda body, wanted=wanted: wanted in body,  # type: ignore[misc]
                timeout=timeout,
            )


@pytest.fixture(scope="session")
def deployed(
    local_cluster: LocalCluster | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    """``config/overlays/dev`` rendered and applied; a token of its ServiceAccount. With
    ``E2E_OPERATOR=podman``, the replicas of the image (started where a module asks for
    the operator)."""
    if local_cluster is not None:
        admin = local_cluster.kubeconfig
    else:
        admin = Path(os.environ["E2E_KUBECONFIG"])
        kubectl(admin, "apply", "--server-side", "--force-conflicts", "-k", str(TEST_CRDS))
        kubectl(admin, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    if IN_CLUSTER and not PODMAN:
        # The operator runs in the cluster, deployed from the kind overlay by whoever made
        # the cluster (make e2e-kind): read its names, deploy nothing.
        rendered = deployment.render(kubectl_binary(), KIND_OVERLAY)
    else:
        rendered = deployment.render(kubectl_binary())
        start = time.monotonic()
        deploy_to(admin, rendered, log=lambda _msg: None)
        wait_servable(admin)
        wait_published(admin)
        _timings["deploying config/overlays/dev"] = time.monotonic() - start
    token = deployment.token_kubeconfig(
        kubectl_binary(), admin, rendered, tmp_path_factory.mktemp("operator") / "kubeconfig"
    )
    found = Deployed(rendered, admin, token, local_cluster, in_cluster=IN_CLUSTER)
    if IN_CLUSTER and not PODMAN:
        # Running only while a module asks for it, as in the other modes (harness.scaled);
        # left with its replicas and webhooks at the end.
        scaled = ScaledDeployment(admin, rendered, kubectl)
        scaled.adopt()
        try:
            yield dataclasses.replace(found, scaled=scaled)
        finally:
            scaled.restore()
        return
    if not PODMAN:
        yield found
        return
    if local_cluster is None:
        pytest.fail(
            "E2E_OPERATOR=podman runs the image against the local control plane: unset "
            "E2E_KUBECONFIG (make e2e-image)",
            pytrace=False,
        )
    with _image_replicas(found, local_cluster, tmp_path_factory) as replicas:
        yield dataclasses.replace(found, replicas=replicas)


@contextmanager
def _image_replicas(
    found: Deployed, cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    try:
        image = require_image(image_name())
    except MissingPrerequisiteError as exc:
        pytest.fail(f"E2E_OPERATOR=podman: {exc}", pytrace=False)
    count = int(os.environ.get("E2E_REPLICAS", "2"))
    launcher = Launcher(
        image, cluster, found.rendered, tmp_path_factory.mktemp("image"), prefix="gpu-operator"
    )
    replicas = Replicas(launcher, found.admin_kubeconfig, found.rendered, count)
    RUNNING.append(replicas)
    try:
        yield replicas
    finally:
        RUNNING.remove(replicas)


@pytest.fixture(scope="session")
def kubeconfig(deployed: Deployed) -> Path:
    """The cluster admin's kubeconfig (for tests; the operator's replicas use a token)."""
    return deployed.admin_kubeconfig


@pytest.fixture(scope="session")
def forbidden_requests(deployed: Deployed) -> ForbiddenRequests:
    return ForbiddenRequests(deployed)


@pytest.fixture(autouse=True)
def no_forbidden_requests(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each e2e test: the API server answered no request of the operator's
    ServiceAccount with 403 since the previous check. Module fixtures' replicas start
    before this fixture's setup; what a module's teardown did shows at the next test. On a
    cluster other than the local control plane the audit log is not ours to read."""
    if "kubeconfig" not in request.fixturenames and "deployed" not in request.fixturenames:
        yield
        return
    check: ForbiddenRequests = request.getfixturevalue("forbidden_requests")
    yield
    refused = check.take()
    if refused:
        pytest.fail(
            f"the API server refused {len(refused)} requests of {check.username} (403): "
            + "; ".join(sorted(set(refused))[:20]),
            pytrace=False,
        )


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


@pytest.fixture
def fleet(api: pykube.HTTPClient) -> Iterator[Fleet]:
    """The nodes and objects a test makes through ``Fleet``, removed after it. A module whose
    fleet needs its operator running overrides this with one that also asks for it."""
    f = Fleet(api)
    yield f
    f.cleanup()


@pytest.fixture(scope="module")
def hooks(
    api: pykube.HTTPClient,
    deployed: Deployed,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[WebhookOperator]:
    """An operator serving the webhooks, for the module (its files under a directory named
    after the module)."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    with webhook_operator(api, deployed, tmp_path_factory.mktemp(name)) as w:
        yield w


@pytest.fixture
def tenant(api: pykube.HTTPClient, hooks: WebhookOperator, kubevirt: object) -> str:
    """A tenant namespace of the module's webhook operator, with the KubeVirt stand-in,
    once the namespace's default ServiceAccount exists."""
    ns = hooks.tenant(api)
    wait_for(
        "the default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=ns).get_or_none(name="default"),
    )
    return ns


@pytest.fixture
def start_operator(
    deployed: Deployed, api: pykube.HTTPClient, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Start]:
    """Start a replica of the operator with extra flags and wait for it to be ready (named
    after the module and counted); each is stopped after the test and the lease released."""
    prefix = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")
    started: list[OperatorProcess] = []

    def start(*extra: str) -> OperatorProcess:
        op = OperatorProcess(deployed, f"{prefix}-{len(started)}", tmp_path, *extra)
        started.append(op)
        op.wait_ready()
        return op

    yield start
    for op in started:
        op.stop()
    deployed.release_lease(api)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for what, seconds in _timings.items():
        terminalreporter.write_line(f"e2e: {what} took {seconds:.1f}s")


@pytest.fixture(scope="session")
def kubevirt_controller(api: pykube.HTTPClient) -> pykube.HTTPClient:
    """A client acting as KubeVirt's controller service account (the setting
    kubevirtServiceAccount): the only one the admission policies let create launcher pods."""
    from harness.kubevirt import controller_client

    return controller_client(api)


#: The hoster's namespace of the test cluster: config/overlays/dev lists it in
#: exemptNamespaces, so the policies that enforce holds leave its plain GPU jobs alone.
HOSTER_NAMESPACE = "gpu-hoster"


@pytest.fixture
def hoster_namespace(api: pykube.HTTPClient) -> Iterator[str]:
    """The exempt hoster namespace, made fresh for the test and deleted (and waited for)
    after it: plain GPU pods (requesting a class's resource without a claim) are a hoster's
    jobs, which only an exempt namespace may run."""
    query = pykube.Namespace.objects(api)
    wait_for(
        f"namespace {HOSTER_NAMESPACE} gone",
        lambda: query.get_or_none(name=HOSTER_NAMESPACE) is None,
        timeout=180,
    )
    pykube.Namespace(
        api, {"metadata": {"name": HOSTER_NAMESPACE, "labels": {"gpuoperator.test/e2e": "true"}}}
    ).create()
    wait_for(
        "the hoster namespace's default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=HOSTER_NAMESPACE).get_or_none(
            name="default"
        ),
    )
    yield HOSTER_NAMESPACE
    query.get(name=HOSTER_NAMESPACE).delete()
    wait_for(
        f"namespace {HOSTER_NAMESPACE} gone",
        lambda: query.get_or_none(name=HOSTER_NAMESPACE) is None,
        timeout=180,
    )


@pytest.fixture(scope="session")
def kubevirt(kubevirt_controller: pykube.HTTPClient) -> Iterator[object]:
    """The KubeVirt stand-in (``harness.kubevirt.KubeVirtSimulator``), running for the session.

    It acts on every VMI in the cluster, so a test that creates VMIs asks for this fixture;
    it yields the simulator (typed ``object`` here: import the class in the test to use it).
    """
    from harness.kubevirt import KubeVirtSimulator

    # It acts as KubeVirt's controller service account: the admission policies let only
    # that account create launcher pods.
    simulator = KubeVirtSimulator(kubevirt_controller)
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
