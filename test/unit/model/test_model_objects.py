"""The object key and metadata readers every layer shares (the runtime's ``key_of`` is it)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from gpuoperator.model import objects
from gpuoperator.runtime import indexing


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param({"metadata": {"namespace": "ns", "name": "a"}}, ("ns", "a"), id="namespaced"),
        pytest.param({"metadata": {"name": "node-1"}}, ("", "node-1"), id="cluster-scoped"),
        pytest.param({"metadata": OrderedDict(name="a")}, ("", "a"), id="any-mapping"),
        pytest.param({"metadata": None}, ("", ""), id="null-metadata"),
        pytest.param({"metadata": "garbage"}, ("", ""), id="not-an-object"),
        pytest.param({}, ("", ""), id="no-metadata"),
    ],
)
def test_key(obj: dict[str, Any], expected: tuple[str, str]) -> None:
    assert objects.key(obj) == expected
    assert indexing.key_of(obj) == expected


def test_labels_and_annotations_read_as_empty_when_absent_or_malformed() -> None:
    obj = {"metadata": {"labels": {"a": "1"}, "annotations": "garbage"}}
    assert objects.labels(obj) == {"a": "1"}
    assert objects.annotations(obj) == {}
    assert objects.meta(None) == {}
