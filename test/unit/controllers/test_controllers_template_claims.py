"""Template claims (``controllers.template_claims``): a VMI's claim template ordered once as
a claim owned by the VMI and marked as its template claim, never adopting a foreign claim of
that name, nothing with gpuForVMs off or for VMIs that need none, and a claim made earlier
kept when the judgement of the references changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from controllers import template_claims
from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from gpuoperator.model import slimming, templates
from harness import objects
from harness import vm_controllers as vm


def test_template_claim_is_created_once_marked_and_owned_by_the_vmi(world: vm.World) -> None:
    world.admitted_vmi()
    controller = world.template_claims()

    assert controller.reconcile((vm.NS, "vm1")) is None

    creates = [c for c in world.api.calls if c[0] == "create"]
    assert len(creates) == 1
    body = creates[0][3]
    assert body["metadata"]["name"] == "vm1-gpu-1"  # the template is the second reference
    assert body["metadata"]["labels"] == {names.TEMPLATE_CLAIM_LABEL: names.TRUE}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "name": "vm1",
            "uid": vm.VMI_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["spec"] == {"className": "a10", "count": 2}
    assert world.recorder.events[-1]["reason"] == "TemplateClaimCreated"
    assert world.recorder.events[-1]["kind"] == "VirtualMachineInstance"
    assert world.recorder.events[-1]["apiVersion"] == "kubevirt.io/v1"

    # The watch delivers the claim: the next passes create nothing.
    world.caches.claims.store.put(
        slimming.slim_claim(world.api.objects[("GPUClaim", vm.NS, "vm1-gpu-1")])
    )
    assert controller.reconcile((vm.NS, "vm1")) is None
    assert controller.reconcile((vm.NS, "vm1")) is None
    assert len([c for c in world.api.calls if c[0] == "create"]) == 1


def test_template_claim_behind_the_cache_is_recognised_after_already_exists(
    world: vm.World,
) -> None:
    admitted = world.admitted_vmi()
    controller = world.template_claims()
    controller.reconcile((vm.NS, "vm1"))
    world.recorder.events.clear()

    # Another pass before the watch delivered the claim: AlreadyExists, then a read shows
    # it is this VMI's own claim — no conflict reported.
    assert controller.reconcile((vm.NS, "vm1")) is None
    assert world.recorder.events == []
    assert templates.is_template_claim_of(
        world.api.objects[("GPUClaim", vm.NS, "vm1-gpu-1")], admitted
    )


@pytest.mark.parametrize(
    "foreign",
    [
        pytest.param(vm.claim("vm1-gpu-1"), id="tenant-claim"),
        pytest.param(vm.claim("vm1-gpu-1", owner_uid="uid-earlier-vm1"), id="earlier-vmi"),
    ],
)
def test_foreign_claim_of_the_template_name_is_never_adopted(
    world: vm.World, foreign: vm.Obj
) -> None:
    world.admitted_vmi()
    stored = world.put_claim(foreign)

    result = world.template_claims().reconcile((vm.NS, "vm1"))

    assert vm.requeue(result) == template_claims.CONFLICT_RECHECK
    assert world.api.writes() == []
    assert world.api.objects[("GPUClaim", vm.NS, "vm1-gpu-1")] == stored
    event = world.recorder.events[-1]
    assert (event["type"], event["reason"]) == ("Warning", "TemplateClaimConflict")
    assert (event["kind"], event["apiVersion"], event["name"]) == (
        "VirtualMachineInstance",
        "kubevirt.io/v1",
        "vm1",
    )


def test_foreign_claim_found_on_already_exists_is_not_adopted(world: vm.World) -> None:
    world.admitted_vmi()
    world.api.add(GPUClaim, vm.claim("vm1-gpu-1"))  # not in the cache yet

    result = world.template_claims().reconcile((vm.NS, "vm1"))

    assert vm.requeue(result) == template_claims.CONFLICT_RECHECK
    assert [c[0] for c in world.api.writes()] == ["create"]
    assert world.recorder.reasons() == ["TemplateClaimConflict"]


def test_nothing_is_created_with_gpu_for_vms_off() -> None:
    world = vm.World(gpu_for_vms=False)
    world.admitted_vmi()

    assert world.template_claims().reconcile((vm.NS, "vm1")) is None
    assert world.api.writes() == []


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(vm.vmi(deleting=True), id="deleting"),
        pytest.param(vm.vmi(phase="Failed"), id="finished"),
        pytest.param(vm.vmi(refs=[{"claim": "hold-a"}]), id="no-template"),
    ],
)
def test_no_template_claim_for_vmis_that_need_none(world: vm.World, obj: vm.Obj) -> None:
    world.put_vmi(obj)
    assert world.template_claims().reconcile((vm.NS, "vm1")) is None
    assert world.api.writes() == []


@pytest.mark.parametrize(
    ("make", "words"),
    [
        pytest.param(
            lambda w: w.put_claim(vm.claim("hold-a")) and w.put_vmi(vm.vmi()),
            "spec.domain.devices.gpus: 0 entries, not the 3 entries the VMI webhook writes",
            id="never-judged-by-the-webhook",
        ),
        pytest.param(
            lambda w: w.admitted_vmi(
                refs=[{"claim": "hold-a"}, {"claimTemplate": {"className": "a10", "count": 5}}]
            ),
            "claimTemplate.count: 5 GPUs of class a10 could never fit on one node: the most "
            "one node serving class a10 has allocatable is 4",
            id="could-never-fit",
        ),
        pytest.param(
            lambda w: (
                w.admitted_vmi(
                    refs=[{"claim": "hold-a"}, {"claimTemplate": {"className": "a10", "count": 5}}]
                )
                and w.caches.classes.store.put(objects.gpuclass(maxCount=1))
            ),
            "claimTemplate.count: class a10 allows at most 1 GPU per claim",
            id="above-max-count",
        ),
        pytest.param(
            lambda w: (
                w.admitted_vmi()
                and w.caches.classes.store.put(objects.gpuclass(mode="vgpu", profile="A10-4Q"))
            ),
            f"class a10 is a vGPU class; namespace {vm.NS} is not entitled",
            id="vgpu-not-entitled",
        ),
    ],
)
def test_references_not_admitted_as_they_stand_order_nothing(
    world: vm.World, make: Callable[[vm.World], Any], words: str
) -> None:
    """A VMI labelled after its create (the webhook skipped it), or whose template the
    webhook would refuse now, gets no claim: a Warning Event says why, once."""
    make(world)
    controller = world.template_claims()

    assert vm.requeue(controller.reconcile((vm.NS, "vm1"))) == template_claims.CONFLICT_RECHECK
    assert vm.requeue(controller.reconcile((vm.NS, "vm1"))) == template_claims.CONFLICT_RECHECK

    assert [c for c in world.api.calls if c[0] == "create"] == []
    refused = [e for e in world.recorder.events if e["reason"] == "TemplateClaimRefused"]
    assert len(refused) == 1, world.recorder.events
    assert (refused[0]["type"], refused[0]["kind"]) == ("Warning", "VirtualMachineInstance")
    assert words in refused[0]["message"], refused[0]["message"]


def test_a_claim_made_earlier_is_kept_when_the_judgement_changes(world: vm.World) -> None:
    world.admitted_vmi()
    controller = world.template_claims()
    controller.reconcile((vm.NS, "vm1"))
    world.sync_claim("vm1-gpu-1")
    world.caches.classes.store.put(objects.gpuclass(maxCount=1))  # now too many

    assert controller.reconcile((vm.NS, "vm1")) is None
    assert ("GPUClaim", vm.NS, "vm1-gpu-1") in world.api.objects
    assert [c[0] for c in world.api.writes()] == ["create"]


def test_claims_map_to_their_owning_vmi() -> None:
    assert template_claims.owning_vmi(vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID)) == [
        (vm.NS, "vm1")
    ]
    assert template_claims.owning_vmi(vm.claim("hold-a")) == []
