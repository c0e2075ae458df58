"""R8: vGPU VMs live-migrate in rounds while the leader is SIGKILLed; a transient hold never
takes a unit another hold has (at any etcd revision), each migration either moves its VM's
claim with it or leaves it Bound where the VM runs, and nothing is left holding a target.

Five nodes of one vGPU unit each, three VMs on held claims of one unit (docs/design.md §5
"Live migration"). Each round asks KubeVirt (the stand-in) to migrate all three VMs at once:
two nodes are free, so at most two migrations can get a transient hold and the third is
ended at once (``NoTargetCapacity``, the migration object deleted), or waits for a target
freed by another. The leader is killed in the first two rounds — in the first before any
hold is written, in the second as soon as one is — so a new leader must hold, finish or end
what its predecessor left (the holds are in the claims' status, the migrations in
KubeVirt's objects).

What is judged, with the record of every claim version from etcd (``history``): holds —
with transient holds counted on their target node — never exceed a node's capacity at any
revision, a claim changes node only with its migrated VM (reason ``Migrated``) or as the
contract otherwise allows, no hold ends unexplained; at the end every claim is Bound on the
node its VM runs on with no transient hold left, every migration object is finished or
gone, some migrations succeeded, and the usual end-of-run checks pass.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pykube

from chaos import load, oracle, scene
from chaos.conftest import FIGURES, Sizes
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from gpuoperator.kinds import GPUClaim, KubeVirt, VirtualMachineInstance
from gpuoperator.kinds import VirtualMachineInstanceMigration as Migration
from harness.fleet import Fleet
from harness.kubevirt import vgpu_migration_config
from harness.waiting import wait_for

CONVERGE = 120.0
NODES, VMS = 5, 3
PROFILE = "G1-4Q"
#: Leader kills: one in each of the first rounds (the bounded form has 3 rounds).
KILLS = 2
FINISHED = ("Succeeded", "Failed")
Obj = dict[str, Any]


def _phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def _holding(api: pykube.HTTPClient, ns: str) -> bool:
    """Whether a claim of the namespace carries a transient hold."""
    found = GPUClaim.objects(api, namespace=ns).iterator()
    return any((c.obj.get("status") or {}).get("migration") for c in found)


def _migration_phases(api: pykube.HTTPClient, ns: str, jobs: list[str]) -> list[str]:
    """Each migration's phase (``""`` before KubeVirt has written one), ``gone`` for one no
    longer there (ended for want of room)."""
    found = [load.read(api, Migration, ns, j) for j in jobs]
    return ["gone" if m is None else _phase(m) for m in found]


def test_vgpu_vms_migrate_in_rounds_under_leader_kills_and_their_holds_follow(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    kubevirt: object,
    sizes: Sizes,
) -> None:
    replicas.renew()
    rounds = 3 if sizes.name == "bounded" else 8
    fleet = Fleet(api)
    cls = fleet.gpu_class("-mig", mode="vgpu", profile=PROFILE)
    nodes = [fleet.node(1) for _ in range(NODES)]
    history.classes[cls] = fleet.resource
    for node in nodes:
        history.capacity[(node, fleet.resource)] = 1
    ns = scene.tenant(api, "chaos-migrate", True, {})
    config = KubeVirt(api, vgpu_migration_config(ns, fleet.resource, PROFILE))
    config.create()
    try:
        _run(api, replicas, history, ns, cls, rounds, sizes)
    finally:
        config.delete()


def _run(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    ns: str,
    cls: str,
    rounds: int,
    sizes: Sizes,
) -> None:
    tally = load.Tally()
    scene.published(api, cls, NODES)
    wait_for(
        "the default ServiceAccount of the tenant",
        lambda: pykube.ServiceAccount.objects(api, namespace=ns).get_or_none(name="default"),
        timeout=CONVERGE,
    )
    holds = [load.Outcome(ns, f"hold-{i}", cls, 1) for i in range(VMS)]
    load.burst(load.Clients(api), holds, tally)
    assert all(o.placed for o in holds), [o.refusal for o in holds if not o.placed]
    vms = [f"vm-{i}" for i in range(VMS)]
    for vm, hold in zip(vms, holds, strict=True):
        load.create_retrying(
            api, tally, VirtualMachineInstance, load.vmi_body(ns, vm, [{"claim": hold.name}])
        )
    wait_for(
        "every VM running on its node",
        lambda: [_phase(load.read(api, VirtualMachineInstance, ns, vm)) for vm in vms],
        until=lambda phases: all(p == names.VMI_SCHEDULED for p in phases),
        timeout=CONVERGE,
    )

    outcomes: Counter[str] = Counter()
    handovers: list[float] = []
    kills = 0
    for round_ in range(rounds):
        jobs = [f"m{round_}-{vm}" for vm in vms]
        for job, vm in zip(jobs, vms, strict=True):
            obj = {
                "apiVersion": names.KUBEVIRT_API_VERSION,
                "kind": names.VMIM_KIND,
                "metadata": {"name": job, "namespace": ns},
                "spec": {"vmiName": vm},
            }
            load.create_retrying(api, tally, Migration, obj)
        if kills < KILLS:
            # In the first round at once, before any hold: the new leader must hold (or
            # end) what it finds. Later, once a transient hold is written: the new leader
            # must finish the move of a VM that migrated meanwhile, or end the holds of what
            # did not.
            if round_ > 0:
                wait_for(
                    "a transient hold written",
                    functools.partial(_holding, api, ns),
                    timeout=CONVERGE,
                    interval=0.02,
                )
            old, killed = replicas.kill_leader_and_replace()
            kills += 1
            handovers.append(replicas.handover(killed, old)[1])
        ended = wait_for(
            f"round {round_}'s migrations finished or gone",
            functools.partial(_migration_phases, api, ns, jobs),
            until=lambda phases: all(p in (*FINISHED, "gone") for p in phases),
            timeout=CONVERGE,
        )
        outcomes.update(ended)
        _converged(api, ns, vms)
    replicas.up()  # the replacement of the last kill is ready

    verdict = scene.settle(api, history, tally)
    changes = verdict.changes
    final = _converged(api, ns, vms)
    FIGURES.append(
        f"R8 ({sizes.name}): {rounds} rounds of {VMS} migrations on {NODES} nodes of one unit: "
        f"{dict(sorted(outcomes.items()))}; claims moved with their VM "
        f"{len(changes['migrated'])}, node changes otherwise unexplained "
        f"{len(changes['unexplained'])}; holds ended unexplained "
        f"{len(verdict.ended['unexplained'])}; leader kills {kills}, handovers "
        f"{', '.join(f'{h:.1f}s' for h in handovers)}; over-allocation "
        f"{len(verdict.overheld) + len(verdict.overallocated)} (transient holds counted on "
        f"their target at every etcd revision); claims Bound where their VM runs at the end "
        f"{sum(final.values())} of {VMS}"
    )
    assert not verdict.problems(history), verdict.problems(history)
    assert outcomes["Succeeded"] >= 1, outcomes
    # Each VM has one claim: every success moved exactly one claim, nothing else did.
    assert len(changes["migrated"]) == outcomes["Succeeded"], (changes, outcomes)
    assert all(final.values()), final


def _converged(api: pykube.HTTPClient, ns: str, vms: list[str]) -> dict[str, bool]:
    """Wait until each VM's claim is Bound on the node the VM runs on with no transient hold
    left; returns, per VM, whether it is."""

    def state() -> dict[str, bool]:
        out = {}
        for i, vm in enumerate(vms):
            vmi = load.read(api, VirtualMachineInstance, ns, vm) or {}
            claim = load.read(api, GPUClaim, ns, f"hold-{i}") or {}
            status = claim.get("status") or {}
            out[vm] = (
                oracle.holds(claim)
                and status.get("nodeName") == (vmi.get("status") or {}).get("nodeName")
                and not status.get("migration")
                and _phase(vmi) == names.VMI_SCHEDULED
            )
        return out

    wait_for(
        "every claim Bound where its VM runs, no transient hold left",
        state,
        until=lambda found: all(found.values()),
        timeout=CONVERGE,
    )
    return state()
