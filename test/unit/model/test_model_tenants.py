"""Only a namespace labelled ``gpu.cozystack.io/vgpu-entitled: "true"`` may order vGPU
(docs/design.md §3); anything else fails closed."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import tenants
from harness import objects

LABEL = "gpu.cozystack.io/vgpu-entitled"


def namespace(labels: dict[str, str] | None) -> dict[str, Any]:
    return objects.namespace("tenant-a", labels=labels)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(namespace({LABEL: "true"}), True, id="object-entitled"),
        pytest.param(namespace({LABEL: "True"}), False, id="object-wrong-case"),
        pytest.param(namespace({LABEL: "false"}), False, id="object-false"),
        pytest.param(namespace({LABEL: ""}), False, id="object-empty"),
        pytest.param(namespace({"other": "true"}), False, id="object-other-label"),
        pytest.param(namespace(None), False, id="object-no-labels"),
        pytest.param({"metadata": {"labels": None}}, False, id="object-null-labels"),
        pytest.param({LABEL: "true"}, True, id="labels-entitled"),
        pytest.param({LABEL: "yes"}, False, id="labels-yes"),
        pytest.param({}, False, id="labels-empty"),
        pytest.param(None, False, id="unknown-namespace"),
    ],
)
def test_vgpu_entitled(obj: dict[str, Any] | None, expected: bool) -> None:
    assert tenants.vgpu_entitled(obj) is expected
