"""A DRA class (``spec.source.dra``, docs/design.md §2) is read as one, and every reader that
expects a device-plugin resource passes it over with a reason instead of failing: it serves
no extended resource, the binder without the class's devices says DRA binding is not built,
and an order of it is judged on the class's published
figures like any other (docs/design.md §5 "DRA classes")."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuoperator.model import binding, capacity, orders
from gpuoperator.model import classes as gpuclasses
from harness import objects

Obj = dict[str, Any]
NOW = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
DRA = objects.gpuclass(
    "a10-dra",
    source={"dra": {"deviceClassName": "gpu.example.com", "topologyAttribute": "pcieRoot"}},
)
PLUGIN = objects.gpuclass("a10")


def test_a_dra_class_names_its_device_class_and_topology_attribute() -> None:
    assert gpuclasses.is_dra(DRA)
    assert gpuclasses.dra(DRA) == gpuclasses.DraSource("gpu.example.com", "pcieRoot")
    assert gpuclasses.resource_name(DRA) == ""
    assert gpuclasses.backend(DRA) == "dra:gpu.example.com"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param({"dra": {"deviceClassName": "gpu"}}, gpuclasses.DraSource("gpu"), id="bare"),
        pytest.param(
            {"dra": {"deviceClassName": "gpu", "topologyAttribute": ""}},
            gpuclasses.DraSource("gpu"),
            id="empty-topology-is-none",
        ),
        pytest.param({"dra": {}}, gpuclasses.DraSource(""), id="partial"),
        pytest.param({"dra": "gpu"}, None, id="not-an-object"),
        pytest.param({"devicePlugin": {"resourceName": "nvidia.com/x"}}, None, id="plugin"),
    ],
)
def test_dra_reads_partial_objects_totally(source: Obj, expected: object) -> None:
    assert gpuclasses.dra(objects.gpuclass("c", source=source)) == expected


def test_a_device_plugin_class_is_not_dra_and_keeps_its_resource() -> None:
    assert not gpuclasses.is_dra(PLUGIN)
    assert gpuclasses.dra(PLUGIN) is None
    assert gpuclasses.backend(PLUGIN) == gpuclasses.resource_name(PLUGIN) == objects.A10


def test_a_dra_class_is_served_by_no_node_and_its_figures_are_zero() -> None:
    node = objects.node("n1", {objects.A10: 4})
    ledger = capacity.Ledger()
    ledger.set_node(node)
    assert not capacity.serves(ledger, node, DRA)
    assert capacity.class_figures(ledger, DRA, [node]) == capacity.ClassFigures(0, 0, 0)
    assert capacity.node_class_free(ledger, node, [DRA, PLUGIN]) == [{"name": "a10", "free": 4}]


def test_the_binder_says_a_dra_class_is_not_bound_yet() -> None:
    node = objects.node("n1", {objects.A10: 4})
    ledger = capacity.Ledger()
    ledger.set_node(node)
    claim = objects.claim("c", namespace="t", class_name="a10-dra", count=1, phase="Pending")
    result = binding.plan([claim], DRA, [node], ledger, "binpack", NOW)
    assert result.bindings == []
    message = str(result.waiting[("t", "c")])
    for fragment in ("a10-dra", "spec.source.dra", "gpu.example.com", "not built yet"):
        assert fragment in message, message


def test_an_order_of_a_dra_class_is_judged_on_its_published_figures_like_any_class() -> None:
    namespace = {"metadata": {"name": "t"}}
    two = objects.claim("c", namespace="t", class_name="a10-dra", count=2)
    assert orders.order_refusals(two, DRA, namespace, [], [], capacity.ClassFigures(3, 2, 2)) == []
    [refused] = orders.order_refusals(two, DRA, namespace, [], [], capacity.ClassFigures(2, 1, 2))
    assert refused.startswith("spec.count: class a10-dra has at most 1 free GPU on one node")
