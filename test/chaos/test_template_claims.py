"""A template claim (ordered by the operator for a VM's claimTemplate, owned by its VMI) is
protected like a held one (docs/design.md §2, §10): deleting it while the VM runs only marks it
for deletion — the claim, and the units it holds, stay until the VMI is gone, and a VMI
being deleted is not gone (its launcher pod may still hold the GPU)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pykube

from chaos import load, oracle, scene
from chaos.history import ClaimHistory
from chaos.replicas import Replicas
from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from harness.fleet import Fleet
from harness.kube import mutate
from harness.waiting import wait_for

Obj = dict[str, Any]
T = TypeVar("T")
CONVERGE = scene.CONVERGE
#: How long a protected claim must be seen to stay. The operator acts on a deletion within
#: a second here; five leave room for a loaded machine.
HOLD_SECONDS = 5.0
#: Stands in for KubeVirt's own VMI finalizer: virt-controller keeps a VMI that is being
#: deleted until its launcher pod is gone.
SHUTDOWN_FINALIZER = "chaos.gpuoperator.test/graceful-shutdown"


def stays(
    what: str,
    probe: Callable[[], T],
    holds: Callable[[T], bool],
    seconds: float,
    describe: Callable[[T], str] = repr,
) -> T:
    """Poll ``probe`` for ``seconds``; fail as soon as ``holds`` is false."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        assert holds(value), f"{what}: no longer so ({describe(value)})"
        if time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_a_template_claim_is_held_by_its_finalizer_until_its_vmi_is_gone(
    api: pykube.HTTPClient,
    replicas: Replicas,
    history: ClaimHistory,
    kubevirt: object,
) -> None:
    fleet = Fleet(api)
    cls = fleet.gpu_class(maxCount=4)
    node = fleet.node(4)
    history.classes[cls] = fleet.resource
    history.capacity[(node, fleet.resource)] = 4
    scene.published(api, cls, 1)
    ns = scene.tenant(api, "chaos-template", False, {})
    wait_for(
        "the default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=ns).get_or_none(name="default"),
        timeout=CONVERGE,
    )
    body = load.vmi_body(ns, "vm-t", [{"claimTemplate": {"className": cls, "count": 3}}])
    body["metadata"]["finalizers"] = [SHUTDOWN_FINALIZER]
    vmi = VirtualMachineInstance(api, body)
    vmi.create()
    wait_for(
        "vm-t Scheduled",
        lambda: (vmi_now(api, ns) or {}).get("status") or {},
        until=lambda s: s.get("phase") == "Scheduled",
        timeout=CONVERGE,
    )
    claims = templates(api, ns)
    assert len(claims) == 1, claims
    made = claims[0]
    uid = made["metadata"]["uid"]
    assert (made.get("status") or {}).get("nodeName") == node

    def same_claim_holding() -> Obj:
        now = templates(api, ns)
        return now[0] if len(now) == 1 else {"found": [c["metadata"]["name"] for c in now]}

    def held(c: Obj) -> bool:
        return not trouble(c)

    def trouble(c: Obj) -> str:
        """What is wrong with the claim seen, if it is not the protected original."""
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        if "found" in c:
            return f"template claims now: {c['found']}"
        if meta.get("uid") != uid:
            return f"the claim was removed and a new one made (uid {uid} -> {meta.get('uid')})"
        if not meta.get("deletionTimestamp"):
            return "the claim is not marked for deletion"
        if (status.get("phase"), status.get("nodeName")) != ("Bound", node):
            return f"the hold was let go: {status.get('phase')} on {status.get('nodeName')}"
        return ""

    GPUClaim(api, made).delete()
    stays(
        "the template claim held while its VM runs", same_claim_holding, held, HOLD_SECONDS, trouble
    )
    free = oracle.free_units(oracle.snapshot(api)).get((node, fleet.resource))
    assert free == 1, f"the held units must stay taken: {free} free of 4"

    vmi.delete()  # the VMI is being deleted; the stand-in finalizer keeps it for now
    wait_for(
        "vm-t being deleted",
        lambda: (vmi_now(api, ns) or {}).get("metadata", {}).get("deletionTimestamp"),
        timeout=CONVERGE,
    )
    stays(
        "the template claim held while its VMI is being deleted",
        same_claim_holding,
        held,
        HOLD_SECONDS,
    )

    mutate(vmi, lambda o: o["metadata"].update(finalizers=[]))
    wait_for(
        "the template claim gone with its VMI",
        lambda: templates(api, ns),
        until=lambda c: not c,
        timeout=CONVERGE,
    )
    assert not history.overholds, history.overholds


def vmi_now(api: pykube.HTTPClient, ns: str) -> Obj | None:
    found = VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name="vm-t")
    return None if found is None else dict(found.obj)


def templates(api: pykube.HTTPClient, ns: str) -> list[Obj]:
    return [
        dict(c.obj)
        for c in GPUClaim.objects(api, namespace=ns)
        if (c.obj["metadata"].get("labels") or {}).get(names.TEMPLATE_CLAIM_LABEL) == "true"
    ]
