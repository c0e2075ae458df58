"""Conditions keep their transition time while their status holds."""

from __future__ import annotations

import datetime

from gpuoperator.model import conditions

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def test_a_new_condition_gets_now() -> None:
    (c,) = conditions.set_condition(None, "Available", True, "Ok", "fine", now=T0)
    assert c == {
        "type": "Available",
        "status": "True",
        "reason": "Ok",
        "message": "fine",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def test_same_status_keeps_the_transition_time_even_if_reason_changes() -> None:
    first = conditions.set_condition(None, "Available", True, "Ok", "a", now=T0)
    (c,) = conditions.set_condition(first, "Available", True, "Better", "b", now=T1)
    assert c["lastTransitionTime"] == "2026-01-01T00:00:00Z" and c["reason"] == "Better"


def test_a_flip_moves_the_transition_time_and_other_conditions_stay() -> None:
    conds = conditions.set_condition(None, "B", True, "x", "", now=T0)
    conds = conditions.set_condition(conds, "A", True, "Ok", "", now=T0)
    conds = conditions.set_condition(conds, "A", False, "Gone", "", now=T1, observed_generation=3)
    assert [c["type"] for c in conds] == ["A", "B"]
    assert conds[0]["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert conds[0]["observedGeneration"] == 3
    assert conditions.is_true(conds, "B") and not conditions.is_true(conds, "A")
