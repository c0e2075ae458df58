"""The incremental catalog always agrees with a from-scratch computation."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import capacity, catalog
from harness import objects

Obj = dict[str, Any]
RESOURCES = ["r.io/a", "r.io/b"]
NODES = [f"n{i}" for i in range(4)]


def node(name: str, units: dict[str, int], ready: bool, cordoned: bool, tainted: bool) -> Obj:
    taints = [{"key": "gpu", "effect": "NoSchedule"}] if tainted else []
    return objects.node(name, units, ready=ready, cordoned=cordoned, taints=taints)


def gpu_class(name: str, resource: str, tolerant: bool) -> Obj:
    tolerations = [{"key": "gpu", "operator": "Exists"}] if tolerant else []
    return objects.gpuclass(name, resource=resource, tolerations=tolerations)


def pod(i: int, node_name: str, resource: str, units: int) -> Obj:
    return objects.pod(
        f"p{i}",
        namespace="t",
        node_name=node_name,
        requests={resource: str(units)},
        phase="Running",
    )


nodes_st = st.builds(
    node,
    st.sampled_from(NODES),
    st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 8), max_size=2),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
classes_st = st.builds(
    gpu_class, st.sampled_from(["c1", "c2", "c3"]), st.sampled_from(RESOURCES), st.booleans()
)
pods_st = st.builds(
    pod, st.integers(0, 5), st.sampled_from(NODES), st.sampled_from(RESOURCES), st.integers(1, 4)
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("node"), nodes_st),
        st.tuples(st.just("rm-node"), st.sampled_from(NODES)),
        st.tuples(st.just("class"), classes_st),
        st.tuples(st.just("rm-class"), st.sampled_from(["c1", "c2", "c3"])),
        st.tuples(st.just("pod"), pods_st),
        st.tuples(st.just("rm-pod"), st.integers(0, 5)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_incremental_figures_equal_a_recomputation_after_any_sequence(steps: list[Any]) -> None:
    ledger, cat = capacity.Ledger(), catalog.Catalog()
    nodes: dict[str, Obj] = {}
    classes: dict[str, Obj] = {}
    for op, arg in steps:
        if op == "node":
            nodes[arg["metadata"]["name"]] = arg
            touched = ledger.set_node(arg) | {arg["metadata"]["name"]}
        elif op == "rm-node":
            nodes.pop(arg, None)
            touched = ledger.remove_node(arg) | {arg}
        elif op == "class":
            classes[arg["metadata"]["name"]] = arg
            cat.set_class(arg, ledger, nodes)
            touched = set()
        elif op == "rm-class":
            classes.pop(arg, None)
            cat.remove_class(arg)
            touched = set()
        elif op == "pod":
            touched = ledger.set_pod(arg)
        else:
            touched = ledger.remove_pod(("t", f"p{arg}"))
        cat.update_nodes(touched, ledger, nodes)
        for name, cls in classes.items():
            assert cat.figures(name) == capacity.class_figures(ledger, cls, nodes.values()), name
            per_node = [
                ledger.allocatable(n, cls["spec"]["source"]["devicePlugin"]["resourceName"])
                for n, obj in nodes.items()
                if capacity.serves(ledger, obj, cls)
            ]
            assert cat.allocatable(name) == sum(per_node)
            assert cat.largest_allocatable(name) == max(per_node, default=0)


def test_update_nodes_reports_only_classes_whose_figures_moved() -> None:
    ledger, cat = capacity.Ledger(), catalog.Catalog()
    n0 = node("n0", {"r.io/a": 8}, True, False, False)
    nodes = {"n0": n0}
    ledger.set_node(n0)
    cat.set_class(gpu_class("a", "r.io/a", False), ledger, nodes)
    cat.set_class(gpu_class("b", "r.io/b", False), ledger, nodes)
    assert cat.update_nodes(ledger.set_pod(pod(1, "n0", "r.io/a", 3)), ledger, nodes) == {"a"}
    assert cat.figures("a") == capacity.ClassFigures(free=5, max_free_per_node=5, nodes=1)
    assert cat.figures("b") == capacity.ClassFigures(free=0, max_free_per_node=0, nodes=0)
    assert cat.update_nodes({"n0"}, ledger, nodes) == set(), "nothing moved"
