"""Feeds: every notice reaches every handler's ``on_add``, whatever another handler does."""

from __future__ import annotations

from typing import Any

from gpuoperator.runtime.feeding import Feed
from gpuoperator.runtime.informing import Handlers

Obj = dict[str, Any]


def test_a_notice_reaches_every_handler_even_past_a_failing_one() -> None:
    feed = Feed("test")
    seen: list[Obj] = []

    def fail(_: Obj) -> None:
        raise RuntimeError("handler bug")

    feed.add_handlers(Handlers(on_add=fail))
    feed.add_handlers(Handlers(on_delete=seen.append))  # no on_add: skipped
    feed.add_handlers(Handlers(on_add=seen.append))
    feed.publish({"nodes": ["n1"]})
    assert seen == [{"nodes": ["n1"]}]
