"""Attachments (``controllers.attachments``): the UID filled once the VMI exists, stale
attachments cleared at once, unconfirmed ones only after the grace, restored when a live VMI
uses the claim, kept while the VMI is being deleted; of two VMIs for one held claim the
older gets it and the other is told."""

from __future__ import annotations

from typing import Any

import pytest

from controllers import attachments
from gpuoperator.kinds import VirtualMachineInstance
from harness import vm_controllers as vm


def _attachment_patches(world: vm.World) -> list[Any]:
    return [c[3] for c in world.api.calls if c[0] == "patch" and c[1] == "GPUClaim"]


def test_attachment_uid_is_filled_once_the_vmi_exists(world: vm.World) -> None:
    world.put_vmi(vm.vmi())
    stored = world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["subresource"] == "status"
    assert patch["body"]["metadata"] == {"resourceVersion": stored["metadata"]["resourceVersion"]}
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}
    assert world.recorder.reasons() == ["Attached"]


def test_confirmed_attachment_of_a_live_vmi_is_left_alone(world: vm.World) -> None:
    world.put_vmi(vm.vmi())
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None
    assert world.api.calls == []


@pytest.mark.parametrize(
    ("live", "reason"),
    [
        pytest.param(None, "VMDeleted", id="deleted"),
        pytest.param(vm.vmi(uid="uid-new"), "VMReplaced", id="other-uid"),
    ],
)
def test_stale_confirmed_attachment_is_cleared(
    world: vm.World, live: vm.Obj | None, reason: str
) -> None:
    if live is not None:
        world.put_vmi(live)
    stored = world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["metadata"] == {"resourceVersion": stored["metadata"]["resourceVersion"]}
    assert patch["body"]["status"]["attachment"] is None
    assert attached_condition(world, "hold-a")[:2] == ("False", "NotAttached")
    assert "attachment" not in world.api.objects[("GPUClaim", vm.NS, "hold-a")]["status"]
    assert world.recorder.reasons() == ["Detached"]
    assert stale_message_mentions(world, reason)


def attached_condition(world: vm.World, name: str) -> tuple[str, str, str]:
    """The stored claim's ``Attached`` condition: status, reason, message."""
    found = [
        c
        for c in world.api.objects[("GPUClaim", vm.NS, name)]["status"].get("conditions", [])
        if c["type"] == "Attached"
    ]
    assert len(found) == 1, found
    return (found[0]["status"], found[0]["reason"], found[0]["message"])


def stale_message_mentions(world: vm.World, reason: str) -> bool:
    words = {
        "VMDeleted": "no longer exists",
        "VMReplaced": "now has uid",
    }
    return words[reason] in world.recorder.events[-1]["message"]


def test_attachment_to_a_vmi_being_deleted_is_kept_until_it_is_gone(world: vm.World) -> None:
    """Its launcher pod may still hold the GPU during the VM's graceful shutdown."""
    world.put_vmi(vm.vmi(deleting=True))
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None
    assert world.api.writes() == []


def test_unconfirmed_attachment_to_a_vmi_being_deleted_is_confirmed(world: vm.World) -> None:
    world.put_vmi(vm.vmi(deleting=True))
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None
    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}


def test_attachment_is_kept_when_only_the_cache_lags(world: vm.World) -> None:
    world.api.add(VirtualMachineInstance, vm.vmi())  # exists, not cached yet
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None
    assert world.api.writes() == []


def test_unconfirmed_attachment_is_cleared_only_after_the_grace(world: vm.World) -> None:
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()

    assert vm.requeue(controller.reconcile((vm.NS, "hold-a"))) == 30.0
    world.clock.advance(10)
    assert vm.requeue(controller.reconcile((vm.NS, "hold-a"))) == pytest.approx(20.0)
    assert world.api.calls == []

    world.clock.advance(20)
    assert controller.reconcile((vm.NS, "hold-a")) is None

    assert [c[0] for c in world.api.calls] == ["get", "patch"]  # a live read, then the clear
    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] is None
    assert "was not created" in world.recorder.events[-1]["message"]


def test_unconfirmed_attachment_is_confirmed_when_the_vmi_appears(world: vm.World) -> None:
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()
    controller.reconcile((vm.NS, "hold-a"))

    world.put_vmi(vm.vmi())  # the create completes within the grace
    assert controller.reconcile((vm.NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}


def test_unconfirmed_attachment_restarts_its_grace_when_the_claim_changes(world: vm.World) -> None:
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}, rv="11"))
    controller = world.attachments()
    controller.reconcile((vm.NS, "hold-a"))
    world.clock.advance(29)

    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))  # rewritten: a new version
    world.clock.advance(2)
    assert vm.requeue(controller.reconcile((vm.NS, "hold-a"))) == 30.0
    assert world.api.writes() == []


def test_attachment_to_a_vmi_that_does_not_use_the_claim_is_not_confirmed(world: vm.World) -> None:
    world.put_vmi(vm.vmi(refs=[{"claimTemplate": vm.TEMPLATE}]))
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))
    controller = world.attachments()

    assert vm.requeue(controller.reconcile((vm.NS, "hold-a"))) == 30.0
    world.clock.advance(30)
    controller.reconcile((vm.NS, "hold-a"))

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] is None


def test_clear_that_loses_a_race_writes_nothing_else(world: vm.World) -> None:
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}))
    world.api.conflict_next.add("patch")

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None
    assert world.recorder.events == []


def test_a_held_claim_is_attached_by_name_and_uid_once_its_vmi_exists(world: vm.World) -> None:
    world.put_vmi(vm.vmi())
    world.put_claim(vm.claim("hold-a", phase="Bound", node="n1"))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None

    [patch] = _attachment_patches(world)
    assert patch["body"]["status"]["attachment"] == {"vmi": "vm1", "uid": vm.VMI_UID}
    assert attached_condition(world, "hold-a") == (
        "True",
        "Attached",
        f"attached to VM instance vm1 (uid {vm.VMI_UID})",
    )
    stored = world.api.objects[("GPUClaim", vm.NS, "hold-a")]
    assert (stored["status"]["phase"], stored["status"]["nodeName"]) == ("Bound", "n1")
    assert world.recorder.reasons() == ["Attached"]


def _aged(name: str, uid: str, created: str, **kwargs: Any) -> vm.Obj:
    obj = vm.vmi(name=name, uid=uid, **kwargs)
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
    world: vm.World, first: tuple[str, str, str], second: tuple[str, str, str], holder: str
) -> None:
    for name, uid, created in (first, second):
        world.put_vmi(_aged(name, uid, created))
    world.put_claim(vm.claim("hold-a", phase="Bound", node="n1"))

    assert world.attachments().reconcile((vm.NS, "hold-a")) is None

    other = ({first[0], second[0]} - {holder}).pop()
    stored = world.api.objects[("GPUClaim", vm.NS, "hold-a")]
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
def test_a_finished_or_departing_vmi_never_gets_a_claim(world: vm.World, old: vm.Obj) -> None:
    world.put_vmi(_aged("vm-old", "u-old", "2026-01-01T00:00:01Z", **old))
    world.put_vmi(_aged("vm-new", "u-new", "2026-01-01T00:00:09Z"))
    world.put_claim(vm.claim("hold-a"))

    world.attachments().reconcile((vm.NS, "hold-a"))

    stored = world.api.objects[("GPUClaim", vm.NS, "hold-a")]
    assert stored["status"]["attachment"] == {"vmi": "vm-new", "uid": "u-new"}


def test_an_attachment_is_never_moved_to_an_older_vmi_seen_later(world: vm.World) -> None:
    world.put_vmi(_aged("vm-b", "u-b", "2026-01-01T00:00:05Z"))
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm-b", "uid": "u-b"}))
    world.put_vmi(_aged("vm-a", "u-a", "2026-01-01T00:00:01Z"))
    controller = world.attachments()

    assert controller.reconcile((vm.NS, "hold-a")) is None
    stored = world.sync_claim("hold-a")
    assert stored["status"]["attachment"] == {"vmi": "vm-b", "uid": "u-b"}
    assert attached_condition(world, "hold-a")[1] == "VMsWaiting"
    assert [e["name"] for e in world.recorder.events if e["reason"] == "ClaimInUse"] == ["vm-a"]

    # Told once: the same waiters write nothing more.
    writes = len(world.api.writes())
    assert controller.reconcile((vm.NS, "hold-a")) is None
    assert len(world.api.writes()) == writes


def test_the_waiting_vmi_gets_the_claim_once_the_holder_is_gone(world: vm.World) -> None:
    world.put_vmi(_aged("vm-b", "u-b", "2026-01-01T00:00:05Z"))
    world.put_claim(vm.claim("hold-a", attached={"vmi": "vm-a", "uid": "u-a"}))
    controller = world.attachments()

    controller.reconcile((vm.NS, "hold-a"))  # vm-a is gone: cleared
    world.sync_claim("hold-a")
    controller.reconcile((vm.NS, "hold-a"))  # then given to the one left

    stored = world.api.objects[("GPUClaim", vm.NS, "hold-a")]
    assert stored["status"]["attachment"] == {"vmi": "vm-b", "uid": "u-b"}
    assert attached_condition(world, "hold-a")[:2] == ("True", "Attached")


def test_vmis_map_to_attached_and_referenced_claims(world: vm.World) -> None:
    world.put_claim(vm.claim("other", attached={"vmi": "vm1"}))
    world.put_claim(vm.claim("unrelated"))
    assert attachments.claims_of_vmi(world.caches, vm.vmi()) == [
        (vm.NS, "hold-a"),
        (vm.NS, "other"),
    ]
