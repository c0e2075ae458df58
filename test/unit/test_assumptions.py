"""The assume cache (``gpuoperator.assumptions``): the states of one claim's assumption, what
supersedes each, and when the stored hold it releases stays counted."""

from __future__ import annotations

from typing import Any

from gpuoperator.assumptions import Assumptions, State

Obj = dict[str, Any]
KEY = ("t", "hold")


def claim(rv: int | None, phase: str | None = None, node: str | None = None) -> Obj:
    meta: Obj = {"namespace": "t", "name": "hold"}
    if rv is not None:
        meta["resourceVersion"] = str(rv)
    status: Obj = {}
    if phase:
        status["phase"] = phase
    if node:
        status["nodeName"] = node
    return {"metadata": meta, "spec": {"className": "a10", "count": 1}, "status": status}


def test_an_assumed_state_is_in_flight_and_read_instead_of_the_watchs() -> None:
    cache = Assumptions()
    watched = claim(5, "Pending")
    assert cache.state(KEY) is None
    assert cache.counted(KEY, watched) is watched

    bound = claim(5, "Bound", "n1")
    cache.assume(bound)

    assert cache.state(KEY) is State.IN_FLIGHT
    assert cache.unconfirmed(KEY)
    assert cache.counted(KEY, watched) is bound
    assert cache.claim(KEY) is bound
    assert cache.keys() == {KEY}


def test_in_flight_it_is_superseded_only_by_a_version_above_its_precondition() -> None:
    cache = Assumptions()
    cache.assume(claim(5, "Bound", "n1"))

    assert not cache.superseded_by(KEY, 4)
    assert not cache.superseded_by(KEY, 5)  # the version it was based on
    assert cache.superseded_by(KEY, 6)
    assert cache.superseded_by(KEY, None)  # not a number: the watch is trusted


def test_confirmed_it_is_superseded_by_the_written_version_or_a_newer_one() -> None:
    cache = Assumptions()
    cache.assume(claim(5, "Bound", "n1"))
    cache.confirm(claim(7, "Bound", "n1"))

    assert cache.state(KEY) is State.CONFIRMED
    assert not cache.unconfirmed(KEY)
    assert not cache.superseded_by(KEY, 6)
    assert cache.superseded_by(KEY, 7)


def test_an_unknown_outcome_is_forgotten_once_its_deadline_passes() -> None:
    cache = Assumptions()
    cache.assume(claim(5, "Bound", "n1"))
    cache.expire_at(KEY, 100.0)

    assert cache.state(KEY) is State.UNKNOWN
    assert cache.unconfirmed(KEY)
    assert cache.next_deadline(lambda k: k == KEY) == 100.0
    assert cache.next_deadline(lambda k: False) is None
    assert cache.expired(99.9) == []
    assert cache.expired(100.0) == [KEY]

    assert cache.forget(KEY)
    assert not cache.forget(KEY)
    assert cache.state(KEY) is None
    assert cache.superseded_by(KEY, 1)  # nothing assumed: any version counts


def test_an_unconfirmed_release_or_move_keeps_the_stored_hold() -> None:
    stored = claim(5, "Bound", "n1")
    cache = Assumptions()

    cache.assume(claim(5, "Pending"))  # a node refusal unbinding the claim
    assert cache.releases(KEY, stored)
    cache.assume(claim(5, "Bound", "n2"))  # a move
    assert cache.releases(KEY, stored)
    cache.assume(claim(5, "Bound", "n1"))  # stays where it is
    assert not cache.releases(KEY, stored)

    cache.assume(claim(5, "Pending"))
    assert not cache.releases(KEY, claim(5, "Pending"))  # the stored version held nothing
    assert not cache.releases(KEY, None)
    cache.confirm(claim(6, "Pending"))
    assert not cache.releases(KEY, stored)  # confirmed: the stored hold is released


def migrating(rv: int, node: str, uid: str | None, target: str = "n2") -> Obj:
    obj = claim(rv, "Bound", node)
    if uid is not None:
        obj["status"]["migration"] = {"uid": uid, "targetNode": target}
    return obj


def test_an_unconfirmed_end_of_a_transient_hold_keeps_the_stored_holds() -> None:
    stored = migrating(5, "n1", "m-1")
    cache = Assumptions()

    cache.assume(migrating(5, "n1", None))  # the migration failed: the transient hold goes
    assert cache.releases(KEY, stored)
    cache.assume(migrating(5, "n2", None))  # it succeeded: the claim moves to the target
    assert cache.releases(KEY, stored)
    cache.assume(migrating(5, "n1", "m-2", "n3"))  # another migration's transient hold
    assert cache.releases(KEY, stored)
    cache.assume(migrating(5, "n1", "m-1"))  # the same transient hold (a condition changes)
    assert not cache.releases(KEY, stored)
    cache.assume(migrating(5, "n1", "m-1"))
    assert not cache.releases(KEY, migrating(5, "n1", None))  # a transient hold only adds
