"""The controllers for VMs on claims, on in-memory caches: template claims (created
once, owned by the VMI, never adopted when foreign, nothing with gpuForVMs off), attachments
(UID filled, stale attachments cleared at once, unconfirmed ones only after the grace,
restored when a live VMI uses the claim, kept while the VMI is being deleted), claim
protection (a claim serving a VMI not yet gone keeps its finalizer) and placement (pin and
ungate in one write when the set is on one node, waiting while it is not bound, gathering a
split set where it fits, a refused pinned pod recorded with expiry and deleted, migration
targets never touched).

Real ``Store``s (through the real shared-cache registration) and a real ``Ledger``; the
API server is the harness's fake (``harness.offline.FakeApi``): it keeps objects, applies
merge patches, honours resourceVersion and UID preconditions, and records every call.
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Callable
from typing import Any, cast

import pykube
import pytest

from controllers import attachments, claim_protection, placement, template_claims
from gpuoperator import claim_status, names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.ledger import Ledger
from gpuoperator.model import launcher_pods, references, slimming, templates, vmi_admission
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.recording import Recorder
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import FakeApi, FakeRecorder, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
A10 = "nvidia.com/GA102GL_A10"
VMI_UID = "uid-vm1"
GATE = names.PLACEMENT_GATE
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


# -- objects ----------------------------------------------------------------------------------

TEMPLATE = objects.TEMPLATE
A10_CLASS = objects.gpuclass()
vmi = functools.partial(
    objects.vmi, refs=[{"claim": "hold-a"}, {"claimTemplate": TEMPLATE}], uid=VMI_UID
)
claim = functools.partial(
    objects.claim,
    rv="11",
    generation=1,
    finalizers=[names.CLAIM_PROTECTION_FINALIZER],
    created="2026-01-01T00:00:00Z",
)
launcher_pod = objects.launcher_pod


def gpu_node(name: str) -> Obj:
    return objects.node(name, 4, labels={"kubernetes.io/hostname": name})


# -- a world ----------------------------------------------------------------------------------


class World:
    def __init__(self, *, gpu_for_vms: bool = True) -> None:
        self.caches = offline_caches()
        self.api = FakeApi()
        self.recorder = FakeRecorder()
        self.clock = FakeClock(START)
        self.settings = Settings.model_validate({"gpuForVMs": gpu_for_vms, "refusalTTL": "10m"})
        self.inventory = Ledger()
        self.inventory.apply_class(A10_CLASS)
        self.inventory.apply_node(gpu_node("n1"))
        self.inventory.apply_node(gpu_node("n2"))
        self.caches.classes.store.put(A10_CLASS)

    @property
    def writer(self) -> Client:
        return cast("Client", self.api)

    @property
    def events(self) -> Recorder:
        return cast("Recorder", self.recorder)

    def put_claim(self, obj: Obj) -> Obj:
        """The claim as the API server and the caches (and so the inventory) have it."""
        stored = self.api.add(GPUClaim, obj)
        cached = slimming.slim_claim(stored)
        self.caches.claims.store.put(cached)
        self.inventory.apply_claim(cached)
        return stored

    def sync_claim(self, name: str) -> Obj:
        """Deliver the API server's current claim to the cache, as a watch would."""
        stored = copy.deepcopy(self.api.objects[("GPUClaim", NS, name)])
        cached = slimming.slim_claim(stored)
        self.caches.claims.store.put(cached)
        self.inventory.apply_claim(cached)
        return stored

    def put_vmi(self, obj: Obj) -> Obj:
        stored = self.api.add(VirtualMachineInstance, obj)
        self.caches.vmis.store.put(slimming.slim_vmi(stored))
        return stored

    def put_pod(self, obj: Obj) -> Obj:
        stored = self.api.add(pykube.Pod, obj)
        self.caches.pods.store.put(slimming.slim_pod(stored))
        return stored

    def template_claims(self) -> template_claims.TemplateClaims:
        return template_claims.TemplateClaims(
            self.caches, self.inventory, self.writer, self.events, self.settings
        )

    def admitted_vmi(self, **kwargs: Any) -> Obj:
        """The test VMI as the VMI webhook admitted it: its held claim hold-a exists, and its
        gpus entries are the webhook's for its references."""
        if self.caches.claims.store.get((NS, "hold-a")) is None:
            self.put_claim(claim("hold-a"))
        obj = vmi(**kwargs)
        refs = references.from_object(obj)
        claims = {c["metadata"]["name"]: c for c in self.caches.claims.store.values()}
        entries = vmi_admission.gpu_entries(refs, {"a10": A10_CLASS}, claims)
        obj["spec"] = {"domain": {"devices": {"gpus": entries}}}
        return self.put_vmi(obj)

    def attachments(self, grace: float = 30.0) -> attachments.Attachments:
        return attachments.Attachments(
            self.caches, self.writer, self.events, self.settings, clock=self.clock, grace=grace
        )

    def protection(self) -> claim_protection.ClaimProtection:
        return claim_protection.ClaimProtection(self.caches, self.writer, self.events)

    def placement(self) -> placement.Placement:
        statuses = claim_status.ClaimStatus(self.writer, self.inventory, self.events)
        return placement.Placement(
            self.caches,
            self.inventory,
            self.writer,
            statuses,
            self.events,
            self.settings,
            clock=self.clock,
        )


@pytest.fixture
def world() -> World:
    return World()


def free_units(world: World, node: str) -> int:
    """The inventory's free units of class a10 on ``node``."""
    view = world.inventory.node(node)
    assert view is not None
    [entry] = [c for c in view.classes if c["name"] == "a10"]
    return entry["free"]


def requeue(result: Result | None) -> float | None:
    return None if result is None else result.requeue_after


# -- template claims --------------------------------------------------------------------------


def test_template_claim_is_created_once_marked_and_owned_by_the_vmi(world: World) -> None:
    world.admitted_vmi()
    controller = world.template_claims()

    assert controller.reconcile((NS, "vm1")) is None

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
            "uid": VMI_UID,
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
        slimming.slim_claim(world.api.objects[("GPUClaim", NS, "vm1-gpu-1")])
    )
    assert controller.reconcile((NS, "vm1")) is None
    assert controller.reconcile((NS, "vm1")) is None
    assert len([c for c in world.api.calls if c[0] == "create"]) == 1


def test_template_claim_behind_the_cache_is_recognised_after_already_exists(world: World) -> None:
    vm = world.admitted_vmi()
    controller = world.template_claims()
    controller.reconcile((NS, "vm1"))
    world.recorder.events.clear()

    # Another pass before the watch delivered the claim: AlreadyExists, then a read shows
    # it is this VMI's own claim — no conflict reported.
    assert controller.reconcile((NS, "vm1")) is None
    assert world.recorder.events == []
    assert templates.is_template_claim_of(world.api.objects[("GPUClaim", NS, "vm1-gpu-1")], vm)


@pytest.mark.parametrize(
    "foreign",
    [
        pytest.param(claim("vm1-gpu-1"), id="tenant-claim"),
        pytest.param(claim("vm1-gpu-1", owner_uid="uid-earlier-vm1"), id="earlier-vmi"),
    ],
)
def test_foreign_claim_of_the_template_name_is_never_adopted(world: World, foreign: Obj) -> None:
    world.admitted_vmi()
    stored = world.put_claim(foreign)

    result = world.template_claims().reconcile((NS, "vm1"))

    assert requeue(result) == template_claims.CONFLICT_RECHECK
    assert world.api.writes() == []
    assert world.api.objects[("GPUClaim", NS, "vm1-gpu-1")] == stored
    event = world.recorder.events[-1]
    assert (event["type"], event["reason"]) == ("Warning", "TemplateClaimConflict")
    assert (event["kind"], event["apiVersion"], event["name"]) == (
        "VirtualMachineInstance",
        "kubevirt.io/v1",
        "vm1",
    )


def test_foreign_claim_found_on_already_exists_is_not_adopted(world: World) -> None:
    world.admitted_vmi()
    world.api.add(GPUClaim, claim("vm1-gpu-1"))  # not in the cache yet

    result = world.template_claims().reconcile((NS, "vm1"))

    assert requeue(result) == template_claims.CONFLICT_RECHECK
    assert [c[0] for c in world.api.writes()] == ["create"]
    assert world.recorder.reasons() == ["TemplateClaimConflict"]


def test_nothing_is_created_with_gpu_for_vms_off() -> None:
    world = World(gpu_for_vms=False)
    world.admitted_vmi()

    assert world.template_claims().reconcile((NS, "vm1")) is None
    assert world.api.writes() == []


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(vmi(deleting=True), id="deleting"),
        pytest.param(vmi(phase="Failed"), id="finished"),
        pytest.param(vmi(refs=[{"claim": "hold-a"}]), id="no-template"),
    ],
)
def test_no_template_claim_for_vmis_that_need_none(world: World, obj: Obj) -> None:
    world.put_vmi(obj)
    assert world.template_claims().reconcile((NS, "vm1")) is None
    assert world.api.writes() == []


@pytest.mark.parametrize(
    ("make", "words"),
    [
        pytest.param(
            lambda w: w.put_claim(claim("hold-a")) and w.put_vmi(vmi()),
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
            f"class a10 is a vGPU class; namespace {NS} is not entitled",
            id="vgpu-not-entitled",
        ),
    ],
)
def test_references_not_admitted_as_they_stand_order_nothing(
    world: World, make: Callable[[World], Any], words: str
) -> None:
    """A VMI labelled after its create (the webhook skipped it), or whose template the
    webhook would refuse now, gets no claim: a Warning Event says why, once."""
    make(world)
    controller = world.template_claims()

    assert requeue(controller.reconcile((NS, "vm1"))) == template_claims.CONFLICT_RECHECK
    assert requeue(controller.reconcile((NS, "vm1"))) == template_claims.CONFLICT_RECHECK

    assert [c for c in world.api.calls if c[0] == "create"] == []
    refused = [e for e in world.recorder.events if e["reason"] == "TemplateClaimRefused"]
    assert len(refused) == 1, world.recorder.events
    assert (refused[0]["type"], refused[0]["kind"]) == ("Warning", "VirtualMachineInstance")
    assert words in refused[0]["message"], refused[0]["message"]


def test_a_claim_made_earlier_is_kept_when_the_judgement_changes(world: World) -> None:
    world.admitted_vmi()
    controller = world.template_claims()
    controller.reconcile((NS, "vm1"))
    world.sync_claim("vm1-gpu-1")
    world.caches.classes.store.put(objects.gpuclass(maxCount=1))  # now too many

    assert controller.reconcile((NS, "vm1")) is None
    assert ("GPUClaim", NS, "vm1-gpu-1") in world.api.objects
    assert [c[0] for c in world.api.writes()] == ["create"]


def test_claims_map_to_their_owning_vmi() -> None:
    assert template_claims.owning_vmi(claim("vm1-gpu-1", owner_uid=VMI_UID)) == [(NS, "vm1")]
    assert template_claims.owning_vmi(claim("hold-a")) == []


# -- claim protection -------------------------------------------------------------------------


def deleting(obj: Obj) -> Obj:
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    return obj


def _finalizer_writes(world: World) -> list[list[str]]:
    return [
        c[3]["metadata"].get("finalizers", [])
        for c in world.api.calls
        if c[0] == "replace" and c[1] == "GPUClaim"
    ]


@pytest.mark.parametrize(
    ("obj", "user"),
    [
        pytest.param(
            claim("vm1-gpu-1", owner_uid=VMI_UID, phase="Bound", node="n1"),
            vmi(),
            id="a-template-claim-of-a-running-vmi",
        ),
        pytest.param(
            claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}, phase="Bound", node="n1"),
            vmi(deleting=True),
            id="a-held-claim-of-a-vmi-being-deleted",
        ),
        pytest.param(
            claim("vm1-gpu-1", owner_uid=VMI_UID, phase="Bound", node="n1"),
            vmi(deleting=True),
            id="a-template-claim-of-a-vmi-being-deleted",
        ),
        pytest.param(
            claim("hold-a", attached={"vmi": "vm1"}, phase="Bound", node="n1"),
            vmi(),
            id="a-held-claim-with-an-unconfirmed-attachment",
        ),
    ],
)
def test_a_deleted_claim_keeps_its_finalizer_while_its_vmi_is_not_gone(
    world: World, obj: Obj, user: Obj
) -> None:
    world.put_vmi(user)
    world.put_claim(deleting(obj))

    assert world.protection().reconcile((NS, obj["metadata"]["name"])) is None

    assert world.api.writes() == []
    assert world.recorder.reasons() == ["DeletionHeld"]
    assert "vm1" in world.recorder.events[0]["message"]


def test_a_held_deletion_is_reported_once_per_state(world: World) -> None:
    world.put_vmi(vmi())
    world.put_claim(deleting(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID})))
    protection = world.protection()

    protection.reconcile((NS, "hold-a"))
    protection.reconcile((NS, "hold-a"))
    assert world.recorder.reasons() == ["DeletionHeld"]

    world.put_vmi(vmi(deleting=True))  # the VM starts its shutdown: news
    protection.reconcile((NS, "hold-a"))
    assert world.recorder.reasons() == ["DeletionHeld", "DeletionHeld"]
    assert "is being deleted" in world.recorder.events[-1]["message"]


def test_a_deleted_claim_is_held_when_only_the_cache_lags_behind_its_vmi(world: World) -> None:
    world.api.add(VirtualMachineInstance, vmi())  # exists, not cached yet
    world.put_claim(deleting(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID})))

    world.protection().reconcile((NS, "hold-a"))
    assert world.api.writes() == []


@pytest.mark.parametrize(
    ("obj", "user"),
    [
        pytest.param(claim("vm1-gpu-1", owner_uid=VMI_UID), None, id="template-owner-gone"),
        pytest.param(
            claim("vm1-gpu-1", owner_uid=VMI_UID), vmi(uid="uid-new"), id="template-owner-replaced"
        ),
        pytest.param(
            claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}), None, id="attached-vmi-gone"
        ),
        pytest.param(claim("hold-a"), vmi(), id="no-user"),
    ],
)
def test_a_deleted_claim_is_released_once_its_vmi_is_gone(
    world: World, obj: Obj, user: Obj | None
) -> None:
    if user is not None:
        world.put_vmi(user)
    world.put_claim(deleting(obj))

    world.protection().reconcile((NS, obj["metadata"]["name"]))

    assert _finalizer_writes(world) == [[]]


def test_a_vmi_deleted_in_the_foreground_releases_its_template_claims_once_its_pods_are_gone(
    world: World,
) -> None:
    """The garbage collector waits for the claim (blockOwnerDeletion): waiting for the VMI
    in turn would deadlock; once no pod of the VMI is left, nothing holds the GPU."""
    foreground = vmi(deleting=True)
    foreground["metadata"]["finalizers"] = ["foregroundDeletion"]
    world.put_vmi(foreground)
    world.put_claim(deleting(claim("vm1-gpu-1", owner_uid=VMI_UID)))
    pod = world.put_pod(launcher_pod(gated=False))

    world.protection().reconcile((NS, "vm1-gpu-1"))
    assert world.api.writes() == []

    world.caches.pods.store.remove((NS, pod["metadata"]["name"]))
    world.protection().reconcile((NS, "vm1-gpu-1"))
    assert _finalizer_writes(world) == [[]]


def test_a_new_claim_gets_the_protection_finalizer(world: World) -> None:
    fresh = claim("hold-a")
    fresh["metadata"]["finalizers"] = []
    world.put_claim(fresh)

    world.protection().reconcile((NS, "hold-a"))
    assert _finalizer_writes(world) == [[names.CLAIM_PROTECTION_FINALIZER]]


def test_vmis_map_to_the_claims_they_own_or_are_attached_to(world: World) -> None:
    world.put_claim(claim("vm1-gpu-1", owner_uid=VMI_UID))
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))
    world.put_claim(claim("hold-b", attached={"vmi": "vm2"}))
    world.put_claim(claim("hold-c"))

    assert claim_protection.claims_of_vmi(world.caches, vmi()) == [
        (NS, "hold-a"),
        (NS, "vm1-gpu-1"),
    ]


# -- attachments ------------------------------------------------------------------------------


def _attachment_patches(world: World) -> list[Any]:
    return [c[3] for c in world.api.calls if c[0] == "patch" and c[1] == "GPUClaim"]


def test_attachment_uid_is_filled_once_the_vmi_exists(world: World) -> None:
    world.put_vmi(vmi())
    stored = world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))

    assert world.attachments().reconcile((NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["subresource"] == "status"
    assert patch["body"]["metadata"] == {"resourceVersion": stored["metadata"]["resourceVersion"]}
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}
    assert world.recorder.reasons() == ["Attached"]


def test_confirmed_attachment_of_a_live_vmi_is_left_alone(world: World) -> None:
    world.put_vmi(vmi())
    world.put_claim(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}))

    assert world.attachments().reconcile((NS, "hold-a")) is None
    assert world.api.calls == []


@pytest.mark.parametrize(
    ("live", "reason"),
    [
        pytest.param(None, "VMDeleted", id="deleted"),
        pytest.param(vmi(uid="uid-new"), "VMReplaced", id="other-uid"),
    ],
)
def test_stale_confirmed_attachment_is_cleared(world: World, live: Obj | None, reason: str) -> None:
    if live is not None:
        world.put_vmi(live)
    stored = world.put_claim(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}))

    assert world.attachments().reconcile((NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["metadata"] == {"resourceVersion": stored["metadata"]["resourceVersion"]}
    assert patch["body"]["status"]["attachment"] is None
    assert attached_condition(world, "hold-a")[:2] == ("False", "NotAttached")
    assert "attachment" not in world.api.objects[("GPUClaim", NS, "hold-a")]["status"]
    assert world.recorder.reasons() == ["Detached"]
    assert stale_message_mentions(world, reason)


def attached_condition(world: World, name: str) -> tuple[str, str, str]:
    """The stored claim's ``Attached`` condition: status, reason, message."""
    found = [
        c
        for c in world.api.objects[("GPUClaim", NS, name)]["status"].get("conditions", [])
        if c["type"] == "Attached"
    ]
    assert len(found) == 1, found
    return (found[0]["status"], found[0]["reason"], found[0]["message"])


def stale_message_mentions(world: World, reason: str) -> bool:
    words = {
        "VMDeleted": "no longer exists",
        "VMReplaced": "now has uid",
    }
    return words[reason] in world.recorder.events[-1]["message"]


def test_attachment_to_a_vmi_being_deleted_is_kept_until_it_is_gone(world: World) -> None:
    """Its launcher pod may still hold the GPU during the VM's graceful shutdown."""
    world.put_vmi(vmi(deleting=True))
    world.put_claim(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}))

    assert world.attachments().reconcile((NS, "hold-a")) is None
    assert world.api.writes() == []


def test_unconfirmed_attachment_to_a_vmi_being_deleted_is_confirmed(world: World) -> None:
    world.put_vmi(vmi(deleting=True))
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))

    assert world.attachments().reconcile((NS, "hold-a")) is None
    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}


def test_attachment_is_kept_when_only_the_cache_lags(world: World) -> None:
    world.api.add(VirtualMachineInstance, vmi())  # exists, not cached yet
    world.put_claim(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}))

    assert world.attachments().reconcile((NS, "hold-a")) is None
    assert world.api.writes() == []


def test_unconfirmed_attachment_is_cleared_only_after_the_grace(world: World) -> None:
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()

    assert requeue(controller.reconcile((NS, "hold-a"))) == 30.0
    world.clock.advance(10)
    assert requeue(controller.reconcile((NS, "hold-a"))) == pytest.approx(20.0)
    assert world.api.calls == []

    world.clock.advance(20)
    assert controller.reconcile((NS, "hold-a")) is None

    assert [c[0] for c in world.api.calls] == ["get", "patch"]  # a live read, then the clear
    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] is None
    assert "was not created" in world.recorder.events[-1]["message"]


def test_unconfirmed_attachment_is_confirmed_when_the_vmi_appears(world: World) -> None:
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()
    controller.reconcile((NS, "hold-a"))

    world.put_vmi(vmi())  # the create completes within the grace
    assert controller.reconcile((NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}


def test_unconfirmed_attachment_restarts_its_grace_when_the_claim_changes(world: World) -> None:
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}, rv="11"))
    controller = world.attachments()
    controller.reconcile((NS, "hold-a"))
    world.clock.advance(29)

    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))  # rewritten: a new version
    world.clock.advance(2)
    assert requeue(controller.reconcile((NS, "hold-a"))) == 30.0
    assert world.api.writes() == []


def test_attachment_to_a_vmi_that_does_not_use_the_claim_is_not_confirmed(world: World) -> None:
    world.put_vmi(vmi(refs=[{"claimTemplate": TEMPLATE}]))
    world.put_claim(claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()

    assert requeue(controller.reconcile((NS, "hold-a"))) == 30.0
    world.clock.advance(30)
    controller.reconcile((NS, "hold-a"))

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] is None


def test_clear_that_loses_a_race_writes_nothing_else(world: World) -> None:
    world.put_claim(claim("hold-a", attached={"vmi": "vm1", "uid": VMI_UID}))
    world.api.conflict_next.add("patch")

    assert world.attachments().reconcile((NS, "hold-a")) is None
    assert world.recorder.events == []


def test_a_held_claim_is_attached_by_name_and_uid_once_its_vmi_exists(world: World) -> None:
    world.put_vmi(vmi())
    world.put_claim(claim("hold-a", phase="Bound", node="n1"))

    assert world.attachments().reconcile((NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}
    assert attached_condition(world, "hold-a") == (
        "True",
        "Attached",
        f"attached to VM instance vm1 (uid {VMI_UID})",
    )
    stored = world.api.objects[("GPUClaim", NS, "hold-a")]
    assert (stored["status"]["phase"], stored["status"]["nodeName"]) == ("Bound", "n1")
    assert world.recorder.reasons() == ["Attached"]


def _aged(name: str, uid: str, created: str, **kwargs: Any) -> Obj:
    obj = vmi(name=name, uid=uid, **kwargs)
    obj["metadata"]["creationTimestamp"] = created
    return obj


@pytest.mark.parametrize(
    ("first", "second", "holder"),
    [
        pytest.param(
            ("vm-b", "u-b", "2026-01-01T00:00:01Z"),
            ("vm-a", "u-a", "2026-01-01T00:00:02Z"),
            "vm-b",
            id="older-by-creation-time",
        ),
        pytest.param(
            ("vm-b", "u-b", "2026-01-01T00:00:01Z"),
            ("vm-a", "u-a", "2026-01-01T00:00:01Z"),
            "vm-a",
            id="same-second-by-name",
        ),
    ],
)
def test_of_two_vmis_for_one_held_claim_the_older_gets_it_and_the_other_is_told(
    world: World, first: tuple[str, str, str], second: tuple[str, str, str], holder: str
) -> None:
    for name, uid, created in (first, second):
        world.put_vmi(_aged(name, uid, created))
    world.put_claim(claim("hold-a", phase="Bound", node="n1"))

    assert world.attachments().reconcile((NS, "hold-a")) is None

    other = ({first[0], second[0]} - {holder}).pop()
    stored = world.api.objects[("GPUClaim", NS, "hold-a")]
    assert stored["status"]["attachment"]["vmi"] == holder
    status, reason, message = attached_condition(world, "hold-a")
    assert (status, reason) == ("True", "VMsWaiting")
    assert f"attached to VM instance {holder}" in message
    assert f"also named by VM instance {other}, which waits" in message
    [told] = [e for e in world.recorder.events if e["reason"] == "ClaimInUse"]
    assert (told["kind"], told["name"], told["type"]) == (
        "VirtualMachineInstance",
        other,
        "Warning",
    )
    assert f"claim hold-a is attached to VM instance {holder}" in told["message"]


@pytest.mark.parametrize(
    "old",
    [
        pytest.param({"phase": "Failed"}, id="finished"),
        pytest.param({"deleting": True}, id="being-deleted"),
    ],
)
def test_a_finished_or_departing_vmi_never_gets_a_claim(world: World, old: Obj) -> None:
    world.put_vmi(_aged("vm-old", "u-old", "2026-01-01T00:00:01Z", **old))
    world.put_vmi(_aged("vm-new", "u-new", "2026-01-01T00:00:09Z"))
    world.put_claim(claim("hold-a"))

    world.attachments().reconcile((NS, "hold-a"))

    stored = world.api.objects[("GPUClaim", NS, "hold-a")]
    assert stored["status"]["attachment"] == {"vmi": "vm-new", "uid": "u-new"}


def test_an_attachment_is_never_moved_to_an_older_vmi_seen_later(world: World) -> None:
    world.put_vmi(_aged("vm-b", "u-b", "2026-01-01T00:00:05Z"))
    world.put_claim(claim("hold-a", attached={"vmi": "vm-b", "uid": "u-b"}))
    world.put_vmi(_aged("vm-a", "u-a", "2026-01-01T00:00:01Z"))
    controller = world.attachments()

    assert controller.reconcile((NS, "hold-a")) is None
    stored = world.sync_claim("hold-a")
    assert stored["status"]["attachment"] == {"vmi": "vm-b", "uid": "u-b"}
    assert attached_condition(world, "hold-a")[1] == "VMsWaiting"
    assert [e["name"] for e in world.recorder.events if e["reason"] == "ClaimInUse"] == ["vm-a"]

    # Told once: the same waiters write nothing more.
    writes = len(world.api.writes())
    assert controller.reconcile((NS, "hold-a")) is None
    assert len(world.api.writes()) == writes


def test_the_waiting_vmi_gets_the_claim_once_the_holder_is_gone(world: World) -> None:
    world.put_vmi(_aged("vm-b", "u-b", "2026-01-01T00:00:05Z"))
    world.put_claim(claim("hold-a", attached={"vmi": "vm-a", "uid": "u-a"}))
    controller = world.attachments()

    controller.reconcile((NS, "hold-a"))  # vm-a is gone: cleared
    world.sync_claim("hold-a")
    controller.reconcile((NS, "hold-a"))  # then given to the one left

    stored = world.api.objects[("GPUClaim", NS, "hold-a")]
    assert stored["status"]["attachment"] == {"vmi": "vm-b", "uid": "u-b"}
    assert attached_condition(world, "hold-a")[:2] == ("True", "Attached")


def test_vmis_map_to_attached_and_referenced_claims(world: World) -> None:
    world.put_claim(claim("other", attached={"vmi": "vm1"}))
    world.put_claim(claim("unrelated"))
    assert attachments.claims_of_vmi(world.caches, vmi()) == [(NS, "hold-a"), (NS, "other")]


# -- placement --------------------------------------------------------------------------------


def bound_set(world: World, hold_node: str = "n1", template_node: str = "n1") -> None:
    world.put_vmi(vmi())
    world.put_claim(
        claim("hold-a", phase="Bound", node=hold_node, attached={"vmi": "vm1", "uid": VMI_UID})
    )
    world.put_claim(
        claim("vm1-gpu-1", count=2, phase="Bound", node=template_node, owner_uid=VMI_UID)
    )


POD = (NS, "virt-launcher-vm1-abcde")
OURS = {"vmi": "vm1", "uid": VMI_UID}


def test_pod_is_pinned_and_ungated_in_one_write(world: World) -> None:
    bound_set(world)
    pod = world.put_pod(launcher_pod())

    assert world.placement().reconcile(POD) is None

    [write] = world.api.writes()
    verb, kind, name, payload = write
    assert (verb, kind, name) == ("patch", "Pod", POD[1])
    body = payload["body"]
    assert body["metadata"] == {"resourceVersion": pod["metadata"]["resourceVersion"]}
    assert body["spec"]["schedulingGates"] == [{"name": "other.example.com/gate"}]
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
    assert "podAntiAffinity" in body["spec"]["affinity"]  # cached with the gated pod, kept
    assert [c[0] for c in world.api.calls] == ["patch"]  # built from the cache, nothing read
    pinned = world.api.objects[("Pod", NS, POD[1])]
    assert launcher_pods.pinned_node(pinned) == "n1"
    assert not launcher_pods.is_gated(pinned)
    event = world.recorder.events[-1]
    assert (event["reason"], event["kind"], event["name"]) == ("Pinned", "Pod", POD[1])


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        pytest.param(
            lambda w: w.put_claim(claim("hold-a", phase="Pending", attached=OURS)),
            "hold-a is Pending",
            id="pending",
        ),
        pytest.param(
            lambda w: w.put_claim(claim("hold-a", phase="Bound", node="n1", attached=OURS)),
            "vm1-gpu-1 does not exist yet",
            id="template-claim-missing",
        ),
        pytest.param(
            lambda w: w.put_claim(claim("hold-a", phase="Bound", node="n1")),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-not-attached-yet",
        ),
        pytest.param(
            lambda w: w.put_claim(
                claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm1", "uid": "old"})
            ),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-attached-to-an-earlier-vmi-of-this-name",
        ),
        pytest.param(
            lambda w: w.put_claim(
                claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm1"})
            ),
            "claim hold-a is not attached to this VM instance yet",
            id="held-claim-attachment-without-uid",
        ),
    ],
)
def test_pod_waits_gated_until_every_claim_is_bound(
    world: World, setup: Callable[[World], Any], words: str
) -> None:
    world.put_vmi(vmi())
    setup(world)
    world.put_pod(launcher_pod())
    controller = world.placement()

    assert requeue(controller.reconcile(POD)) == placement.WAIT_RECHECK
    assert requeue(controller.reconcile(POD)) == placement.WAIT_RECHECK

    assert world.api.calls == []  # not even a read of the pod
    assert world.recorder.reasons() == ["WaitingForPlacement"]  # once per message
    assert words in world.recorder.events[0]["message"]


def test_pod_waits_while_a_claim_is_attached_to_another_live_vm(world: World) -> None:
    world.put_vmi(vmi())
    world.put_vmi(vmi(name="vm2", uid="uid-vm2"))
    world.put_claim(
        claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm2", "uid": "uid-vm2"})
    )
    world.put_claim(claim("vm1-gpu-1", count=2, phase="Bound", node="n1", owner_uid=VMI_UID))
    world.put_pod(launcher_pod())

    assert requeue(world.placement().reconcile(POD)) == placement.WAIT_RECHECK
    assert world.api.writes() == []
    assert (
        "attached to VM instance vm2, which still exists; this VM instance waits"
        in (world.recorder.events[-1]["message"])
    )


def test_pod_waits_for_its_own_template_claim_not_an_earlier_vmis(world: World) -> None:
    world.put_vmi(vmi())
    world.put_claim(claim("hold-a", phase="Bound", node="n1"))
    world.put_claim(claim("vm1-gpu-1", count=2, phase="Bound", node="n1", owner_uid="uid-old"))
    world.put_pod(launcher_pod())

    assert requeue(world.placement().reconcile(POD)) == placement.WAIT_RECHECK
    assert world.api.writes() == []


def test_split_set_is_gathered_where_it_fits_then_pinned(world: World) -> None:
    bound_set(world, hold_node="n1", template_node="n2")
    world.put_pod(launcher_pod())
    controller = world.placement()

    assert requeue(controller.reconcile(POD)) == placement.WAIT_RECHECK

    [(verb, _kind, name, moved)] = world.api.writes()
    assert (verb, name) == ("replace_status", "hold-a")  # the smaller share moves
    assert moved["status"]["nodeName"] == "n2"
    assert moved["status"]["phase"] == "Bound"
    assert moved["status"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}
    bound = next(c for c in moved["status"]["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"]) == ("True", "Moved")
    assert free_units(world, "n2") == 1
    assert free_units(world, "n1") == 4
    assert "Moved" in world.recorder.reasons()

    world.sync_claim("hold-a")
    assert controller.reconcile(POD) is None
    assert launcher_pods.pinned_node(world.api.objects[("Pod", NS, POD[1])]) == "n2"


def test_split_set_that_fits_nowhere_waits_gated(world: World) -> None:
    bound_set(world, hold_node="n1", template_node="n2")
    # Fill both nodes: n1 keeps 1 free (needs 2 for the template), n2 keeps 0 (needs 1).
    world.put_claim(claim("big-1", count=2, phase="Bound", node="n1"))
    world.put_claim(claim("big-2", count=1, phase="Bound", node="n1"))
    world.put_claim(claim("big-3", count=2, phase="Bound", node="n2"))
    world.put_pod(launcher_pod())

    assert requeue(world.placement().reconcile(POD)) == placement.WAIT_RECHECK

    assert world.api.writes() == []
    event = world.recorder.events[-1]
    assert (event["type"], event["reason"]) == ("Warning", "WaitingForPlacement")
    assert "different nodes" in event["message"]
    assert f"1 unit of {A10} needed, 0 free" in event["message"]


def test_split_set_is_not_moved_to_a_node_a_claim_refused(world: World) -> None:
    bound_set(world, hold_node="n1", template_node="n2")
    refused = world.caches.claims.store.get((NS, "hold-a"))
    assert refused is not None
    world.put_claim(
        {
            **refused,
            "status": {
                **refused["status"],
                "refusedNodes": [{"nodeName": "n2", "until": "2026-01-01T00:05:00Z"}],
            },
        }
    )
    world.put_pod(launcher_pod())

    world.placement().reconcile(POD)

    # n2 is skipped for hold-a; the template claim moves to n1 instead (n1 has 3 free).
    [(verb, _kind, name, moved)] = world.api.writes()
    assert (verb, name, moved["status"]["nodeName"]) == ("replace_status", "vm1-gpu-1", "n1")


def test_pin_on_a_stale_cache_reads_the_pod_and_pins_it_at_once(world: World) -> None:
    bound_set(world)
    world.put_pod(launcher_pod())
    newer = world.api.stored(pykube.Pod, POD[1], NS)
    assert newer is not None
    newer["metadata"]["labels"]["example.com/changed"] = "yes"
    world.api.add(pykube.Pod, newer)  # the API server is one version ahead of the cache

    assert world.placement().reconcile(POD) is None

    assert [c[0] for c in world.api.calls] == ["patch", "get", "patch"]
    pinned = world.api.objects[("Pod", NS, POD[1])]
    assert launcher_pods.pinned_node(pinned) == "n1"
    assert not launcher_pods.is_gated(pinned)
    assert pinned["metadata"]["labels"]["example.com/changed"] == "yes"


def test_pin_that_loses_a_race_looks_again(world: World) -> None:
    bound_set(world)
    world.put_pod(launcher_pod())
    world.api.refuse[("patch", NS)] = errors.ConflictError(409, "Conflict", "modified")

    assert requeue(world.placement().reconcile(POD)) == placement.RETRY
    assert [c[0] for c in world.api.calls] == ["patch", "get", "patch"]
    assert world.recorder.events == []


def test_a_pinned_pod_is_not_judged_again_while_the_cache_lags(world: World) -> None:
    bound_set(world)
    world.put_pod(launcher_pod())
    controller = world.placement()
    assert controller.reconcile(POD) is None
    calls = len(world.api.calls)

    # A claim's update brings the pod back while the cache still shows it gated.
    assert controller.reconcile(POD) is None
    assert len(world.api.calls) == calls

    # Once the cache has the pinned pod, nothing is remembered of it; a new pod of the
    # same name (another uid) is judged afresh.
    controller.seen_unwatched(POD)
    world.put_pod(launcher_pod() | {"metadata": {**launcher_pod()["metadata"], "uid": "u2"}})
    assert controller.reconcile(POD) is None
    assert len(world.api.calls) == calls + 1


def refused_world(world: World) -> Obj:
    bound_set(world)
    return world.put_pod(launcher_pod(gated=False, pinned_to="n1", unschedulable=True))


def test_refused_pinned_pod_records_the_refusal_and_is_deleted(world: World) -> None:
    pod = refused_world(world)

    assert world.placement().reconcile(POD) is None

    writes = world.api.writes()
    statuses = {c[2]: c[3]["status"] for c in writes if c[0] == "replace_status"}
    assert set(statuses) == {"hold-a", "vm1-gpu-1"}
    for status in statuses.values():
        assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2026-01-01T00:10:00Z"}]
        assert status["phase"] == "Pending"
        assert "nodeName" not in status
        bound = next(c for c in status["conditions"] if c["type"] == "Bound")
        assert (bound["status"], bound["reason"]) == ("False", "RefusedByNode")
    assert statuses["hold-a"]["attachment"] == {"vmi": "vm1", "uid": VMI_UID}
    # The pod went first, as it was read (its UID and resourceVersion as preconditions), and
    # only then were the claims unbound.
    assert writes[0] == (
        "delete",
        "Pod",
        POD[1],
        {"uid": f"uid-{POD[1]}", "resourceVersion": pod["metadata"]["resourceVersion"]},
    )
    assert ("Pod", NS, POD[1]) not in world.api.objects
    # The ledger released n1 at once.
    assert free_units(world, "n1") == 4
    assert world.recorder.reasons().count("RefusedByNode") == 3  # two claims and the VMI
    assert world.recorder.events[-1]["kind"] == "VirtualMachineInstance"


def test_refusal_waits_while_the_node_releases_gpus(world: World) -> None:
    refused_world(world)
    leaving = launcher_pod(name="virt-launcher-vm1-old", gated=False)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    leaving["spec"]["nodeName"] = "n1"
    leaving["status"] = {"phase": "Running"}
    world.put_pod(leaving)
    controller = world.placement()

    wait = requeue(controller.reconcile(POD))
    assert wait is not None
    assert 0 < wait <= placement.SETTLE
    assert world.api.writes() == []

    world.clock.advance(placement.SETTLE)
    assert controller.reconcile(POD) is None
    assert world.api.writes()[0][0] == "delete"


def test_a_refused_pod_the_scheduler_places_before_its_deletion_keeps_its_claims_bound(
    world: World,
) -> None:
    """kube-scheduler retries a refused pod by itself: one placed between the look and the
    deletion runs where its claims are bound, so neither the pod nor the claims are touched."""
    refused_world(world)

    def scheduled_meanwhile(read: Obj) -> None:
        placed = copy.deepcopy(read)
        placed["spec"]["nodeName"] = "n1"
        placed["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        world.api.add(pykube.Pod, placed)

    world.api.after_get[POD[1]] = scheduled_meanwhile
    controller = world.placement()

    assert requeue(controller.reconcile(POD)) == placement.RETRY

    assert [w[0] for w in world.api.writes()] == ["delete"]  # refused by its precondition
    assert world.api.stored(pykube.Pod, POD[1], NS) is not None
    for name in ("hold-a", "vm1-gpu-1"):
        stored = world.api.objects[("GPUClaim", NS, name)]
        assert stored["status"]["phase"] == "Bound"
        assert stored["status"]["nodeName"] == "n1"
        assert "refusedNodes" not in stored["status"]
    assert "RefusedByNode" not in world.recorder.reasons()
    assert free_units(world, "n1") == 1  # the set's 3 units stay held on n1

    # Looked at again, the pod is scheduled: nothing more to do.
    assert controller.reconcile(POD) is None
    assert [w[0] for w in world.api.writes()] == ["delete"]


def test_a_refusal_whose_claim_write_loses_a_race_is_recorded_on_the_next_look(
    world: World,
) -> None:
    refused_world(world)
    world.api.conflict_next.add("replace_status")
    controller = world.placement()

    assert requeue(controller.reconcile(POD)) == placement.RETRY
    assert ("Pod", NS, POD[1]) not in world.api.objects
    world.caches.pods.store.remove(POD)  # the watch delivers the deletion

    assert controller.reconcile(POD) is None

    for name in ("hold-a", "vm1-gpu-1"):
        status = world.api.objects[("GPUClaim", NS, name)]["status"]
        assert status["phase"] == "Pending"
        assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2026-01-01T00:10:00Z"}]
    assert world.recorder.events[-1]["kind"] == "VirtualMachineInstance"
    assert controller.reconcile(POD) is None  # nothing owed any more
    assert world.recorder.reasons().count("RefusedByNode") == 3


def test_refusal_waits_while_the_nodes_lifecycle_taint_lags_behind_its_ready_state(
    world: World,
) -> None:
    refused_world(world)
    lagging = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    world.caches.nodes.store.put(slimming.slim_node(objects.node("n1", 4, taints=[lagging])))
    controller = world.placement()

    wait = requeue(controller.reconcile(POD))
    assert wait is not None
    assert 0 < wait <= placement.SETTLE
    assert world.api.writes() == []

    world.caches.nodes.store.put(slimming.slim_node(objects.node("n1", 4, taints=[])))
    assert controller.reconcile(POD) is None
    assert world.api.writes()[0][0] == "delete"


#: What kube-scheduler said on a launcher pod pinned to a node its cache did not hold yet
#: (its node informer was catching up after an API server restart).
UNSEEN_NODE = (
    "0/7 nodes are available: 7 node(s) didn't satisfy plugin(s) [NodeAffinity]. no new "
    "claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not helpful "
    "for scheduling."
)


def refused_for(world: World, message: str, node_selector: dict[str, str] | None = None) -> None:
    """A pinned launcher pod kube-scheduler refused with ``message``; n1 in the node cache."""
    bound_set(world)
    pod = launcher_pod(gated=False, pinned_to="n1", unschedulable=True)
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    scheduled["message"] = message
    if node_selector is not None:
        pod["spec"]["nodeSelector"] = node_selector
    world.put_pod(pod)
    n1 = objects.node("n1", 4, labels={"kubernetes.io/hostname": "n1", "gpu": "a10"})
    world.caches.nodes.store.put(slimming.slim_node(n1))


def test_refusal_waits_while_the_scheduler_has_not_seen_the_node(world: World) -> None:
    """Node affinity as the scheduler's only reason, on a node that satisfies the pod's node
    selection: the scheduler's cache lacks the node; it places the pod once the node is there."""
    refused_for(world, UNSEEN_NODE)
    controller = world.placement()

    wait = requeue(controller.reconcile(POD))
    assert wait is not None
    assert 0 < wait <= placement.SETTLE
    assert world.api.writes() == []
    assert "RefusedByNode" not in world.recorder.reasons()

    world.clock.advance(placement.SETTLE)
    assert controller.reconcile(POD) is None
    assert world.api.writes()[0][0] == "delete"


@pytest.mark.parametrize(
    ("message", "node_selector"),
    [
        pytest.param(UNSEEN_NODE, {"gpu": "h100"}, id="the-pods-own-node-selector"),
        pytest.param(
            "0/7 nodes are available: 1 Insufficient cpu, 6 node(s) didn't satisfy plugin(s) "
            "[NodeAffinity]. preemption: 0/7 nodes are available: 7 Preemption is not helpful "
            "for scheduling.",
            None,
            id="another-reason",
        ),
    ],
)
def test_a_refusal_the_scheduler_meant_is_taken_at_once(
    world: World, message: str, node_selector: dict[str, str] | None
) -> None:
    refused_for(world, message, node_selector)

    assert world.placement().reconcile(POD) is None

    assert world.api.writes()[0][0] == "delete"
    assert world.recorder.reasons().count("RefusedByNode") == 3


def test_refused_pod_keeps_the_binding_of_a_claim_another_vm_uses(world: World) -> None:
    refused_world(world)
    world.put_vmi(vmi(name="vm2", uid="uid-vm2"))
    world.put_claim(
        claim("hold-a", phase="Bound", node="n1", attached={"vmi": "vm2", "uid": "uid-vm2"})
    )

    world.placement().reconcile(POD)

    written = [c[2] for c in world.api.writes() if c[0] == "replace_status"]
    assert written == ["vm1-gpu-1"]


def test_unschedulable_pod_the_operator_did_not_pin_is_left_alone(world: World) -> None:
    bound_set(world)
    world.put_pod(launcher_pod(gated=False, unschedulable=True))

    assert world.placement().reconcile(POD) is None
    assert world.api.writes() == []


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(launcher_pod(migration=True), id="gated-migration-target"),
        pytest.param(
            launcher_pod(migration=True, gated=False, pinned_to="n1", unschedulable=True),
            id="unschedulable-migration-target",
        ),
    ],
)
def test_migration_targets_are_never_touched(world: World, pod: Obj) -> None:
    bound_set(world)
    stored = world.put_pod(pod)

    assert world.placement().reconcile(POD) is None

    assert world.api.calls == []
    assert world.recorder.events == []
    assert world.api.objects[("Pod", NS, POD[1])] == stored
    assert not placement.watched(slimming.slim_pod(stored))


def test_claims_and_vmis_map_to_the_watched_launcher_pods(world: World) -> None:
    world.put_pod(launcher_pod())
    world.put_pod(launcher_pod(name="virt-launcher-vm1-target", migration=True))
    hold = claim("hold-a", attached={"vmi": "vm1"})
    template = claim("vm1-gpu-1", owner_uid=VMI_UID)

    assert placement.vmis_of_claim(hold) == {"vm1"}
    assert placement.vmis_of_claim(template) == {"vm1"}
    assert placement.pods_of_vmi(world.caches, NS, "vm1") == [POD]
    assert placement.pods_of_vmi(world.caches, NS, "vm2") == []
