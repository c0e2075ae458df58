"""Informers against the real API server: adds, updates, deletes, and a watch that expires
(410 Gone) while a delete happens — the delete must still reach the handlers — and a cache
that converges after its connections are cut and then the API server restarts on a
compacted etcd."""

from __future__ import annotations

import operator
import queue
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pykube
import pytest
import yaml
from chaos import store

from gpuoperator.runtime.client import Client
from gpuoperator.runtime.indexing import by_label
from gpuoperator.runtime.informing import Handlers, Informer, InformerOptions
from gpuoperator.runtime.kubeconfig import load_config
from harness.proxy import PartitionableProxy
from harness.waiting import wait_for
from localcluster.cluster import LocalCluster

Event = tuple[str, str]


class Recorder:
    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.gone = threading.Event()

    def handlers(self) -> Handlers:
        return Handlers(
            on_add=lambda o: self.events.put(("add", o["metadata"]["name"])),
            on_update=lambda _old, new: self.events.put(("update", new["metadata"]["name"])),
            on_delete=lambda o: self.events.put(("delete", o["metadata"]["name"])),
        )

    def expect(self, wanted: Event, timeout: float = 30) -> list[Event]:
        """Events up to and including ``wanted``; fail with what was seen instead."""
        seen: list[Event] = []
        try:
            while True:
                event = self.events.get(timeout=timeout)
                seen.append(event)
                if event == wanted:
                    return seen
        except queue.Empty:
            raise AssertionError(f"no {wanted} within {timeout}s; saw {seen}") from None


def configmap(api: pykube.HTTPClient, namespace: str, name: str, **data: str) -> pykube.ConfigMap:
    cm = pykube.ConfigMap(
        api,
        {
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "cache-test"}},
            "data": data,
        },
    )
    cm.create()
    return cm


@pytest.fixture
def client(kubeconfig: Path) -> Client:
    return Client(lambda: load_config(str(kubeconfig)))


@pytest.fixture
def informer_factory(client: Client) -> Iterator[Any]:
    made: list[Informer] = []

    def make(c: Client, namespace: str) -> Informer:
        inf = Informer(
            c,
            pykube.ConfigMap,
            InformerOptions(
                namespace=namespace,
                indexers={"app": by_label("app")},
                watch_timeout=30,
                backoff=(0.2, 2.0),
            ),
        )
        made.append(inf)
        return inf

    yield make
    for inf in made:
        inf.stop()


def test_the_cache_follows_adds_updates_and_deletes(
    api: pykube.HTTPClient, namespace: str, client: Client, informer_factory: Any
) -> None:
    first = configmap(api, namespace, "first", v="1")
    inf: Informer = informer_factory(client, namespace)
    rec = Recorder()
    inf.add_handlers(rec.handlers())
    inf.start()
    assert inf.wait_synced(30)
    rec.expect(("add", "first"))

    second = configmap(api, namespace, "second", v="1")
    rec.expect(("add", "second"))
    second.obj["data"]["v"] = "2"
    second.update()
    rec.expect(("update", "second"))
    assert inf.store.get((namespace, "second"))["data"]["v"] == "2"  # type: ignore[index]
    first.delete()
    rec.expect(("delete", "first"))
    assert inf.store.get((namespace, "first")) is None
    assert [o["metadata"]["name"] for o in inf.store.by_index("app", "cache-test")] == ["second"]


def test_a_watch_expired_by_an_apiserver_restart_loses_no_delete(
    api: pykube.HTTPClient,
    namespace: str,
    kubeconfig: Path,
    local_cluster: LocalCluster | None,
    informer_factory: Any,
    tmp_path: Path,
) -> None:
    """The informer talks through a proxy. While it is partitioned, the API server restarts
    (its watch cache starts afresh, so the informer's resourceVersion is now too old) and an
    object is deleted. On reconnect the server answers 410 Gone; the informer relists and
    must deliver the delete it never saw as a watch event."""
    if local_cluster is None:
        pytest.skip("needs the local control plane: the test restarts kube-apiserver")
    keep = configmap(api, namespace, "keep")
    doomed = configmap(api, namespace, "doomed")
    server = api.config.cluster["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    proxy = PartitionableProxy((host, int(port)))
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(doc))
    try:
        inf: Informer = informer_factory(Client(lambda: load_config(str(proxied))), namespace)
        rec = Recorder()
        inf.add_handlers(rec.handlers())
        inf.start()
        assert inf.wait_synced(30)
        rec.expect(("add", "doomed"))
        lists_before = _lists(inf)

        proxy.partition()
        local_cluster.restart("kube-apiserver", log=lambda _m: None)
        doomed.delete()
        keep.obj["data"] = {"changed": "yes"}
        keep.update()
        proxy.heal()

        rec.expect(("delete", "doomed"), timeout=60)
        assert inf.store.get((namespace, "doomed")) is None
        wait_for(
            "the relisted update",
            lambda: inf.store.get((namespace, "keep")),
            until=lambda o: bool(o and o.get("data", {}).get("changed") == "yes"),
        )
        assert _lists(inf) > lists_before, "the informer relisted after 410 Gone"
    finally:
        proxy.close()


def test_a_cache_cut_off_and_then_expired_by_a_restart_on_compacted_etcd_converges(
    api: pykube.HTTPClient,
    namespace: str,
    kubeconfig: Path,
    local_cluster: LocalCluster | None,
    tmp_path: Path,
) -> None:
    """The chaos suite's R3 sequence on one informer with the operator's own backoff: every
    connection cut (the watch is re-opened), etcd compacted, kube-apiserver restarted (the
    re-opened watch is answered 410, relists meet a starting server). An object made after
    the faults reaches the cache within seconds, and the cache is current again."""
    if local_cluster is None:
        pytest.skip("needs the local control plane: the test restarts kube-apiserver")
    configmap(api, namespace, "before")
    server = api.config.cluster["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    proxy = PartitionableProxy((host, int(port)))
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(doc))
    etcd = store.Etcd(f"http://127.0.0.1:{local_cluster.ports().etcd}")
    inf = Informer(
        Client(lambda: load_config(str(proxied))),
        pykube.ConfigMap,
        InformerOptions(namespace=namespace),
        name="cut-then-restart",
    )
    try:
        inf.start()
        assert inf.wait_synced(30)
        for _round in range(2):
            reconnected = partial(operator.lt, proxy.accepted)
            proxy.partition()
            proxy.heal()
            wait_for("the watch re-opened", lambda: proxy.accepted, until=reconnected, timeout=30)
            etcd.compact()
            local_cluster.restart("kube-apiserver", log=lambda _m: None)
        configmap(api, namespace, "after")
        wait_for(
            "the object made after the faults in the cache",
            lambda: inf.store.get((namespace, "after")),
            timeout=20,
        )
        wait_for("the cache current again", inf.current, timeout=20)
    finally:
        inf.stop()
        proxy.close()


def _lists(inf: Informer) -> float:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "gpuoperator_informer_lists_total", {"informer": inf.name, "reason": "gone"}
    )
    return value or 0.0
