"""Claim tallies: claims counted per class, phase and Bound reason (no phase yet reads as
Pending, no condition as no reason), and each class's oldest waiting claim aged from its
creation on an injected time."""

from __future__ import annotations

import datetime
from typing import Any

from gpuoperator.model import tallies

Obj = dict[str, Any]
NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)


def claim(
    name: str,
    cls: str = "a10",
    *,
    created: str | None = "2026-03-01T11:00:00Z",
    phase: str | None = None,
    reason: str | None = None,
    deleting: bool = False,
) -> Obj:
    meta: Obj = {"name": name, "namespace": "tenant"}
    if created is not None:
        meta["creationTimestamp"] = created
    if deleting:
        meta["deletionTimestamp"] = "2026-03-01T11:59:00Z"
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
    if reason is not None:
        status["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "Other"},
            {"type": "Bound", "status": str(reason == "Bound"), "reason": reason},
        ]
    return {"metadata": meta, "spec": {"className": cls, "count": 1}, "status": status}


def test_claims_are_counted_per_class_phase_and_bound_reason() -> None:
    tally = tallies.of_claims(
        [
            claim("a", phase="Bound", reason="Bound"),
            claim("b", phase="Bound", reason="Bound"),
            claim("c", phase="Pending", reason="NoCapacity"),
            claim("d", phase="Pending", reason="BudgetExceeded"),
            claim("e", phase="Pending", reason="NoCapacity"),
            claim("f", "l40s", phase="Lost", reason="NodeLost"),
            claim("g", "l40s", phase="Pending", reason="NotEntitled"),
        ],
        NOW,
    )
    assert tally.counts == {
        ("a10", "Bound", "Bound"): 2,
        ("a10", "Pending", "NoCapacity"): 2,
        ("a10", "Pending", "BudgetExceeded"): 1,
        ("l40s", "Lost", "NodeLost"): 1,
        ("l40s", "Pending", "NotEntitled"): 1,
    }


def test_a_claim_not_decided_yet_is_pending_without_a_reason() -> None:
    claims = [claim("new"), claim("queued", phase="Pending", reason="Queued")]
    tally = tallies.of_claims(claims, NOW)
    assert tally.counts == {("a10", "Pending", ""): 1, ("a10", "Pending", "Queued"): 1}


def test_the_oldest_pending_claim_is_aged_from_its_creation() -> None:
    tally = tallies.of_claims(
        [
            claim("old", created="2026-03-01T11:45:00Z", phase="Pending", reason="NoCapacity"),
            claim("older", created="2026-03-01T11:30:00Z", phase="Pending", reason="Queued"),
            claim("newest", created="2026-03-01T11:59:30Z"),
            claim("lost", "l40s", created="2026-02-28T12:00:00Z", phase="Lost", reason="NodeLost"),
        ],
        NOW,
    )
    assert tally.oldest_pending == {"a10": 1800.0, "l40s": 86400.0}


def test_the_age_follows_the_clock() -> None:
    claims = [claim("p", created="2026-03-01T11:59:00Z", phase="Pending", reason="NoCapacity")]
    assert tallies.of_claims(claims, NOW).oldest_pending == {"a10": 60.0}
    later = NOW + datetime.timedelta(minutes=20)
    assert tallies.of_claims(claims, later).oldest_pending == {"a10": 1260.0}


def test_bound_and_deleted_claims_have_no_pending_age_but_are_counted() -> None:
    tally = tallies.of_claims(
        [
            claim("held", created="2026-01-01T00:00:00Z", phase="Bound", reason="Bound"),
            claim("going", created="2026-01-01T00:00:00Z", phase="Pending", deleting=True),
        ],
        NOW,
    )
    assert tally.oldest_pending == {}
    assert tally.counts == {("a10", "Bound", "Bound"): 1, ("a10", "Pending", ""): 1}


def test_an_unreadable_or_future_creation_time_does_not_make_an_age_up() -> None:
    tally = tallies.of_claims(
        [
            claim("garbled", created="yesterday", phase="Pending"),
            claim("missing", created=None, phase="Pending"),
            claim("ahead", "l40s", created="2026-03-01T12:00:05Z", phase="Pending"),
        ],
        NOW,
    )
    assert tally.oldest_pending == {"l40s": 0.0}
    assert tally.counts == {("a10", "Pending", ""): 2, ("l40s", "Pending", ""): 1}


def test_no_claims_no_tally() -> None:
    tally = tallies.of_claims([], NOW)
    assert (tally.counts, tally.oldest_pending) == ({}, {})
