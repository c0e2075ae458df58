"""R3: the control plane fails under the operator while tenants order and release GPUs —
every connection of the replicas to the API server cut, etcd compacted and kube-apiserver
restarted (its fresh watch cache answers the replicas' resumed watches with 410 Gone, and
etcd no longer holds the versions they knew) — and the operator converges: no stuck claim,
no unit held twice, at any stored revision."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pykube

from chaos import load, oracle, scene, store
from chaos.conftest import FIGURES, Sizes
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from harness.fleet import Fleet
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
    while True:
        rounds += 1
        replicas.cut_connections()
        faults.append("connections cut")
        done.wait(2)
        etcd.compact()
        faults.append("etcd compacted")
        chaos_cluster.restart("kube-apiserver", log=lambda _m: None)
        faults.append("kube-apiserver restarted")
        if (sizes.name == "bounded" and rounds >= 2) or done.wait(3):
            break
    thread.join(timeout=scene.CONVERGE * 2)
    verdict = scene.settle(api, history, tally)
    relists = replicas.log_count('"watch expired; relisting"') - relists_before
    placed = sum(1 for o in orders if o.placed)
    undecided = [o for o in orders if not o.placed and not oracle.decided(o.refusal)]
    reasons = Counter(oracle.refusal_kind(o.refusal) for o in orders if not o.placed)
    FIGURES.append(
        f"R3 ({sizes.name}): orders {len(orders)} (placed {placed}, refusals "
        f"{dict(sorted(reasons.items()))}); faults: "
        f"{rounds} rounds of {', '.join(faults[:3])}; "
        f"watches answered 410 and relisted: {relists}; client retries {tally.retries}; "
        f"stuck claims {len(verdict.stuck)}; over-allocation "
        f"{len(verdict.overallocated) + len(verdict.overheld)}"
    )
    assert not failures, failures
    assert not undecided, [(o.name, o.refusal) for o in undecided[:5]]
    assert relists > 0, "no watch of the operator was answered 410 Gone: the fault did not bite"
    assert not verdict.problems(history), verdict.problems(history)
