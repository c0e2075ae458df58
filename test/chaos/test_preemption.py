"""R7: guaranteed orders take back spot holds while the leader is SIGKILLed; no guaranteed
hold is ever taken back, no more spot units are taken than the guaranteed orders need, a
running spot VM is stopped only after its notice's grace, and no unit is held twice.

One resource on four nodes of four units is sold twice: as a guaranteed class and as a
preemptible (spot) one (docs/design.md §5 "Preemptible classes"). Spot orders of two units
fill every node and two of them serve running VMs. Then guaranteed orders of two units
arrive, one more than the idle spot holds can make room for: the idle holds are taken back
first, and the last order takes back one running VM's hold after the replicas' (short)
``preemptionGrace``. The leader is SIGKILLed while the take-backs happen and again while a
running VM is under notice, so a new leader must honour the notice its predecessor wrote
(the stop time is in the claim's status) rather than give the VM a new grace or none.

What is judged, with the record of every claim version from etcd (``history``): every hold
that ended did so as the contract says (``ClaimHistory.releases``: a guaranteed hold taken
back, or any hold ending otherwise, is a violation), exactly as many spot units were taken
back as the guaranteed orders needed, every guaranteed order is Bound at the end, the spot
VM's hold was taken back no sooner than the grace after its notice, and the usual
end-of-run checks (no unit held twice at any revision, nothing stuck).
"""

from __future__ import annotations

import json
from typing import Any

import pykube

from chaos import load, oracle, scene
from chaos.conftest import FIGURES, Sizes
from chaos.history import PREEMPTED, ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from harness.fleet import Fleet
from harness.waiting import wait_for

CONVERGE = 120.0
Obj = dict[str, Any]
#: The replicas' ``preemptionGrace`` in this test (the default is two minutes).
GRACE = 10.0
NODES, UNITS, COUNT = 4, 4, 2
#: The condition a spot claim under notice carries (docs/design.md §5), and its reason.
NOTICE, STOP_SCHEDULED = "Preempting", "StopScheduled"


def _claims(api: pykube.HTTPClient, tally: load.Tally, namespace: str) -> dict[str, Obj]:
    found = load.retrying(
        tally, "listing claims", lambda: list(GPUClaim.objects(api, namespace=namespace))
    )
    return {c.name: c.obj for c in found}


def _vm_running(api: pykube.HTTPClient, namespace: str, name: str) -> bool:
    """Whether the VM runs on its node: the stand-in (virt-controller's part) says
    ``Scheduled`` once the launcher pod runs; ``Running`` is virt-handler's word."""
    vmi = load.read(api, VirtualMachineInstance, namespace, name)
    phase = (vmi.get("status") or {}).get("phase") if vmi is not None else None
    return phase in (names.VMI_SCHEDULED, names.VMI_RUNNING)


def _start_vm(
    api: pykube.HTTPClient, tally: load.Tally, namespace: str, vm: str, held: str
) -> None:
    load.create_retrying(
        api, tally, VirtualMachineInstance, load.vmi_body(namespace, vm, [{"claim": held}])
    )
    wait_for(f"{vm} running on its node", lambda: _vm_running(api, namespace, vm), timeout=CONVERGE)


def _under_notice(claim: Obj) -> bool:
    return any(
        c.get("type") == NOTICE and c.get("status") == "True" and c.get("reason") == STOP_SCHEDULED
        for c in (claim.get("status") or {}).get("conditions") or []
    )


def test_guaranteed_orders_take_back_spot_holds_under_leader_kills(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    kubevirt: object,
    sizes: Sizes,
) -> None:
    replicas.renew(f"--preemption-grace={GRACE:g}s")
    try:
        _run(api, replicas, history, sizes)
    finally:
        replicas.renew()  # the tests after this one run the Deployment's own settings


def _run(api: pykube.HTTPClient, replicas: Replicas, history: ClaimHistory, sizes: Sizes) -> None:
    fleet = Fleet(api)
    guaranteed = fleet.gpu_class("-g", maxCount=COUNT)
    spot = fleet.gpu_class("-spot", maxCount=COUNT, preemptible=True)
    nodes = [fleet.node(UNITS) for _ in range(NODES)]
    for cls in (guaranteed, spot):
        history.classes[cls] = fleet.resource
        scene.published(api, cls, NODES)
    history.preemptible.add(spot)
    for node in nodes:
        history.capacity[(node, fleet.resource)] = UNITS
    spot_tenant = scene.tenant(api, "chaos-spot", False, {})
    paying = scene.tenant(api, "chaos-guaranteed", False, {})
    tally = load.Tally()
    clients = load.Clients(api)
    wait_for(
        "the default ServiceAccount of the spot tenant",
        lambda: pykube.ServiceAccount.objects(api, namespace=spot_tenant).get_or_none(
            name="default"
        ),
        timeout=CONVERGE,
    )

    # Spot orders fill every node; two of their holds then serve running VMs.
    spots = [load.Outcome(spot_tenant, f"spot-{i:02d}", spot, COUNT) for i in range(8)]
    load.burst(clients, spots, tally)
    assert all(o.placed for o in spots), [o.refusal for o in spots if not o.placed]
    wait_for(
        "every spot order Bound",
        lambda: _claims(api, tally, spot_tenant),
        until=lambda found: sum(oracle.holds(c) for c in found.values()) == len(spots),
        timeout=CONVERGE,
    )
    vms = {"vm-0": "spot-00", "vm-1": "spot-07"}
    for vm, held in vms.items():
        _start_vm(api, tally, spot_tenant, vm, held)

    # Guaranteed orders: one more than the idle spot holds make room for. The leader is
    # killed while the first take-backs happen, and again while a running VM is under notice.
    idle_spots = len(spots) - len(vms)
    orders = [
        load.Outcome(paying, f"order-{i:02d}", guaranteed, COUNT) for i in range(idle_spots + 1)
    ]
    load.burst(clients, orders[: idle_spots // 2], tally)
    kills, handovers = 0, []
    old, killed = replicas.kill_leader_and_replace()
    kills += 1
    handovers.append(replicas.handover(killed, old)[1])
    load.burst(clients, orders[idle_spots // 2 :], tally)
    assert all(o.placed for o in orders), [o.refusal for o in orders if not o.placed]
    noticed = wait_for(
        "a running spot VM's hold under notice",
        lambda: [n for n, c in _claims(api, tally, spot_tenant).items() if _under_notice(c)],
        timeout=CONVERGE,
    )
    old, killed = replicas.kill_leader_and_replace()
    kills += 1
    handovers.append(replicas.handover(killed, old)[1])
    wait_for(
        "every guaranteed order Bound",
        lambda: _claims(api, tally, paying),
        until=lambda found: sum(oracle.holds(c) for c in found.values()) == len(orders),
        timeout=CONVERGE + GRACE,
    )
    replicas.up()  # the replacement of the last kill is ready

    verdict = scene.settle(api, history, tally)
    ended = verdict.ended
    spot_key = f"{spot_tenant}/"
    taken = [e for e in ended["preempted"] if e.startswith(spot_key)]
    final = _claims(api, tally, spot_tenant)
    running = sorted(vm for vm in vms if _vm_running(api, spot_tenant, vm))
    notice_to_stop = _notice_to_take_back(history, f"{spot_tenant}/{noticed[0]}")
    FIGURES.append(
        f"R7 ({sizes.name}): spot holds {len(spots)} (serving running VMs {len(vms)}), "
        f"guaranteed orders {len(orders)} (Bound at the end "
        f"{sum(oracle.holds(c) for c in _claims(api, tally, paying).values())}); spot holds "
        f"taken back {len(taken)}, guaranteed holds taken back {len(ended['guaranteed'])}, "
        f"holds ended otherwise {len(ended['unexplained'])}; VMs still running {running}; "
        f"notice to take-back of {noticed[0]} {notice_to_stop:.1f}s (grace {GRACE:g}s); "
        f"leader kills {kills}, handovers {', '.join(f'{h:.1f}s' for h in handovers)}; "
        f"over-allocation {len(verdict.overheld) + len(verdict.overallocated)}"
    )
    assert not verdict.problems(history), verdict.problems(history)
    assert ended["guaranteed"] == []
    # Exactly the units the guaranteed orders lacked: one spot hold per order (each of
    # COUNT units on nodes left with no free unit), and the one VM stopped was one of the two.
    assert len(taken) == len(orders), taken
    assert len(running) == len(vms) - 1, running
    assert sum(oracle.holds(c) for c in final.values()) == len(spots) - len(orders)
    assert notice_to_stop >= GRACE - 1.0, (noticed, history.transitions(spot_key + noticed[0]))


def _notice_to_take_back(history: ClaimHistory, key: str) -> float:
    """Seconds from the first version of ``key`` under notice to the version in which its
    hold was taken back, as etcd's watch delivered them."""
    versions = history.snapshot().get(key, [])
    notice = next(
        (v for v in versions if _under_notice({"status": json.loads(v.status or "{}")})), None
    )
    assert notice is not None, history.transitions(key)
    taken = next(
        (
            v
            for v in versions
            if v.revision > notice.revision and not v.holds and v.reason == PREEMPTED
        ),
        None,
    )
    assert taken is not None, history.transitions(key)
    return taken.received - notice.received
