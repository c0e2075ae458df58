"""R1: orders racing past the webhook and VMs started and stopped while the leader is
SIGKILLed again and again; no unit is ever sold twice, no hold moves without its node being
lost, every order that fits is bound and every other one says why. A DRA class is in the
load beside the device-plugin ones: no device is in two ResourceClaims' allocations at any
etcd revision, and every Bound claim of it holds its devices through its own.

The fault schedule: each leader is SIGKILLed a while after it took the Lease — between a
fifth of ``kill_interval`` (10 s) and all of it, drawn from a seeded generator, so some die
while their controllers start and some mid-pass; after a SIGKILL nobody may lead until the
Lease expires (15 s). Its replacement starts at once, with a new identity, as a new pod
would. (Counting the interval from the previous kill instead would, with a handover longer
than the interval, kill every new leader the moment it took over: it would never bind.)
The bounded form stops after ``kills`` kills, the full form when the load ends. One node is
deleted halfway, so some holds are Lost and must rebind. At the end every tenant gives back
all it holds at once, and the queue must move: the waiting orders that now fit are bound, in
order.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pykube

from chaos import load, oracle, scene
from chaos.conftest import FIGURES, Sizes
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from harness.fleet import Fleet
from harness.waiting import wait_for

CONVERGE = 120.0
SEED = 9


def _pct(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"p50 {statistics.median(values):.1f}s / max {max(values):.1f}s"


def test_orders_and_vms_under_leader_kills_never_sell_a_unit_twice(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    kubevirt: object,
    sizes: Sizes,
    dra_driver_client: pykube.HTTPClient,
) -> None:
    rng = random.Random(SEED)  # noqa: S311 - a reproducible load, not a secret
    replicas.renew()  # a fresh pair: what an earlier test left behind is judged there
    fleets = [Fleet(api) for _ in range(3)]
    gpus, vgpus, vms = fleets
    small = gpus.gpu_class("-s", maxCount=2)
    large = gpus.gpu_class("-l", maxCount=4)
    vgpu = vgpus.gpu_class("-v", mode="vgpu", profile="B-1Q")
    vm_class = vms.gpu_class("-vm", maxCount=1)
    gpu_nodes = [gpus.node(8) for _ in range(8)]
    vgpu_nodes = [vgpus.node(4) for _ in range(2)]
    vm_nodes = [vms.node(4) for _ in range(2)]
    for cls, fleet in ((small, gpus), (large, gpus), (vgpu, vgpus), (vm_class, vms)):
        history.classes[cls] = fleet.resource
    for node in gpu_nodes:
        history.capacity[(node, gpus.resource)] = 8
    for node in vgpu_nodes:
        history.capacity[(node, vgpus.resource)] = 4
    for node in vm_nodes:
        history.capacity[(node, vms.resource)] = 4
    # A DRA class beside them: its holds are allocated ResourceClaims (4 nodes x 4 devices).
    devices = scene.dra_fleet(api, dra_driver_client, nodes=4, devices=4)
    dra = scene.dra_class(api, devices, history, maxCount=2)
    scene.other_pod(api, gpu_nodes[0], gpus.resource, 2)
    history.capacity[(gpu_nodes[0], gpus.resource)] = 6
    for cls, n in ((small, 8), (large, 8), (vgpu, 2), (vm_class, 2), (dra, 4)):
        scene.published(api, cls, n)
    scene.operator_counts(api, gpu_nodes[0], gpus.resource, allocated=2)

    tenants = [
        scene.tenant(api, "chaos-free", False, {}),
        scene.tenant(api, "chaos-budget", True, {names.QUOTA_TOTAL_KEY: "10"}),
        scene.tenant(api, "chaos-vgpu", True, {f"{vgpu}.{names.QUOTA_TOTAL_KEY}": "3"}),
    ]
    vm_tenant = scene.tenant(api, "chaos-vms", False, {})
    wait_for(
        "the default ServiceAccount of the VM tenant",
        lambda: pykube.ServiceAccount.objects(api, namespace=vm_tenant).get_or_none(name="default"),
        timeout=CONVERGE,
    )

    def an_order(i: int) -> load.Outcome:
        cls = rng.choices([small, large, vgpu, dra], weights=[5, 3, 2, 3])[0]
        most = {small: 2, large: 4, vgpu: 1, dra: 2}[cls]
        count = (
            rng.choice([*range(1, most + 1), most + 1])
            if rng.random() < 0.1
            else rng.randint(1, most)
        )
        return load.Outcome(rng.choice(tenants), f"order-{i:05d}", cls, count)

    orders = [an_order(i) for i in range(sizes.orders)]
    tally = load.Tally()
    clients = load.Clients(api)
    load_done = threading.Event()
    failures: list[str] = []
    released = [0]
    node_deleted: list[str] = []
    on_lost_node: list[str] = []

    def orders_thread() -> None:
        try:
            bursts = [orders[i : i + sizes.burst] for i in range(0, len(orders), sizes.burst)]
            for n, chunk in enumerate(bursts):
                started = time.monotonic()
                load.burst(clients, chunk, tally)
                for ns in tenants:
                    released[0] += load.release(clients.get(), ns, 0.6, rng, tally)
                if n == len(bursts) // 2:
                    node_deleted.append(gpu_nodes[1])
                    on_lost_node.extend(_lose_node(clients.get(), history, gpu_nodes[1], tally))
                time.sleep(max(0.0, sizes.burst_interval - (time.monotonic() - started)))
        except Exception as exc:
            failures.append(f"orders: {type(exc).__name__}: {exc}")

    runs = [load.VmRun(f"vm-{i:03d}", template=i % 2 == 1) for i in range(sizes.vms)]

    def vms_thread() -> None:
        def one(run: load.VmRun) -> None:
            try:
                load.vm_cycle(clients.get(), vm_tenant, vm_class, run, tally, CONVERGE)
            except Exception as exc:
                run.problem = f"{type(exc).__name__}: {exc}"

        with ThreadPoolExecutor(max_workers=sizes.vm_parallel) as pool:
            list(pool.map(one, runs))

    threads = [
        threading.Thread(target=orders_thread, name="orders", daemon=True),
        threading.Thread(target=vms_thread, name="vms", daemon=True),
    ]
    for t in threads:
        t.start()

    def watch_load() -> None:
        for t in threads:
            t.join()
        load_done.set()

    threading.Thread(target=watch_load, daemon=True).start()

    # The fault schedule, and a snapshot check after each phase (kill → new leader).
    handovers: list[float] = []
    kill_times: list[tuple[float, float]] = []  # (SIGKILL, the new leader's acquireTime)
    phase_overallocations: list[str] = []
    phase_overbudgets: list[str] = []
    kills = 0
    schedule = random.Random(SEED + 1)  # noqa: S311 - a reproducible schedule, not a secret
    leading_since = time.monotonic()
    while not load_done.is_set() and (sizes.kills is None or kills < sizes.kills):
        tenure = schedule.uniform(0.2, 1.0) * sizes.kill_interval
        if load_done.wait(max(0.0, leading_since + tenure - time.monotonic())):
            break
        old, killed = replicas.kill_leader_and_replace()
        kills += 1
        _new, took = replicas.handover(killed, old)
        leading_since = time.monotonic()
        handovers.append(took)
        kill_times.append((killed, killed + took))
        phase_snapshot = scene.snapshot(api, tally)
        phase_overallocations += oracle.overallocations(phase_snapshot)
        phase_overbudgets += oracle.overbudgets(phase_snapshot)
    for t in threads:
        t.join(timeout=CONVERGE * 4)
    assert load_done.is_set(), "the load did not finish"
    replicas.up()  # the replacement of the last kill is ready

    verdict = scene.settle(api, history, tally)
    final, stuck_now, over, changes = (
        verdict.final,
        verdict.stuck,
        verdict.overallocated,
        verdict.changes,
    )
    placed = [o for o in orders if o.placed]
    refused = [o for o in orders if not o.placed]
    undecided = [o for o in refused if not oracle.decided(o.refusal, history.classes)]
    states = {oracle.key(c): oracle.phase(c) for c in final.claims}
    bound_orders = sum(1 for o in placed if states.get(f"{o.namespace}/{o.name}") == "Bound")
    waiting_orders = sum(
        1 for o in placed if states.get(f"{o.namespace}/{o.name}") in ("Pending", "")
    )
    waits = Counter(
        str(oracle.bound_condition(c).get("reason")) for c in final.claims if oracle.waiting(c)
    )
    vm_problems = [r.problem for r in runs if r.problem]
    # The new leader's first write comes after its acquireTime (anything before it is a
    # write of the killed leader that was in flight).
    first_writes = [
        wrote - killed
        for killed, acquired in kill_times
        if (wrote := history.first_leader_write_after(acquired)) is not None
    ]
    versions = history.snapshot()
    lost_ok = [k for k in on_lost_node if any(v.phase == "Lost" for v in versions.get(k, []))]
    gone_before = [
        k
        for k in on_lost_node
        if k not in lost_ok and bool(versions.get(k)) and versions[k][-1].uid == ""
    ]
    never_lost = sorted(set(on_lost_node) - set(lost_ok) - set(gone_before))
    overallocated = len(history.overholds) + len(phase_overallocations) + len(over)
    dra_orders = [o for o in orders if o.class_name == dra]
    dra_bound = sum(1 for o in dra_orders if states.get(f"{o.namespace}/{o.name}") == "Bound")
    dra_phase_twice = [o for o in phase_overallocations if "allocated in" in o or "named by" in o]
    recorded = sum(len(v) for v in history.snapshot().values())
    reasons = Counter(oracle.refusal_kind(o.refusal, history.classes) for o in refused)
    assert replicas.webhooks is not None
    counters = replicas.webhooks.counters

    # The last phase: every tenant gives back all it holds at once; the waiting orders take
    # the capacity in turn (FIFO per class), and what still waits must not fit.
    drained = sum(load.release(clients.get(), ns, 1.0, rng, tally) for ns in tenants)
    after_drain = scene.settle(api, history, tally)
    drain_states = {oracle.key(c): oracle.phase(c) for c in after_drain.final.claims}
    bound_after_drain = sum(
        1
        for o in placed
        if states.get(f"{o.namespace}/{o.name}") != "Bound"
        and drain_states.get(f"{o.namespace}/{o.name}") == "Bound"
    )
    FIGURES.extend(
        [
            f"R1 ({sizes.name}): orders {len(orders)} (placed {len(placed)}, refused by a "
            f"webhook decision {len(refused) - len(undecided)}, refused otherwise "
            f"{len(undecided)}); at the end Bound {bound_orders}, waiting {waiting_orders}, "
            f"released {released[0]}; refusals: {dict(sorted(reasons.items()))}; waiting: "
            f"{dict(sorted(waits.items()))}",
            f"R1: VMs started and stopped {sum(1 for r in runs if not r.problem)} of {len(runs)} "
            f"(holds ordered again after a refusal for want of a free unit: "
            f"{sum(r.capacity_refusals for r in runs)})",
            f"R1: leader kills {kills}; handover to the Lease {_pct(handovers)}; "
            f"to the new leader's first claim write {_pct(first_writes)}",
            f"R1: over-allocation {overallocated} "
            f"(holds at any etcd revision {len(history.overholds)}, snapshots after each phase "
            f"{len(phase_overallocations)}, at the end {len(over)})",
            f"R1: over budget {len(phase_overbudgets) + len(verdict.overbudget)} "
            f"(snapshots after each phase {len(phase_overbudgets)}, at the end "
            f"{len(verdict.overbudget)})",
            f"R1: node changes without Lost {len(changes['unexplained'])} (through Lost "
            f"{len(changes['lost'])}, refusals {len(changes['refused'])}, moves "
            f"{len(changes['moved'])}); claims on the deleted node {len(on_lost_node)}, "
            f"passed through Lost {len(lost_ok)}, deleted before {len(gone_before)}",
            f"R1: stuck claims {len(stuck_now)}; client retries {tally.retries}; webhook "
            f"requests {counters.forwarded}, failed over {counters.failovers}, unanswered "
            f"{counters.unanswered}; claim versions recorded {recorded}",
            f"R1: last phase, every hold given back ({drained}): waiting orders bound "
            f"{bound_after_drain}; stuck claims {len(after_drain.stuck)}; over-allocation "
            f"{len(after_drain.overallocated) + len(after_drain.overheld)}",
            f"R1 DRA: orders {len(dra_orders)} (placed {sum(1 for o in dra_orders if o.placed)}"
            f", Bound at the end {dra_bound}); devices ever allocated "
            f"{len(history.allocations.allocated)} of {4 * 4}; devices allocated twice "
            f"{len(history.allocations.twice) + len(dra_phase_twice)} (at any etcd revision "
            f"{len(history.allocations.twice)}, snapshots after each phase "
            f"{len(dra_phase_twice)}); holds not matching their claim at the end "
            f"{len(verdict.dra) + len(after_drain.dra)}",
        ]
    )
    assert not failures, failures
    assert not phase_overallocations, phase_overallocations[:10]
    assert not phase_overbudgets, phase_overbudgets[:10]
    assert not verdict.problems(history), verdict.problems(history)
    assert not after_drain.problems(history), after_drain.problems(history)
    assert not never_lost, [(k, history.transitions(k)) for k in never_lost[:5]]
    assert not undecided, [(o.name, o.refusal) for o in undecided[:5]]
    assert not vm_problems, vm_problems[:5]
    assert node_deleted, "the node-loss fault did not happen"
    assert any(o.placed for o in dra_orders), "no order of the DRA class got in"
    assert history.allocations.allocated, "the record saw no ResourceClaim allocated"
    assert kills >= (sizes.kills or 1)


def _lose_node(
    api: pykube.HTTPClient, history: ClaimHistory, node: str, tally: load.Tally
) -> list[str]:
    """Delete a node with holds on it: they must go through Lost (and may bind elsewhere).
    Returns the claims Bound there just before (``namespace/name``)."""
    snap = scene.snapshot(api, tally)
    held = [
        oracle.key(c) for c in snap.claims if oracle.holds(c) and c["status"]["nodeName"] == node
    ]
    history.retire_node(node)
    load.retrying(
        tally,
        "deleting a node",
        lambda: load.delete(pykube.Node(api, {"metadata": {"name": node}})),
    )
    return held
