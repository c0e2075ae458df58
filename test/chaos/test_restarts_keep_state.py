"""R6: the operator keeps its state only in the objects' status, so a restart of every
replica — no memory survives — changes nothing that was decided: holds (node and boundTime),
refusedNodes, and attachments are the same after it; a VM whose launcher pod was created but
not yet pinned when the operator died is pinned to its claim's node after it; orders whose
binds were in flight are bound once, without any hold moving. A DRA claim keeps its devices
and the very ResourceClaim that holds them, and DRA orders in flight are bound once."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pykube

from chaos import load, scene
from chaos.conftest import FIGURES
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from gpuoperator.kinds import GPUClaim, ResourceClaim, VirtualMachineInstance
from harness.fleet import Fleet
from harness.waiting import wait_for

Obj = dict[str, Any]
CONVERGE = scene.CONVERGE
#: The fields of a claim's status that are decisions (conditions' timestamps may be rewritten);
#: a DRA claim's devices and its ResourceClaim's name besides.
KEPT = (
    "phase",
    "nodeName",
    "boundTime",
    "refusedNodes",
    "attachment",
    "devices",
    "resourceClaimName",
)


def _claim(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    found = GPUClaim.objects(api, namespace=ns).get_or_none(name=name)
    return dict(found.obj) if found is not None else {}


def _status_of(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    return dict(_claim(api, ns, name).get("status") or {})


def _vmi_status(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    found = VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name=name)
    return dict((found.obj.get("status") or {}) if found is not None else {})


def _decisions(api: pykube.HTTPClient, ns: str) -> dict[str, Obj]:
    return {
        c.name: {k: (c.obj.get("status") or {}).get(k) for k in KEPT}
        for c in GPUClaim.objects(api, namespace=ns)
    }


def _vm(api: pykube.HTTPClient, ns: str, name: str, refs: list[Obj], memory: str = "1Gi") -> None:
    body = load.vmi_body(ns, name, refs)
    body["spec"]["domain"]["resources"]["requests"]["memory"] = memory
    VirtualMachineInstance(api, body).create()


def test_a_restart_of_every_replica_keeps_holds_refusals_and_attachments(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    kubevirt: object,
    dra_driver_client: pykube.HTTPClient,
) -> None:
    fleet = Fleet(api)
    cls = fleet.gpu_class(maxCount=8)
    small = fleet.node(4, memory="8Gi")
    big = fleet.node(4, memory="64Gi")
    spare = fleet.node(8, memory="64Gi")
    history.classes[cls] = fleet.resource
    for node, units in ((small, 4), (big, 4), (spare, 8)):
        history.capacity[(node, fleet.resource)] = units
    scene.published(api, cls, 3)
    devices = scene.dra_fleet(api, dra_driver_client, nodes=2, devices=4)
    dra = scene.dra_class(api, devices, history, maxCount=4)
    scene.published(api, dra, 2)
    ns = scene.tenant(api, "chaos-r6", False, {})
    wait_for(
        "the default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=ns).get_or_none(name="default"),
        timeout=CONVERGE,
    )
    tally = load.Tally()

    # A refusal: the small node cannot run a 16Gi VM, so it refuses the pinned pod; the
    # claim remembers it and binds on another node.
    load.place(api, load.Outcome(ns, "refused", cls, 2), tally)
    wait_for(
        "refused Bound",
        lambda: _status_of(api, ns, "refused"),
        until=lambda s: bool(s.get("nodeName")),
    )
    _vm(api, ns, "vm-big", [{"claim": "refused"}], memory="16Gi")
    wait_for(
        "the refusal recorded and the claim bound elsewhere",
        lambda: _status_of(api, ns, "refused"),
        until=lambda s: bool(s.get("refusedNodes")) and s.get("phase") == "Bound",
        timeout=CONVERGE,
    )
    # A running VM on a held claim: an attachment with the VMI's uid.
    load.place(api, load.Outcome(ns, "held", cls, 1), tally)
    wait_for(
        "held Bound", lambda: _status_of(api, ns, "held"), until=lambda s: bool(s.get("nodeName"))
    )
    _vm(api, ns, "vm-run", [{"claim": "held"}])
    wait_for(
        "vm-run Scheduled and its attachment complete",
        lambda: (_vmi_status(api, ns, "vm-run"), _status_of(api, ns, "held")),
        until=lambda pair: (
            pair[0].get("phase") == "Scheduled"
            and bool((pair[1].get("attachment") or {}).get("uid"))
        ),
        timeout=CONVERGE,
    )
    # The operator dies right after a VM's launcher pod is created (gated, not yet pinned)
    # and right after a burst of orders passed the webhook (binds in flight).
    # A DRA claim Bound to devices: its hold (the ResourceClaim) must be the same object after.
    load.place(api, load.Outcome(ns, "dra-held", dra, 2), tally)
    wait_for(
        "dra-held Bound to devices",
        lambda: _status_of(api, ns, "dra-held"),
        until=lambda s: s.get("phase") == "Bound" and bool(s.get("devices")),
        timeout=CONVERGE,
    )
    hold_uid = _hold_uid(api, ns, "dra-held")
    load.place(api, load.Outcome(ns, "late", cls, 1), tally)
    wait_for(
        "late Bound", lambda: _status_of(api, ns, "late"), until=lambda s: bool(s.get("nodeName"))
    )
    burst = [load.Outcome(ns, f"burst-{i:02d}", cls, 1) for i in range(6)]
    burst += [load.Outcome(ns, f"dra-burst-{i:02d}", dra, 1) for i in range(4)]
    load.burst(load.Clients(api), burst, tally, parallel=6)
    # A VM that waits at start: its template claim (8 units) fits on no node yet, so its
    # launcher pod stays gated, through the restart too.
    _vm(api, ns, "vm-gated", [{"claimTemplate": {"className": cls, "count": 8}}])
    wait_for(
        "vm-gated's launcher pod gated and its claim waiting",
        lambda: (_launcher(api, ns, "vm-gated"), _status_of(api, ns, "vm-gated-gpu-0")),
        until=lambda pair: _gated(pair[0]) and pair[1].get("phase") == "Pending",
        timeout=CONVERGE,
    )
    _vm(api, ns, "vm-late", [{"claim": "late"}])
    before = _decisions(api, ns)
    killed = replicas.restart_all()
    restarted_in = time.time() - killed

    # After: every decision made before is unchanged; what was in flight completes.
    wait_for(
        "vm-late Scheduled",
        lambda: _vmi_status(api, ns, "vm-late"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    assert _gated(_launcher(api, ns, "vm-gated")), "a VM that does not fit waits, gated"
    wait_for(
        "the DRA orders in flight Bound to devices",
        lambda: [_status_of(api, ns, o.name) for o in burst if o.class_name == dra],
        until=lambda all_: all(s.get("phase") == "Bound" and s.get("devices") for s in all_),
        timeout=CONVERGE,
    )
    after = _decisions(api, ns)
    changed = {
        name: (was, after.get(name))
        for name, was in before.items()
        if was.get("phase") == "Bound" and _changed(was, after.get(name) or {})
    }
    # Capacity frees on the 8-unit node: the waiting VM starts there.
    for name, decision in after.items():
        if decision.get("nodeName") == spare and decision.get("phase") == "Bound":
            victim = GPUClaim(api, load.claim_body(ns, name, cls, 1))
            load.retrying(tally, f"releasing {name}", partial(load.delete, victim))
    started = wait_for(
        "vm-gated Scheduled",
        lambda: _vmi_status(api, ns, "vm-gated"),
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    verdict = scene.settle(api, history, tally)
    late_node = (after.get("late") or {}).get("nodeName")
    FIGURES.append(
        f"R6: claims compared across a restart of both replicas {len(before)} "
        f"(Bound before {sum(1 for d in before.values() if d.get('phase') == 'Bound')}); "
        f"decisions changed {len(changed)}; DRA claims Bound to devices "
        f"{sum(1 for d in after.values() if d.get('devices'))} (devices allocated twice "
        f"{len(verdict.twice)}, holds not matching their claim {len(verdict.dra)}); "
        f"stuck claims {len(verdict.stuck)}; "
        f"the new pair ready and leading {restarted_in:.1f}s after the kill"
    )
    assert not changed, changed
    assert _hold_uid(api, ns, "dra-held") == hold_uid, "the DRA hold was made again"
    dra_bound = [
        o.name for o in burst if o.class_name == dra and after.get(o.name, {}).get("devices")
    ]
    assert len(dra_bound) == 4, after
    assert _vmi_status(api, ns, "vm-late").get("nodeName") == late_node
    assert started.get("nodeName") == spare
    assert (after["late"].get("attachment") or {}).get("vmi") == "vm-late"
    assert all(after[o.name].get("phase") == "Bound" for o in burst if o.placed)
    assert after["refused"]["refusedNodes"] == before["refused"]["refusedNodes"]
    assert [r["nodeName"] for r in after["refused"]["refusedNodes"]] == [small]
    assert not verdict.problems(history), verdict.problems(history)


def _hold_uid(api: pykube.HTTPClient, ns: str, name: str) -> str:
    found = ResourceClaim.objects(api, namespace=ns).get_or_none(name=name)
    return str(found.obj["metadata"]["uid"]) if found is not None else ""


def _launcher(api: pykube.HTTPClient, ns: str, vmi: str) -> Obj | None:
    for pod in pykube.Pod.objects(api, namespace=ns):
        owners = pod.obj["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "VirtualMachineInstance" and o.get("name") == vmi for o in owners):
            return dict(pod.obj)
    return None


def _gated(pod: Obj | None) -> bool:
    gates = ((pod or {}).get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.PLACEMENT_GATE for g in gates)


def _changed(was: Obj, now: Obj) -> bool:
    """A decision changed: the hold (node, boundTime, a DRA claim's devices and
    ResourceClaim), refusals, or a recorded attachment.
    The attachments controller records an attachment once its VMI exists (the webhooks write
    nothing), so one not recorded yet may appear, and one without a uid may only gain it."""
    for field in ("phase", "nodeName", "boundTime", "refusedNodes", "devices", "resourceClaimName"):
        if was.get(field) != now.get(field):
            return True
    attached, still = was.get("attachment") or {}, now.get("attachment") or {}
    if attached.get("uid"):
        return bool(attached != still)
    return bool(attached.get("vmi")) and attached.get("vmi") != still.get("vmi")
