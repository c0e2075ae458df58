"""Reading one's own writes (``runtime.own_writes``): the reply to a write counts over an
older cached version of the same object, and is forgotten once the cache delivers that
version or a newer one, or another object of that name."""

from __future__ import annotations

from typing import Any

from gpuoperator.runtime.own_writes import OwnWrites

Obj = dict[str, Any]


def obj(rv: str, uid: str = "u1", **status: Any) -> Obj:
    return {"metadata": {"name": "a", "uid": uid, "resourceVersion": rv}, "status": status}


def test_the_write_counts_while_the_cache_is_older() -> None:
    writes: OwnWrites[str] = OwnWrites()
    reply = obj("12", free=3)
    writes.wrote("a", reply)

    assert writes.current("a", obj("11", free=1)) is reply
    assert writes.current("a", obj("11", free=1)) is reply  # still older: kept
    assert "a" in writes


def test_the_write_is_forgotten_once_the_cache_catches_up() -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12", free=3))
    delivered = obj("12", free=3)

    assert writes.current("a", delivered) is delivered
    assert "a" not in writes
    older = obj("11", free=1)
    assert writes.current("a", older) is older  # nothing left to answer with


def test_a_newer_cached_version_wins_over_the_write() -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12", free=3))
    newer = obj("15", free=0)

    assert writes.current("a", newer) is newer
    assert "a" not in writes


def test_another_object_of_that_name_is_not_answered_with_the_write() -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12"))
    replaced = obj("3", uid="u2")

    assert writes.current("a", replaced) is replaced
    assert "a" not in writes


def test_an_object_gone_from_the_cache_is_gone() -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12"))

    assert writes.current("a", None) is None
    assert "a" not in writes


def test_a_forgotten_write_no_longer_counts() -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12"))
    writes.forget("a")
    cached = obj("11")

    assert writes.current("a", cached) is cached


def test_writes_are_kept_per_key() -> None:
    writes: OwnWrites[tuple[str, str]] = OwnWrites()
    reply = obj("12")
    writes.wrote(("ns", "a"), reply)

    assert writes.current(("ns", "b"), obj("11")) is not reply
    assert writes.current(("ns", "a"), obj("11")) is reply
