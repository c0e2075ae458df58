"""The indexed store: every index holds exactly the keys of the stored objects filed under
each value, through puts, replacements and removals."""

from __future__ import annotations

from typing import Any

from gpuoperator.runtime.indexing import Store, by_field, by_label, by_namespace
from harness import objects

Obj = dict[str, Any]


def pod(name: str, rv: str, node: str = "", ns: str = "default", **labels: str) -> Obj:
    return objects.pod(name, namespace=ns, rv=rv, labels=labels, node_name=node, containers=[])


def test_store_indexes_follow_updates_and_removals() -> None:
    store = Store({"node": by_field("spec", "nodeName")})
    store.put(pod("a", "1", node="n1"))
    store.put(pod("b", "1", node="n1"))
    store.put(pod("a", "2", node="n2"))
    assert store.index_keys("node", "n1") == [("default", "b")]
    assert store.index_keys("node", "n2") == [("default", "a")]
    store.remove(("default", "b"))
    assert store.index_values("node") == ["n2"]


def test_put_returns_the_object_it_replaced() -> None:
    store = Store()
    first, second = pod("a", "1"), pod("a", "2")
    assert store.put(first) is None
    assert store.put(second) is first
    assert store.get(("default", "a")) is second
    assert store.remove(("default", "a")) is second
    assert len(store) == 0


def test_index_functions_file_an_object_only_under_values_it_has() -> None:
    labelled = pod("a", "1", node="n1", ns="t", app="web")
    assert list(by_namespace(labelled)) == ["t"]
    assert list(by_label("app")(labelled)) == ["web"]
    assert list(by_label("tier")(labelled)) == []
    assert list(by_field("spec", "nodeName")(labelled)) == ["n1"]
    assert list(by_field("spec", "nodeName")(pod("b", "1"))) == []
    assert list(by_field("metadata", "name", "deeper")(labelled)) == []
