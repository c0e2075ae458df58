"""R3: the control plane fails under the operator while tenants order and release GPUs —
every connection of the replicas to the API server cut, etcd compacted and kube-apiserver
restarted (its fresh watch cache answers the replicas' resumed watches with 410 Gone, and
etcd no longer holds the versions they knew) — and the operator converges: no stuck claim,
no unit held twice, at any stored revision, and both replicas' webhooks judge with what was
made after the faults (a class, a claim), not with a cache the faults left behind."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

import pykube
import requests

from chaos import diagnosis, load, oracle, scene, store
from chaos.conftest import FIGURES, Sizes
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from gpuoperator.kinds import GPUClass
from harness.fleet import Fleet
from harness.waiting import WaitTimeoutError, wait_for
from localcluster.cluster import LocalCluster

SEED = 3


def test_the_operator_converges_through_apiserver_restarts_compaction_and_cut_watches(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    etcd: store.Etcd,
    chaos_cluster: LocalCluster,
    sizes: Sizes,
) -> None:
    rng = random.Random(SEED)  # noqa: S311 - a reproducible load, not a secret
    fleet = Fleet(api)
    cls = fleet.gpu_class(maxCount=4)
    nodes = [fleet.node(8) for _ in range(6)]
    history.classes[cls] = fleet.resource
    for node in nodes:
        history.capacity[(node, fleet.resource)] = 8
    scene.published(api, cls, len(nodes))
    ns = scene.tenant(api, "chaos-r3", False, {})
    total = sizes.orders // 3
    orders = [load.Outcome(ns, f"r3-{i:05d}", cls, rng.randint(1, 4)) for i in range(total)]
    tally = load.Tally()
    clients = load.Clients(api)
    failures: list[str] = []
    done = threading.Event()

    def orders_thread() -> None:
        try:
            for i in range(0, len(orders), sizes.burst):
                started = time.monotonic()
                load.burst(clients, orders[i : i + sizes.burst], tally)
                load.release(clients.get(), ns, 0.7, rng, tally)
                time.sleep(max(0.0, sizes.burst_interval / 2 - (time.monotonic() - started)))
        except Exception as exc:
            failures.append(f"orders: {type(exc).__name__}: {exc}")
        finally:
            done.set()

    relists_before = replicas.log_count('"watch expired; relisting"')
    thread = threading.Thread(target=orders_thread, name="r3-orders", daemon=True)
    thread.start()
    faults: list[str] = []
    rounds = 0
    restart_403 = 0
    while True:
        rounds += 1
        replicas.cut_connections()
        faults.append("connections cut")
        done.wait(2)
        etcd.compact()
        faults.append("etcd compacted")
        chaos_cluster.restart("kube-apiserver", log=lambda _m: None)
        last_restart = time.monotonic()
        faults.append("kube-apiserver restarted")
        # A restarted API server answers 403 until its RBAC caches are filled: those are
        # its own, counted here; any 403 after it is ready fails the test (conftest).
        restart_403 += len(replicas.forbidden.take())
        if (sizes.name == "bounded" and rounds >= 2) or done.wait(3):
            break
    thread.join(timeout=scene.CONVERGE * 2)
    verdict = scene.settle(api, history, tally)
    # What follows (here and in the next test) needs nodes made from now on to be seen by kwok
    # and kube-scheduler, whose watches come back from the last restart after their backoff:
    # not the operator's doing (its convergence is what `settle` judged), so it is awaited.
    probed = scene.control_plane_caught_up(api)
    caught_up = time.monotonic() - last_restart
    # Converged also means every replica's webhooks know what was made after the faults: a
    # class (the order webhook) and a claim (the VMI webhook), each judged by both replicas.
    after = Fleet(api)
    fresh = after.gpu_class("-after", maxCount=4)
    after.node(4)
    history.classes[fresh] = after.resource
    # The class is published before its node exists, with no free unit anywhere: a claim of
    # it can be placed only once the leader has published the node's units.
    scene.published(api, fresh, 1)
    known_after = _judged_by_every_replica(
        api,
        replicas,
        "orders of a class made after the faults",
        _dry_run_order(api, ns, fresh, tally),
        fresh,
    )
    hold = load.place(api, load.Outcome(ns, "after-hold", fresh, 1), tally)
    assert hold.placed, (
        f"the claim the VMI webhooks are asked about was refused: {hold.refusal}\n"
        + _cluster_report(api, fresh)
    )
    vmi_after = _judged_by_every_replica(
        api,
        replicas,
        "a VM on a claim made after the faults",
        _dry_run_vm(api, ns, "after-hold", tally),
        fresh,
    )
    relists = replicas.log_count('"watch expired; relisting"') - relists_before
    placed = sum(1 for o in orders if o.placed)
    undecided = [o for o in orders if not o.placed and not oracle.decided(o.refusal, [cls])]
    reasons = Counter(oracle.refusal_kind(o.refusal, [cls]) for o in orders if not o.placed)
    FIGURES.append(
        f"R3 ({sizes.name}): orders {len(orders)} (placed {placed}, refusals "
        f"{dict(sorted(reasons.items()))}); faults: "
        f"{rounds} rounds of {', '.join(faults[:3])}; "
        f"watches answered 410 and relisted: {relists}; client retries {tally.retries} "
        f"({tally.not_ready} asked for by a webhook catching up); "
        f"stuck claims {len(verdict.stuck)}; over-allocation "
        f"{len(verdict.overallocated) + len(verdict.overheld)}; 403 while the API server "
        f"started {restart_403}; kwok and kube-scheduler saw a new node {caught_up:.1f}s "
        f"after the last restart (probe {probed:.1f}s); both webhooks knew a class made "
        f"after the faults after "
        f"{known_after:.1f}s, a claim after {vmi_after:.1f}s"
    )
    assert not failures, failures
    assert not undecided, [(o.name, o.refusal) for o in undecided[:5]]
    assert relists > 0, "no watch of the operator was answered 410 Gone: the fault did not bite"
    assert not verdict.problems(history), verdict.problems(history)


class Probe:
    """One webhook question, asked again and again: ``knows()`` says whether the answer
    showed the webhook knew; ``last`` keeps the last answers for the failure report."""

    def __init__(
        self, ask: Callable[[], requests.Response], known: Callable[[requests.Response], bool]
    ) -> None:
        self._ask, self._known = ask, known
        self.last: deque[str] = deque(maxlen=6)

    def knows(self) -> bool:
        response = self._ask()
        knew = self._known(response)
        self.last.append(
            f"{time.strftime('%H:%M:%S')} {response.status_code} knew={knew} "
            f"{response.text[:300]!r}"
        )
        return knew


def _dry_run_order(api: pykube.HTTPClient, ns: str, cls: str, tally: load.Tally) -> Probe:
    """One dry-run order of one unit of ``cls``, a class with free units published: True
    when the webhook admitted it, knowing the class and its published figures (a webhook
    that does not know the class refuses the order as not existing; one that knows only its
    first, empty status, as fitting on no node)."""
    body = load.claim_body(ns, "probe", cls, 1)
    return Probe(
        lambda: load.retrying(
            tally,
            "a dry-run order",
            lambda: api.post(
                url=f"namespaces/{ns}/{names.GPU_CLAIMS}",
                version=names.API_VERSION,
                params={"dryRun": "All"},
                data=json.dumps(body),
            ),
        ),
        lambda r: r.status_code == 201,
    )


def _dry_run_vm(api: pykube.HTTPClient, ns: str, claim: str, tally: load.Tally) -> Probe:
    """One dry-run VMI on ``claim``: True when the VMI webhook knew the claim."""
    body = load.vmi_body(ns, "probe-vm", [{"claim": claim}])
    return Probe(
        lambda: load.retrying(
            tally,
            "a dry-run VM",
            lambda: api.post(
                url=f"namespaces/{ns}/virtualmachineinstances",
                version="kubevirt.io/v1",
                params={"dryRun": "All"},
                data=json.dumps(body),
            ),
        ),
        lambda r: (
            r.status_code == 201
            or ("denied the request" in r.text and "no such GPUClaim" not in r.text)
        ),
    )


def _judged_by_every_replica(
    api: pykube.HTTPClient,
    replicas: Replicas,
    what: str,
    probe: Probe,
    cls: str,
    in_a_row: int = 6,
) -> float:
    """Seconds until ``in_a_row`` requests in a row were judged by webhooks that knew what
    they were asked about: the failover address alternates between the ready replicas, so
    each of them knew it. When time runs out, the failure says what each replica knew."""
    started = time.monotonic()
    streak = [0]

    def judged() -> bool:
        streak[0] = streak[0] + 1 if probe.knows() else 0
        return streak[0] >= in_a_row

    try:
        wait_for(f"both replicas to know {what}", judged, timeout=scene.CONVERGE)
    except WaitTimeoutError as exc:
        raise AssertionError(
            f"{exc}\nlast answers:\n  "
            + "\n  ".join(probe.last)
            + "\n"
            + diagnosis.report(api, replicas, ('"admission refused"', '"informing"', '"watch idle'))
        ) from None
    return time.monotonic() - started


def _cluster_report(api: pykube.HTTPClient, cls: str) -> str:
    """The class's published status and every node's Ready condition."""
    found = GPUClass.objects(api).get_or_none(name=cls)
    out = [f"class {cls} status: {(found.obj.get('status') if found else None)!r}"]
    for node in pykube.Node.objects(api):
        conditions = (node.obj.get("status") or {}).get("conditions") or []
        ready: dict[str, str] = next((c for c in conditions if c.get("type") == "Ready"), {})
        out.append(
            f"node {node.name}: Ready={ready.get('status')} ({ready.get('reason')}, "
            f"since {ready.get('lastTransitionTime')})"
        )
    return "\n".join(out)
