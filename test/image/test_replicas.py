"""Two replicas of the image, as the Deployment runs them, under a stream of orders.

The replicas are podman containers with the Deployment's settings (``harness.containers``),
the webhooks pointed at a ready one by the endpoints thread of ``harness.replicas`` (the
Service's part). While a tenant keeps ordering one GPU at a time, a replica's container is
killed (SIGKILL: the Lease is not released) and, later, both replicas are replaced one at a
time by a new tag of the image (a rolling update with maxSurge 1, maxUnavailable 0). Every
order must be admitted (capacity suffices: a refusal is a failure) and end Bound; the Lease
must pass to a surviving replica. A call the API server could not make to a webhook (the
replica it pointed at just died) comes back as an error without a decision: the tenant's
client retries it, as a tenant's tooling would (``chaos.load.place``), and the retries are
printed with the orders and the handover times.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pykube
import pytest
from chaos.load import Outcome, Tally, place

from gpuoperator.kinds import GPUClaim
from harness import kube
from harness.containers import Launcher, podman
from harness.fleet import Fleet, published
from harness.replicas import Replicas, podman_replicas
from harness.waiting import wait_for
from localcluster import deployment
from localcluster.cluster import LocalCluster

#: Units per simulated node: more than the orders a test places, so none is refused.
UNITS = 200
#: Between two orders of the stream (a rate, not a wait for anything).
ORDER_EVERY = 0.25


@pytest.fixture(scope="module")
def replicas(
    image: str,
    cluster: LocalCluster,
    rendered: deployment.Rendered,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    launcher = Launcher(
        image, cluster, rendered, tmp_path_factory.mktemp("replicas"), prefix="gpu-operator"
    )
    with (
        podman_replicas(launcher, cluster.kubeconfig, rendered, count=2) as running,
        running.webhooks(),
    ):
        yield running


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> pykube.HTTPClient:
    return kube.client(cluster.kubeconfig)


@pytest.fixture(scope="module")
def gpu_class(api: pykube.HTTPClient, replicas: Replicas) -> Iterator[str]:
    """A class on two simulated nodes of ``UNITS`` units each, published by the leader."""
    fleet = Fleet(api)
    cls = fleet.gpu_class()
    fleet.node(UNITS)
    fleet.node(UNITS)
    published(api, cls, UNITS, timeout=60)
    yield cls
    fleet.cleanup()


@pytest.fixture
def tenant(api: pykube.HTTPClient) -> Iterator[str]:
    name = f"tenant-{uuid.uuid4().hex[:6]}"
    ns = pykube.Namespace(api, {"metadata": {"name": name}})
    ns.create()
    yield name
    ns.delete()


@dataclass
class Stream:
    """A tenant ordering one GPU every ``ORDER_EVERY`` seconds from its own thread."""

    api: pykube.HTTPClient
    namespace: str
    class_name: str
    orders: list[tuple[float, Outcome]] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Stream:
        self._thread = threading.Thread(target=self._run, name="orders", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(120)

    def _run(self) -> None:
        client = pykube.HTTPClient(self.api.config, timeout=30)
        n = 0
        while not self._stop.is_set():
            outcome = Outcome(self.namespace, f"order-{n:04d}", self.class_name, 1)
            self.orders.append((time.monotonic(), place(client, outcome, self.tally)))
            n += 1
            self._stop.wait(ORDER_EVERY)

    def admitted_since(self, moment: float) -> int:
        return sum(1 for at, o in self.orders if at >= moment and o.placed)

    def report(self) -> str:
        placed = sum(o.placed for _, o in self.orders)
        refused = [o.refusal for _, o in self.orders if not o.placed]
        return (
            f"orders: {len(self.orders)} placed by the tenant, {placed} admitted, "
            f"{len(refused)} refused, {self.tally.retries} calls retried (no decision)"
        )

    def check(self, api: pykube.HTTPClient) -> None:
        """None refused, none lost, none stuck: every order exists and ends Bound to a node."""
        refused = [f"{o.name}: {o.refusal}" for _, o in self.orders if not o.placed]
        assert refused == [], refused
        assert self.tally.errors == [], self.tally.errors
        wanted = {o.name for _, o in self.orders}

        def unbound() -> set[str]:
            claims = GPUClaim.objects(api, namespace=self.namespace)
            bound = {
                c.name
                for c in claims
                if (c.obj.get("status") or {}).get("phase") == "Bound"
                and (c.obj.get("status") or {}).get("nodeName")
            }
            return wanted - bound

        left = wait_for(
            f"the {len(wanted)} orders to be Bound",
            unbound,
            until=lambda missing: not missing,
            timeout=120,
        )
        assert not left


@dataclass
class LeaseWatch:
    """The leader Lease's holder, polled from a thread: each change with its time."""

    replicas: Replicas
    api: pykube.HTTPClient
    changes: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LeaseWatch:
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        client = pykube.HTTPClient(self.api.config, timeout=10)
        while not self._stop.wait(0.1):
            leader = self.replicas.leader(client)
            holder = leader.name if leader else ""
            if not self.changes or self.changes[-1][1] != holder:
                self.changes.append((time.monotonic(), holder))

    def taken_over(self, old: str, since: float) -> float:
        """Seconds from ``since`` until a replica other than ``old`` held the Lease."""
        at = wait_for(
            f"a replica other than {old} to hold the Lease",
            lambda: next((t for t, h in self.changes if t >= since and h not in ("", old)), None),
            until=lambda t: t is not None,
            timeout=90,
        )
        assert at is not None
        return float(at - since)


def admitted_four(stream: Stream, since: float) -> bool:
    return stream.admitted_since(since) >= 4


def current_leader(replicas: Replicas, api: pykube.HTTPClient) -> str:
    leader = wait_for("a replica to hold the Lease", lambda: replicas.leader(api), timeout=60)
    assert leader is not None
    return leader.name


def test_a_killed_replica_hands_the_lease_over_while_orders_keep_being_bound(
    replicas: Replicas, api: pykube.HTTPClient, gpu_class: str, tenant: str
) -> None:
    leader = current_leader(replicas, api)
    victim = next(r for r in replicas.replicas if r.name == leader)
    served_by_victim = replicas.endpoint() == victim.name
    with LeaseWatch(replicas, api) as lease, Stream(api, tenant, gpu_class) as stream:
        wait_for("the stream's first orders", lambda: stream.admitted_since(0) >= 4, timeout=60)
        killed = time.monotonic()
        replicas.kill(victim)
        handover = lease.taken_over(victim.name, killed)
        admitted_leaderless = stream.admitted_since(killed)
        # The Deployment's ReplicaSet makes a new pod for the dead one.
        replacement = replicas.add()
        back = time.monotonic()
        wait_for("orders after the replacement", lambda: stream.admitted_since(back) >= 4)
    replicas.check()
    print(
        f"\nkill: {victim.name} (leader{', webhook endpoint' if served_by_victim else ''}) "
        f"killed; the Lease passed to {lease.changes[-1][1]} in {handover:.1f}s; "
        f"{admitted_leaderless} orders admitted between the kill and the handover; "
        f"replacement {replacement.name}; {stream.report()}"
    )
    assert admitted_leaderless > 0, "no order was admitted while the Lease had no live holder"
    stream.check(api)
    assert replicas.leader(api) is not None


def test_a_killed_webhook_endpoint_is_taken_out_by_its_probe_and_orders_go_on(
    replicas: Replicas, api: pykube.HTTPClient, gpu_class: str, tenant: str
) -> None:
    """The replica the webhooks point at dies: its /readyz stops answering, the endpoints
    move to the other ready replica, and the calls that failed meanwhile were retried by
    the tenant's client, none refused."""
    victim = next(r for r in replicas.replicas if r.name == replicas.endpoint())
    with Stream(api, tenant, gpu_class) as stream:
        wait_for("the stream's first orders", lambda: stream.admitted_since(0) >= 4, timeout=60)
        killed = time.monotonic()
        replicas.kill(victim)
        wait_for(
            f"the webhooks to point away from {victim.name}",
            lambda: replicas.endpoint() not in ("", victim.name),
            timeout=30,
        )
        moved = time.monotonic() - killed
        after = time.monotonic()
        wait_for("orders after the move", functools.partial(admitted_four, stream, after))
        replacement = replicas.add()
    replicas.check()
    print(
        f"\nendpoint kill: {victim.name} killed; the webhooks pointed at "
        f"{replicas.endpoint()} {moved:.1f}s later; replacement {replacement.name}; "
        f"{stream.report()}"
    )
    stream.check(api)


def test_a_rolling_update_loses_no_order_and_leaves_no_claim_stuck(
    replicas: Replicas,
    api: pykube.HTTPClient,
    gpu_class: str,
    tenant: str,
    image: str,
    cluster: LocalCluster,
    rendered: deployment.Rendered,
) -> None:
    new_tag = f"{image}-update-{uuid.uuid4().hex[:4]}"
    podman("tag", image, new_tag)
    handovers: list[str] = []
    try:
        with LeaseWatch(replicas, api) as lease, Stream(api, tenant, gpu_class) as stream:
            wait_for("the stream's first orders", lambda: stream.admitted_since(0) >= 4, timeout=60)
            for old in list(replicas.replicas):
                leading = current_leader(replicas, api) == old.name
                new = replicas.add(image=new_tag)
                stopped = time.monotonic()
                replicas.retire(old)
                if leading:
                    took = lease.taken_over(old.name, stopped)
                    handovers.append(f"{old.name} -> {lease.changes[-1][1]} in {took:.1f}s")
                after = time.monotonic()
                wait_for(
                    f"orders admitted after {old.name} went",
                    functools.partial(admitted_four, stream, after),
                )
                assert new.running()
        replicas.check()
        print(f"\nrolling update to {new_tag}: handovers {handovers}; {stream.report()}")
        stream.check(api)
        images = {
            podman("inspect", "--format", "{{.ImageName}}", r.name).strip()
            for r in replicas.replicas
        }
        assert images == {new_tag}
        assert handovers, f"the leader was never replaced: {lease.changes}"
        leader = replicas.leader(api)
        assert leader is not None
        assert leader in replicas.replicas
        _, refused = cluster.forbidden(rendered.username, 0)
        assert refused == [], refused
    finally:
        podman("untag", new_tag, new_tag, check=False)
