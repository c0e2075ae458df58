"""Reading one's own writes (``runtime.own_writes``): the reply to a write counts over an
older cached version of the same object, and is forgotten once the cache delivers that
version or a newer one, or another object of that name, or no longer has the object."""

from __future__ import annotations

from typing import Any

import pytest

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


@pytest.mark.parametrize(
    "cached",
    [
        pytest.param(obj("12", free=3), id="caught-up"),
        pytest.param(obj("15", free=0), id="newer"),
        pytest.param(obj("3", uid="u2"), id="another-object-of-that-name"),
        pytest.param(None, id="gone"),
    ],
)
def test_the_cache_wins_once_it_is_not_older_and_the_write_is_forgotten(
    cached: Obj | None,
) -> None:
    writes: OwnWrites[str] = OwnWrites()
    writes.wrote("a", obj("12", free=3))

    assert writes.current("a", cached) is cached
    assert "a" not in writes
    older = obj("11", free=1)
    assert writes.current("a", older) is older  # nothing left to answer with


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
