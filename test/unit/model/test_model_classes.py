"""A class's resource, mode, effective maxCount and tolerations are read one way everywhere
(docs/design.md §2): the order webhook, VMI webhook and binder must not disagree on maxCount."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import classes


def gpu_class(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "a10"}, "spec": spec}


A10 = {"devicePlugin": {"resourceName": "nvidia.com/GA102GL_A10"}}


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(gpu_class(source=A10), "nvidia.com/GA102GL_A10", id="device-plugin"),
        pytest.param(gpu_class(source={"dra": {}}), "", id="dra-only-serves-nothing"),
        pytest.param(gpu_class(source={"devicePlugin": {}}), "", id="no-resource-name"),
        pytest.param(gpu_class(), "", id="no-source"),
        pytest.param({"metadata": {"name": "x"}}, "", id="no-spec"),
        pytest.param({"spec": None}, "", id="null-spec"),
    ],
)
def test_resource_name_is_the_device_plugin_resource(cls: dict[str, Any], expected: str) -> None:
    assert classes.resource_name(cls) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"mode": "vgpu"}, 1, id="vgpu-unset-is-one"),
        pytest.param({"mode": "vgpu", "maxCount": 4}, 4, id="vgpu-set"),
        pytest.param({"mode": "passthrough"}, None, id="passthrough-unset-is-unlimited"),
        pytest.param({"mode": "passthrough", "maxCount": 2}, 2, id="passthrough-set"),
        pytest.param({"mode": "passthrough", "maxCount": 1}, 1, id="passthrough-set-to-one"),
        pytest.param({}, None, id="no-mode-is-unlimited"),
        pytest.param({"mode": "vgpu", "maxCount": True}, 1, id="boolean-is-not-a-count"),
        pytest.param({"mode": "vgpu", "maxCount": None}, 1, id="null-is-unset"),
    ],
)
def test_effective_max_count(spec: dict[str, Any], expected: int | None) -> None:
    assert classes.effective_max_count(gpu_class(**spec)) == expected


@pytest.mark.parametrize(
    ("spec", "mode", "vgpu"),
    [
        pytest.param({"mode": "vgpu"}, "vgpu", True, id="vgpu"),
        pytest.param({"mode": "passthrough"}, "passthrough", False, id="passthrough"),
        pytest.param({}, "", False, id="missing"),
    ],
)
def test_mode(spec: dict[str, Any], mode: str, vgpu: bool) -> None:
    assert classes.mode(gpu_class(**spec)) == mode
    assert classes.is_vgpu(gpu_class(**spec)) is vgpu


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
            [{"key": "gpu", "operator": "Exists"}],
            id="listed",
        ),
        pytest.param({}, [], id="none"),
        pytest.param({"tolerations": None}, [], id="null"),
        pytest.param(
            {"tolerations": ["junk", {"key": "a", "value": "b"}]},
            [{"key": "a", "value": "b"}],
            id="non-objects-dropped",
        ),
    ],
)
def test_tolerations(spec: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    assert classes.tolerations(gpu_class(**spec)) == expected


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(gpu_class(), "a10", id="named"),
        pytest.param({"spec": {}}, "", id="no-metadata"),
    ],
)
def test_name(cls: dict[str, Any], expected: str) -> None:
    assert classes.name(cls) == expected


def test_a_class_is_preemptible_only_when_it_says_so() -> None:
    assert classes.preemptible({"spec": {"preemptible": True}})
    assert not classes.preemptible({"spec": {"preemptible": False}})
    assert not classes.preemptible({"spec": {}})
    assert not classes.preemptible({"spec": {"preemptible": "true"}})
    assert not classes.preemptible({})
