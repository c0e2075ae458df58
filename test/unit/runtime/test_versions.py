"""Which of a cached object and the reply to our own write of it is newer."""

from __future__ import annotations

from typing import Any

from gpuoperator.runtime.versions import newest, resource_version

Obj = dict[str, Any]


def obj(uid: str, rv: str | None) -> Obj:
    meta: dict[str, Any] = {"name": "a", "uid": uid}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"metadata": meta}


def test_the_write_wins_while_the_cache_has_not_delivered_it() -> None:
    cached, written = obj("u1", "9"), obj("u1", "10")  # 10 > 9 as numbers, not as text
    assert newest(cached, written) is written
    assert newest(written, cached) is written


def test_the_cache_wins_once_it_caught_up_or_for_another_object() -> None:
    cached = obj("u1", "12")
    assert newest(cached, obj("u1", "12")) is cached
    assert newest(cached, obj("u1", "11")) is cached
    recreated = obj("u2", "5")
    assert newest(recreated, obj("u1", "20")) is recreated  # the write was of the old object


def test_a_cache_that_lost_the_object_or_an_unreadable_version_keeps_the_cache() -> None:
    assert newest(None, obj("u1", "3")) is None
    cached = obj("u1", "2")
    assert newest(cached, obj("u1", None)) is cached
    assert newest(cached, obj("u1", "not-a-number")) is cached
    assert resource_version(obj("u1", "")) is None
    assert resource_version(obj("u1", "42")) == 42
