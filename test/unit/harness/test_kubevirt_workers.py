"""The KubeVirt stand-in's controller shape without an API server: its caches are fed by
hand and its writes (pod create, status replace, pod delete) are recorded instead of sent.

What could break: a pod event must reach its VMI's key; a VMI must get one launcher pod
however many events and workers see it before the pod cache shows the pod (expectations);
a pod deleted after that fails its VMI for good; a pod whose VMI is gone is torn down."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pykube
import pytest

from harness import kubevirt as kv
from harness import objects
from harness.waiting import wait_for

A10 = "nvidia.com/GA102GL_A10"
Obj = dict[str, Any]


class Recorder:
    """Stands in for the simulator's three writes, and feeds them back into its caches as
    the watches would (a create's ADDED only when the test says so)."""

    def __init__(self, sim: kv.KubeVirtSimulator) -> None:
        self.sim = sim
        self.lock = threading.Lock()
        self.created: list[Obj] = []
        self.deleted: list[str] = []
        self.statuses: list[Obj] = []
        self.release = threading.Event()
        self.release.set()
        #: Whether a status write reaches the VMI cache at once (else it lags, as a watch may).
        self.echo = True
        self._names = itertools.count()
        self._versions = itertools.count(100)

    def create_pod(self, client: Any, manifest: Obj) -> tuple[Obj | None, kv.SyncError | None]:
        assert self.release.wait(10), "the test never released the create"
        pod = dict(manifest)
        meta = dict(manifest["metadata"])
        meta["name"] = f"{meta['generateName']}{next(self._names)}"
        meta["resourceVersion"] = str(next(self._versions))
        pod["metadata"] = meta
        with self.lock:
            self.created.append(pod)
        return pod, None

    def write_status(self, client: Any, vmi: Obj) -> bool:
        with self.lock:
            self.statuses.append(vmi["status"])
        written = dict(vmi)
        written["metadata"] = {
            **vmi["metadata"],
            "resourceVersion": str(next(self._versions)),
        }
        if self.echo:
            self.sim._vmis._apply("MODIFIED", written)
        return True

    def tear_down(self, client: Any, pod: Obj) -> None:
        with self.lock:
            self.deleted.append(pod["metadata"]["name"])


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[kv.KubeVirtSimulator]:
    api = pykube.HTTPClient(pykube.KubeConfig.from_url("http://127.0.0.1:9"), timeout=1)
    simulator = kv.KubeVirtSimulator(api)
    yield simulator
    simulator._stopping.set()
    simulator._queue.shutdown()


@pytest.fixture
def writes(sim: kv.KubeVirtSimulator) -> Recorder:
    recorder = Recorder(sim)
    sim._create_pod = recorder.create_pod  # type: ignore[method-assign]
    sim._write_status = recorder.write_status  # type: ignore[method-assign]
    sim._tear_down = recorder.tear_down  # type: ignore[method-assign]
    for cache in sim._caches:
        cache.synced.set()
    return recorder


def a_vmi(name: str = "vm-a", uid: str = "uid-a") -> Obj:
    return objects.vmi(
        name,
        namespace="tenant",
        uid=uid,
        rv="10",
        devices={"gpus": [{"name": "gpu0", "deviceName": A10}]},
    )


def drain(sim: kv.KubeVirtSimulator) -> list[kv.Key]:
    keys: list[kv.Key] = []
    while (key := sim._queue.get(timeout=0)) is not None:
        keys.append(key)
        sim._queue.done(key)
    return keys


def with_phase(pod: Obj, phase: str, node: str | None = None, rv: str = "500") -> Obj:
    out = dict(pod)
    out["metadata"] = {**pod["metadata"], "resourceVersion": rv}
    out["spec"] = {**pod["spec"], **({"nodeName": node} if node else {})}
    out["status"] = {"phase": phase}
    return out


def test_a_pod_event_queues_its_vmi_and_no_other(sim: kv.KubeVirtSimulator) -> None:
    pod = kv.render_launcher_pod(a_vmi(), None)
    assert isinstance(pod, dict)
    pod["metadata"]["name"] = "virt-launcher-vm-a-x"
    sim._pods._apply("ADDED", pod)
    assert drain(sim) == [("tenant", "vm-a")]
    sim._pods._apply("MODIFIED", with_phase(pod, "Running", "a10-0"))
    sim._pods._apply("DELETED", pod)
    assert drain(sim) == [("tenant", "vm-a")], "queued once for both events"


def test_a_pod_maps_to_its_vmi_by_controller_reference_then_label() -> None:
    pod = kv.render_launcher_pod(a_vmi(), None)
    assert isinstance(pod, dict)
    assert kv.vmi_key_of_pod(pod) == ("tenant", "vm-a")
    del pod["metadata"]["ownerReferences"]
    assert kv.vmi_key_of_pod(pod) == ("tenant", "vm-a")
    del pod["metadata"]["labels"][kv.VM_NAME_LABEL]
    assert kv.vmi_key_of_pod(pod) == kv.SWEEP


def test_a_kubevirt_cr_event_queues_every_vmi(sim: kv.KubeVirtSimulator) -> None:
    sim._vmis._replace([a_vmi("vm-a", "uid-a"), a_vmi("vm-b", "uid-b")])
    drain(sim)
    sim._kubevirts._apply("ADDED", {"metadata": {"name": "kv", "namespace": "kubevirt"}})
    assert sorted(drain(sim)) == [("tenant", "vm-a"), ("tenant", "vm-b")]


def test_a_relist_reports_what_the_watch_missed(sim: kv.KubeVirtSimulator) -> None:
    sim._vmis._replace([a_vmi("vm-a", "uid-a"), a_vmi("vm-b", "uid-b")])
    drain(sim)
    sim._vmis._replace([a_vmi("vm-b", "uid-b")])  # vm-a went while the watch was down
    assert drain(sim) == [("tenant", "vm-a")]
    assert sim._vmis.get(("tenant", "vm-a")) is None


def test_no_second_pod_before_the_cache_shows_the_first(
    sim: kv.KubeVirtSimulator, writes: Recorder
) -> None:
    key = ("tenant", "vm-a")
    sim._vmis._replace([a_vmi()])
    for _ in range(3):  # events keep coming; the pod cache has not seen the pod yet
        sim._sync(None, key)
    assert len(writes.created) == 1
    assert [s["phase"] for s in writes.statuses] == ["Scheduling"]

    sim._pods._apply("ADDED", writes.created[0])
    sim._sync(None, key)
    assert len(writes.created) == 1
    assert not sim._expected, "the pod cache showed the pod: the expectation is met"


def test_one_pod_per_vmi_under_concurrent_events_and_workers(
    sim: kv.KubeVirtSimulator, writes: Recorder
) -> None:
    vmis = [a_vmi(f"vm-{i}", f"uid-{i}") for i in range(5)]
    writes.release.clear()  # creates hang until every VMI had a storm of events
    writes.echo = False  # and no cache shows the pods or the statuses written meanwhile
    sim._vmis._replace(vmis)
    workers = [threading.Thread(target=sim._work, daemon=True) for _ in range(kv.WORKERS)]
    for w in workers:
        w.start()

    def storm() -> None:
        for _ in range(50):
            for v in vmis:
                sim._on_vmi(None, v)

    storms = [threading.Thread(target=storm) for _ in range(4)]
    for s in storms:
        s.start()
    for s in storms:
        s.join()
    writes.release.set()
    wait_for("a pod for every VMI", lambda: len(writes.created), lambda n: n >= len(vmis))
    storm()  # more events after the creates, before the pod cache shows any pod
    sim._queue.shutdown_with_drain(10)  # the workers take what is queued, then exit
    for w in workers:
        w.join(10)
    assert not any(w.is_alive() for w in workers)
    owners = sorted(p["metadata"]["labels"][kv.CREATED_BY_LABEL] for p in writes.created)
    assert owners == [f"uid-{i}" for i in range(5)]
    assert {s["phase"] for s in writes.statuses} == {"Scheduling"}, "nothing failed meanwhile"


def test_a_pod_deleted_after_the_cache_saw_it_fails_the_vmi_for_good(
    sim: kv.KubeVirtSimulator, writes: Recorder
) -> None:
    key = ("tenant", "vm-a")
    sim._vmis._replace([a_vmi()])
    sim._sync(None, key)
    [pod] = writes.created
    sim._pods._apply("ADDED", pod)
    sim._pods._apply("DELETED", pod)
    sim._sync(None, key)
    sim._sync(None, key)
    assert len(writes.created) == 1, "a VMI whose pod was deleted gets no new pod"
    assert [s["phase"] for s in writes.statuses] == ["Scheduling", "Failed"]


def test_a_running_pod_schedules_the_vmi(sim: kv.KubeVirtSimulator, writes: Recorder) -> None:
    key = ("tenant", "vm-a")
    sim._vmis._replace([a_vmi()])
    sim._sync(None, key)
    [pod] = writes.created
    sim._pods._apply("ADDED", with_phase(pod, "Running", "a10-3"))
    sim._sync(None, key)
    assert writes.statuses[-1] == {"phase": "Scheduled", "nodeName": "a10-3"}


def test_a_pod_whose_vmi_is_gone_or_replaced_is_torn_down(
    sim: kv.KubeVirtSimulator, writes: Recorder
) -> None:
    old = kv.render_launcher_pod(a_vmi("vm-a", "uid-old"), None)
    stray = kv.render_launcher_pod(a_vmi("vm-z", "uid-z"), None)
    assert isinstance(old, dict) and isinstance(stray, dict)
    old["metadata"]["name"] = "virt-launcher-vm-a-old"
    stray["metadata"]["name"] = "virt-launcher-vm-z-x"
    del stray["metadata"]["ownerReferences"]
    del stray["metadata"]["labels"][kv.VM_NAME_LABEL]
    sim._pods._replace([old, stray])
    sim._vmis._replace([a_vmi("vm-a", "uid-new")])  # same name, another VMI
    sim._sync(None, ("tenant", "vm-a"))
    assert writes.deleted == ["virt-launcher-vm-a-old"]
    sim._sync(None, kv.SWEEP)
    assert "virt-launcher-vm-z-x" in writes.deleted
