"""A claim's status transitions (``model.claim_states``): what each one sets and keeps, the
lost node carried in ``status.lostNode`` (and read from the older message form), and the one
``is_bound`` they rest on."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from gpuoperator.model import claim_states, claims, dra_devices, gpu_hours, migrations

Obj = dict[str, Any]

NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
EARLIER = "2024-05-01T10:00:00Z"
UNTIL = NOW + datetime.timedelta(minutes=10)


def claim(status: Obj | None = None, generation: int = 3) -> Obj:
    obj: Obj = {
        "metadata": {"namespace": "t", "name": "hold", "generation": generation},
        "spec": {"className": "a10", "count": 1},
    }
    if status is not None:
        obj["status"] = status
    return obj


def bound_condition(status: Obj) -> Obj:
    found = [c for c in status["conditions"] if c["type"] == "Bound"]
    assert len(found) == 1
    condition: Obj = found[0]
    return condition


def said(status: Obj) -> tuple[str, str, str]:
    """What the ``Bound`` condition says: its status, reason and message."""
    condition = bound_condition(status)
    return (condition["status"], condition["reason"], condition["message"])


def pending_saying(message: str) -> Obj:
    """A Pending claim whose ``Bound`` condition says ``message`` (reason ``NoCapacity``)."""
    return claim(
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "Bound",
                    "status": "False",
                    "reason": "NoCapacity",
                    "message": message,
                    "lastTransitionTime": EARLIER,
                }
            ],
        }
    )


def bound_claim(node: str = "n1", **extra: Any) -> Obj:
    return claim(
        {
            "phase": "Bound",
            "nodeName": node,
            "boundTime": EARLIER,
            "conditions": [
                {
                    "type": "Bound",
                    "status": "True",
                    "reason": "Bound",
                    "message": f"bound to node {node}",
                    "lastTransitionTime": EARLIER,
                }
            ],
            **extra,
        }
    )


# ---- is_bound ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Bound", "nodeName": "n1"}, True),
        ({"phase": "Bound"}, False),  # no node: it holds nothing
        ({"phase": "Lost", "nodeName": "n1"}, False),
        ({"phase": "Pending"}, False),
        (None, False),
    ],
)
def test_a_claim_is_bound_only_with_phase_bound_and_a_node(
    status: Obj | None, expected: bool
) -> None:
    assert claims.is_bound(claim(status)) is expected


def test_bound_to_names_the_one_node_a_bound_claim_holds_units_on() -> None:
    assert claims.is_bound_to(bound_claim("n1"), "n1")
    assert not claims.is_bound_to(bound_claim("n1"), "n2")
    assert not claims.is_bound_to(claim({"phase": "Lost", "nodeName": "n1"}), "n1")


# ---- bound -------------------------------------------------------------------------------


def test_binding_a_waiting_claim_sets_node_time_generation_and_a_true_condition() -> None:
    waiting = claim({"phase": "Pending", "lostNode": "n0", "refusedNodes": [{"nodeName": "n9"}]})
    before = copy.deepcopy(waiting)

    status = claim_states.bound(waiting, "n1", NOW)

    assert waiting == before  # the claim passed in is never changed
    assert status["phase"] == "Bound"
    assert status["nodeName"] == "n1"
    assert status["boundTime"] == "2024-05-01T12:00:00Z"
    assert status["observedGeneration"] == 3
    assert "lostNode" not in status  # bound again: nothing lost any more
    assert status["refusedNodes"] == [{"nodeName": "n9"}]  # kept as it was
    assert said(status) == ("True", "Bound", "bound to node n1")
    assert claims.is_bound_to({**waiting, "status": status}, "n1")


def test_binding_opens_the_idle_usage_interval_of_a_claim_serving_no_vm() -> None:
    status = claim_states.bound(claim({"phase": "Pending"}), "n1", NOW)

    assert status["usage"]["state"] == "Idle"
    assert status["usage"]["since"] == "2024-05-01T12:00:00Z"


# ---- moved -------------------------------------------------------------------------------


def test_a_move_rebinds_to_the_target_with_reason_moved_and_clears_named_conditions() -> None:
    cordoned = {"type": "NodeCordoned", "status": "True", "reason": "CannotMove"}
    other = {"type": "Other", "status": "True", "reason": "X"}
    held = bound_claim("n1")
    held["status"]["conditions"] += [cordoned, other]

    status = claim_states.moved(held, "n2", "moved away", NOW, clear=("NodeCordoned",))

    assert (status["phase"], status["nodeName"]) == ("Bound", "n2")
    assert status["boundTime"] == "2024-05-01T12:00:00Z"
    assert said(status) == ("True", "Moved", "moved away")
    assert [c["type"] for c in status["conditions"]] == ["Bound", "Other"]
    assert held["status"]["nodeName"] == "n1"


# ---- refused -----------------------------------------------------------------------------


def test_a_refusal_by_the_claims_own_node_unbinds_it_and_records_the_node() -> None:
    status = claim_states.refused(bound_claim("n1"), "n1", UNTIL, "RefusedByNode", "no", NOW)

    assert status["phase"] == "Pending"
    assert "nodeName" not in status
    assert "boundTime" not in status
    assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2024-05-01T12:10:00Z"}]
    assert said(status) == ("False", "RefusedByNode", "no")


def test_a_refusal_by_another_node_only_records_it() -> None:
    held = bound_claim("n2")

    status = claim_states.refused(held, "n1", UNTIL, "RefusedByNode", "no", NOW)

    assert (status["phase"], status["nodeName"], status["boundTime"]) == ("Bound", "n2", EARLIER)
    assert bound_condition(status)["reason"] == "Bound"
    assert status["refusedNodes"] == [{"nodeName": "n1", "until": "2024-05-01T12:10:00Z"}]


# ---- lost and waiting --------------------------------------------------------------------


def test_a_claim_whose_node_is_gone_is_lost_and_records_the_node() -> None:
    status = claim_states.lost(bound_claim("n1"), NOW)

    assert status["phase"] == "Lost"
    assert status["lostNode"] == "n1"
    assert status["nodeName"] == "n1"  # kept until it waits
    assert said(status) == ("False", "NodeLost", "node n1 is gone; the claim will be bound again")


def test_a_lost_claim_waits_as_pending_without_its_node_and_says_which_it_lost() -> None:
    lost = claim(claim_states.lost(bound_claim("n1"), NOW))

    status = claim_states.waiting(lost, "NoCapacity", "no room", NOW)

    assert status is not None
    assert status["phase"] == "Pending"
    assert "nodeName" not in status
    assert "boundTime" not in status
    assert status["lostNode"] == "n1"
    assert status["observedGeneration"] == 3
    assert said(status) == ("False", "NoCapacity", "no room; its node n1 is gone")


def test_a_waiting_claim_keeps_the_lost_node_note_while_its_reason_changes() -> None:
    lost = claim(claim_states.lost(bound_claim("n1"), NOW))
    pending = claim(claim_states.waiting(lost, "NoCapacity", "no room", NOW))

    status = claim_states.waiting(pending, "BudgetExceeded", "over budget", NOW)

    assert status is not None
    assert bound_condition(status)["message"] == "over budget; its node n1 is gone"
    assert status["lostNode"] == "n1"


def test_waiting_again_for_the_same_reason_writes_nothing() -> None:
    lost = claim(claim_states.lost(bound_claim("n1"), NOW))
    pending = claim(claim_states.waiting(lost, "NoCapacity", "no room", NOW))

    assert claim_states.waiting(pending, "NoCapacity", "no room", NOW) is None


def test_a_new_claim_waits_as_pending_with_no_lost_node() -> None:
    status = claim_states.waiting(claim(), "Queued", "in line", NOW)

    assert status is not None
    assert status["phase"] == "Pending"
    assert "lostNode" not in status
    assert bound_condition(status)["message"] == "in line"


def test_the_lost_node_of_a_claim_written_before_the_field_is_read_from_its_message() -> None:
    older = pending_saying("no room; its node n7 is gone")

    assert claim_states.lost_node(older) == "n7"
    status = claim_states.waiting(older, "BudgetExceeded", "over budget", NOW)
    assert status is not None
    assert bound_condition(status)["message"] == "over budget; its node n7 is gone"
    # Said exactly so already: nothing to write, as before the field existed.
    assert claim_states.waiting(older, "NoCapacity", "no room", NOW) is None


def test_a_message_that_only_mentions_a_gone_node_names_no_lost_node() -> None:
    pending = pending_saying("n3: the node is gone")

    assert claim_states.lost_node(pending) == ""


# ---- flagged and unflagged ---------------------------------------------------------------


def test_a_flag_is_set_true_once_and_removed_without_touching_the_binding() -> None:
    held = bound_claim("n1")

    status = claim_states.flagged(held, "NodeCordoned", "CannotMove", "stuck", NOW)

    assert status is not None
    assert (status["phase"], status["nodeName"]) == ("Bound", "n1")
    flag = [c for c in status["conditions"] if c["type"] == "NodeCordoned"]
    assert [(c["status"], c["reason"], c["message"]) for c in flag] == [
        ("True", "CannotMove", "stuck")
    ]
    flagged = claim(status)
    assert claim_states.flagged(flagged, "NodeCordoned", "CannotMove", "stuck", NOW) is None
    assert claim_states.flagged(flagged, "NodeCordoned", "CannotMove", "other", NOW) is not None

    cleared = claim_states.unflagged(flagged, "NodeCordoned")
    assert [c["type"] for c in cleared["conditions"]] == ["Bound"]
    assert cleared["nodeName"] == "n1"


# ---- counted -----------------------------------------------------------------------------


def test_counting_usage_changes_only_the_usage() -> None:
    held = bound_claim("n1", usage={"idleUnitSeconds": 1, "inUseUnitSeconds": 0})
    usage = gpu_hours.Usage(idle=60, in_use=5, state=gpu_hours.State.IN_USE, since=NOW)

    status = claim_states.counted(held, usage)

    assert status["usage"] == {
        "idleUnitSeconds": 60,
        "inUseUnitSeconds": 5,
        "state": "InUse",
        "since": "2024-05-01T12:00:00Z",
    }
    assert {k: v for k, v in status.items() if k != "usage"} == {
        k: v for k, v in held["status"].items() if k != "usage"
    }


def test_an_attachment_sets_only_the_vm_and_the_attached_condition() -> None:
    held = claim(
        {
            "phase": "Bound",
            "nodeName": "n1",
            "conditions": [{"type": "Bound", "status": "True", "reason": "Bound"}],
        }
    )
    before = copy.deepcopy(held)
    status = claim_states.attached(held, {"vmi": "vm-a", "uid": "u1"}, ["vm-b"], NOW)
    assert held == before
    assert set(status) == {"attachment", "conditions"}  # a merge patch: phase and node stay
    assert status["attachment"] == {"vmi": "vm-a", "uid": "u1"}
    [attached] = [c for c in status["conditions"] if c["type"] == "Attached"]
    assert (attached["status"], attached["reason"]) == ("True", "VMsWaiting")
    assert "vm-a (uid u1)" in attached["message"] and "vm-b" in attached["message"]
    assert [c["type"] for c in status["conditions"]].count("Bound") == 1


def test_no_attachment_says_no_vm_uses_the_claim() -> None:
    status = claim_states.attached(claim({}), None, [], NOW)
    assert status["attachment"] is None
    [attached] = status["conditions"]
    assert (attached["type"], attached["status"], attached["reason"]) == (
        "Attached",
        "False",
        "NotAttached",
    )


def test_a_dra_bind_is_a_bind_that_also_names_the_resource_claim_and_its_devices() -> None:
    waiting = claim({"phase": "Pending", "lostNode": "n0"})
    held = [
        dra_devices.DeviceRef("gpu.example.com", "n1", "gpu-2"),
        dra_devices.DeviceRef("gpu.example.com", "n1", "gpu-0"),
    ]

    status = claim_states.dra_bound(waiting, "n1", "hold", held, NOW)

    plain = claim_states.bound(waiting, "n1", NOW)
    assert {k: v for k, v in status.items() if k not in ("resourceClaimName", "devices")} == plain
    assert status["resourceClaimName"] == "hold"
    # In the order given (the allocation's result order), as DRA names them.
    assert status["devices"] == [
        {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-2"},
        {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"},
    ]


def test_a_dra_bind_without_devices_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 64 devices"):
        claim_states.dra_bound(claim({"phase": "Pending"}), "n1", "hold", [], NOW)


def test_a_dra_claim_that_waits_again_or_is_refused_by_its_node_names_no_devices() -> None:
    held = [dra_devices.DeviceRef("gpu.example.com", "n1", "gpu-0")]
    bound = claim({"phase": "Pending"})
    bound["status"] = claim_states.dra_bound(bound, "n1", "hold", held, NOW)
    lost = {**bound, "status": claim_states.lost(bound, NOW)}
    assert lost["status"]["devices"]  # Lost is transient: the binder decides next
    waits = claim_states.waiting(lost, "NoCapacity", "no room", NOW)
    assert waits is not None
    assert "devices" not in waits and "resourceClaimName" not in waits
    refused = claim_states.refused(bound, "n1", UNTIL, "RefusedByNode", "refused", NOW)
    assert "devices" not in refused and "resourceClaimName" not in refused
    elsewhere = claim_states.refused(bound, "n2", UNTIL, "RefusedByNode", "refused", NOW)
    assert elsewhere["devices"] == bound["status"]["devices"]


def test_a_preempted_hold_waits_without_node_and_closes_its_usage_interval() -> None:
    waiting = claim({})
    held = {
        **waiting,
        "status": claim_states.bound(waiting, "n1", NOW - datetime.timedelta(hours=1)),
    }
    opened = gpu_hours.read(held)
    message = claim_states.preempted_message("n1", "t/order", "a10", "a10-spot")
    status = claim_states.preempted(held, message, NOW)
    assert status["phase"] == "Pending"
    assert "nodeName" not in status and "boundTime" not in status
    bound = next(c for c in status["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"], bound["message"]) == ("False", "Preempted", message)
    closed = gpu_hours.read({**held, "status": status})
    assert closed.state != opened.state
    assert (closed.state, closed.idle, closed.since) == (None, 3600, NOW)  # 1 unit idle, 1 h


def migration_condition(status: Obj) -> tuple[str, str]:
    found = [c for c in status["conditions"] if c["type"] == "Migrating"]
    assert len(found) == 1
    return found[0]["status"], found[0]["reason"]


def test_a_transient_hold_is_recorded_beside_the_claims_own_node() -> None:
    before = claim({"phase": "Bound", "nodeName": "n1", "boundTime": EARLIER, "usage": {"x": 1}})
    frozen = copy.deepcopy(before)
    hold = migrations.TransientHold("uid-mig", "n2")
    status = claim_states.migrating(before, hold, NOW)
    assert before == frozen
    assert status["migration"] == {"uid": "uid-mig", "targetNode": "n2"}
    assert (status["phase"], status["nodeName"], status["boundTime"]) == ("Bound", "n1", EARLIER)
    assert status["usage"] == {"x": 1}
    assert migration_condition(status) == ("True", "Migrating")
    assert "n2" in next(c for c in status["conditions"] if c["type"] == "Migrating")["message"]


def test_a_completed_migration_moves_the_claim_to_the_target_in_one_status() -> None:
    before = claim(
        {
            "phase": "Bound",
            "nodeName": "n1",
            "boundTime": EARLIER,
            "usage": {"x": 1},
            "migration": {"uid": "uid-mig", "targetNode": "n2"},
        }
    )
    status = claim_states.migrated(before, NOW)
    assert (status["phase"], status["nodeName"]) == ("Bound", "n2")
    assert "migration" not in status
    assert said(status) == (
        "True",
        "Migrated",
        "moved from node n1 to node n2 with its VM's live migration",
    )
    assert migration_condition(status) == ("False", "Migrated")
    assert status["usage"] == {"x": 1}  # usage goes on as for any move
    with pytest.raises(ValueError):
        claim_states.migrated(claim({"phase": "Bound", "nodeName": "n1"}), NOW)


def test_a_migration_that_ends_otherwise_clears_the_transient_hold_and_the_claim_stays() -> None:
    before = claim(
        {"phase": "Bound", "nodeName": "n1", "migration": {"uid": "u", "targetNode": "n2"}}
    )
    status = claim_states.migration_cleared(before, "MigrationFailed", "migration u failed", NOW)
    assert status is not None
    assert (status["phase"], status["nodeName"]) == ("Bound", "n1")
    assert "migration" not in status
    assert migration_condition(status) == ("False", "MigrationFailed")
    again = claim_states.migration_cleared(
        {**before, "status": status}, "MigrationFailed", "migration u failed", NOW
    )
    assert again is None  # it says so already
