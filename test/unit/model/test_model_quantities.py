"""Quantities: whole units, and a limit that counts as the request."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import quantities


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param({"limits": {"a/b": "2"}}, {"a/b": "2"}, id="limit-only"),
        pytest.param(
            {"limits": {"a/b": "2"}, "requests": {"a/b": "1"}}, {"a/b": "1"}, id="request-wins"
        ),
        pytest.param(
            {"limits": {"a/b": 1}, "requests": {"c/d": 3}}, {"a/b": 1, "c/d": 3}, id="both"
        ),
        pytest.param({"limits": "garbage", "requests": {"a/b": 1}}, {"a/b": 1}, id="bad-limits"),
        pytest.param(None, {}, id="none"),
    ],
)
def test_a_limit_counts_as_the_request(resources: Any, expected: dict[str, Any]) -> None:
    assert quantities.requested(resources) == expected


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("0", 0), ("0e99", 0), ("-0", 0), ("1e99", None), ("0.5", None), (3, 3), (False, None)],
)
def test_parse_whole_tells_zero_from_invalid(quantity: Any, expected: int | None) -> None:
    assert quantities.parse_whole(quantity) == expected
    assert quantities.parse_count(quantity) == (expected or 0)


def test_only_extended_resources_are_counted() -> None:
    assert quantities.is_extended("nvidia.com/GA102GL_A10")
    assert not quantities.is_extended("memory")
