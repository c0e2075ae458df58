"""Who may hold a held claim (``model.attachments``): a VMI uses a claim its references name
as held; it confirms an attachment without UID when it exists with a UID and uses the
claim; a confirmed attachment goes stale once its VMI is gone or replaced (not while it is
being deleted); of several VMIs wanting the claim the oldest gets it; and the claim's
``Attached`` condition says who holds it and who waits."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuoperator.model import attachments
from harness import objects

Obj = dict[str, Any]
HELD = [{"claim": "hold"}]


def aged(name: str, created: str, uid: str | None = None, **kwargs: Any) -> Obj:
    obj = objects.vmi(name, uid=uid or f"uid-{name}", refs=HELD, **kwargs)
    obj["metadata"]["creationTimestamp"] = created
    return obj


@pytest.mark.parametrize(
    ("vmi", "uses", "confirms"),
    [
        pytest.param(objects.vmi(refs=HELD), True, True, id="held"),
        pytest.param(objects.vmi(refs=HELD, deleting=True), True, True, id="held-being-deleted"),
        pytest.param(objects.vmi(refs=HELD, uid=None), True, False, id="held-no-uid"),
        pytest.param(objects.vmi(refs=[{"claim": "other"}]), False, False, id="another-claim"),
        pytest.param(
            objects.vmi(refs=[{"claimTemplate": objects.TEMPLATE}]), False, False, id="template"
        ),
        pytest.param(objects.vmi(refs="not json"), False, False, id="bad-annotation"),
        pytest.param(objects.vmi(), False, False, id="no-references"),
    ],
)
def test_which_vmis_use_and_confirm_a_claim(vmi: Obj, uses: bool, confirms: bool) -> None:
    assert attachments.uses_claim(vmi, "hold") is uses
    assert attachments.confirms(vmi, "hold") is confirms


def test_no_vmi_confirms_nothing() -> None:
    assert not attachments.confirms(None, "hold")


@pytest.mark.parametrize(
    ("vmi", "reason"),
    [
        pytest.param(objects.vmi(refs=HELD, uid="u1"), None, id="live"),
        pytest.param(objects.vmi(refs=HELD, uid="u1", deleting=True), None, id="being-deleted"),
        pytest.param(None, "VMDeleted", id="gone"),
        pytest.param(objects.vmi(refs=HELD, uid="u2"), "VMReplaced", id="replaced"),
    ],
)
def test_a_confirmed_attachment_goes_stale_only_once_its_vmi_is_gone(
    vmi: Obj | None, reason: str | None
) -> None:
    why = attachments.stale_reason({"vmi": "vm1", "uid": "u1"}, vmi)

    assert (why[0] if why else None) == reason
    if why is not None:
        assert "vm1" in why[1] and "u1" in why[1]


def test_the_oldest_live_user_comes_first_then_by_name_and_uid() -> None:
    vmis = [
        aged("c", "2026-01-01T00:00:02Z"),
        aged("b", "2026-01-01T00:00:01Z", uid="u2"),
        aged("b", "2026-01-01T00:00:01Z", uid="u1"),
        aged("a", "2026-01-01T00:00:03Z"),
        aged("gone", "2026-01-01T00:00:00Z", deleting=True),
        aged("done", "2026-01-01T00:00:00Z", phase="Succeeded"),
        aged("failed", "2026-01-01T00:00:00Z", phase="Failed"),
        aged("no-uid", "2026-01-01T00:00:00Z", uid=""),
    ]
    vmis[-1]["metadata"].pop("uid")
    before = copy.deepcopy(vmis)

    users = attachments.live_users(vmis, "hold")

    assert [(v["metadata"]["name"], v["metadata"]["uid"]) for v in users] == [
        ("b", "u1"),
        ("b", "u2"),
        ("c", "uid-c"),
        ("a", "uid-a"),
    ]
    assert vmis == before


@pytest.mark.parametrize(
    ("holder", "waiting", "status", "reason", "words"),
    [
        pytest.param("", [], False, "NotAttached", ["no VM instance"], id="none"),
        pytest.param("vm1", [], True, "Attached", ["vm1", "u1"], id="held"),
        pytest.param(
            "vm1", ["vm2", "vm3"], True, "VMsWaiting", ["vm1", "u1", "vm2, vm3"], id="waiting"
        ),
    ],
)
def test_the_attached_condition_names_the_holder_and_the_waiting(
    holder: str, waiting: list[str], status: bool, reason: str, words: list[str]
) -> None:
    got_status, got_reason, message = attachments.condition_for(holder, "u1", waiting)

    assert (got_status, got_reason) == (status, reason)
    assert all(w in message for w in words)


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        pytest.param({"status": {"attachment": {"vmi": "vm1"}}}, {"vmi": "vm1"}, id="recorded"),
        pytest.param({"status": {"attachment": "vm1"}}, {}, id="not-an-object"),
        pytest.param({"status": None}, {}, id="no-status"),
        pytest.param({}, {}, id="new"),
    ],
)
def test_the_recorded_attachment(claim: Obj, expected: Obj) -> None:
    assert attachments.recorded(claim) == expected
