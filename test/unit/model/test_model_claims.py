"""What a claim is (docs/design.md §2 GPUClaim, §10): whom it serves, whether that VM instance is
still a live user (a VMI being deleted is), and which launcher pods its units cover."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import claims
from harness import objects

Obj = dict[str, Any]


def owner(uid: str = "u1", name: str = "vm", **extra: Any) -> Obj:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "name": name,
        "uid": uid,
        "controller": True,
        **extra,
    }


def claim(attachment: Obj | None = None, owners: list[Obj] | None = None) -> Obj:
    return objects.claim(
        "c", namespace="ns", phase="Bound", node="n1", attached=attachment, owners=owners
    )


def vmi(name: str = "vm", uid: str = "u1", *, deleting: bool = False, phase: str = "") -> Obj:
    return objects.vmi(name, namespace="ns", uid=uid, deleting=deleting, phase=phase or None)


def test_the_phases_are_the_contracts() -> None:
    assert [p.value for p in claims.Phase] == ["Pending", "Bound", "Lost"]
    assert str(claims.Phase.BOUND) == "Bound"


@pytest.mark.parametrize(
    ("obj", "user"),
    [
        pytest.param(claim(), None, id="no-user"),
        pytest.param(claim({"vmi": "vm"}), claims.VmiRef("vm", ""), id="unconfirmed-attachment"),
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), claims.VmiRef("vm", "u1"), id="attached"),
        pytest.param(claim(owners=[owner()]), claims.VmiRef("vm", "u1"), id="template-owner"),
        pytest.param(
            claim({"vmi": "other", "uid": "u9"}, [owner()]),
            claims.VmiRef("vm", "u1"),
            id="the-owner-decides-over-an-attachment",
        ),
        pytest.param(claim(owners=[owner(controller=False)]), None, id="owner-not-controller"),
        pytest.param(claim(owners=[owner(kind="Pod")]), None, id="owner-not-a-vmi"),
        pytest.param(claim(owners=[owner(apiVersion="x.io/v1")]), None, id="owner-other-api"),
        pytest.param(claim({"vmi": ""}), None, id="attachment-without-name"),
    ],
)
def test_the_user_of_a_claim_is_its_owner_else_its_attachment(
    obj: Obj, user: claims.VmiRef | None
) -> None:
    assert claims.user(obj) == user


@pytest.mark.parametrize(
    ("obj", "found", "live"),
    [
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), vmi(), True, id="attached-vmi-exists"),
        pytest.param(
            claim({"vmi": "vm", "uid": "u1"}),
            vmi(deleting=True),
            True,
            id="a-vmi-being-deleted-is-still-live",
        ),
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), None, False, id="vmi-gone"),
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), vmi(uid="u2"), False, id="vmi-replaced"),
        pytest.param(claim({"vmi": "vm"}), vmi(uid="u2"), True, id="unconfirmed-any-uid"),
        pytest.param(claim(owners=[owner()]), vmi(), True, id="template-claims-owner-exists"),
        pytest.param(
            claim(owners=[owner()]), vmi(deleting=True), True, id="template-owner-being-deleted"
        ),
        pytest.param(claim(owners=[owner()]), None, False, id="template-owner-gone"),
        pytest.param(claim(owners=[owner()]), vmi(uid="u2"), False, id="template-owner-replaced"),
        pytest.param(claim(), vmi(), False, id="no-user"),
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), vmi("other"), False, id="another-name"),
    ],
)
def test_a_claim_serves_a_live_vmi_until_that_vmi_is_gone(
    obj: Obj, found: Obj | None, live: bool
) -> None:
    assert claims.serves_live_vmi(obj, found) is live


@pytest.mark.parametrize(
    ("obj", "covering"),
    [
        pytest.param(claim({"vmi": "vm", "uid": "u1"}), ("ns", "u1"), id="confirmed-attachment"),
        pytest.param(claim(owners=[owner()]), ("ns", "u1"), id="template-owner"),
        pytest.param(claim({"vmi": "vm"}), None, id="unconfirmed-covers-nothing-yet"),
        pytest.param(claim(), None, id="no-user"),
    ],
)
def test_a_claim_covers_the_pods_of_its_vmi_by_uid(
    obj: Obj, covering: tuple[str, str] | None
) -> None:
    assert claims.covering_vmi(obj) == covering


@pytest.mark.parametrize(
    ("phase", "final"),
    [("Succeeded", True), ("Failed", True), ("Running", False), ("Scheduling", False), ("", False)],
)
def test_vmi_final_phases(phase: str, final: bool) -> None:
    assert claims.is_vmi_final(vmi(phase=phase)) is final


def test_bound_needs_a_node() -> None:
    assert claims.is_bound(claim())
    unbound = claim()
    del unbound["status"]["nodeName"]
    assert not claims.is_bound(unbound)
    assert claims.key(claim()) == ("ns", "c")


@pytest.mark.parametrize(
    ("found", "pods_left", "protected"),
    [
        pytest.param(vmi(), False, True, id="running-vmi"),
        pytest.param(vmi(deleting=True), True, True, id="being-deleted-with-its-pod"),
        pytest.param(vmi(deleting=True), False, True, id="being-deleted-in-the-background"),
        pytest.param(None, False, False, id="gone"),
        pytest.param(vmi(uid="u2"), True, False, id="replaced"),
    ],
)
def test_a_claim_is_protected_while_its_vmi_is_a_live_user(
    found: Obj | None, pods_left: bool, protected: bool
) -> None:
    ref = claims.VmiRef("vm", "u1")
    assert claims.protects(ref, found, pods_left=pods_left) is protected


@pytest.mark.parametrize(("pods_left", "protected"), [(True, True), (False, False)])
def test_a_foreground_deleted_vmi_releases_its_claims_once_its_pods_are_gone(
    pods_left: bool, protected: bool
) -> None:
    found = vmi(deleting=True)
    found["metadata"]["finalizers"] = ["foregroundDeletion"]
    ref = claims.VmiRef("vm", "u1")
    assert claims.protects(ref, found, pods_left=pods_left) is protected
