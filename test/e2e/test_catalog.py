"""The catalog on the real control plane: GPUNode inventory and GPUClass status follow
pods placed by the real scheduler, claims, cordons, readiness and taints.

Each test gets simulated nodes of its own with a resource name of its own, so figures are
exact whatever else runs on the cluster. One operator replica serves the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass, GPUNode
from harness.fleet import Fleet
from harness.kube import Obj, mutate
from harness.operator import Deployed, OperatorProcess
from harness.waiting import wait_for

pytestmark = pytest.mark.operator_process  # it starts its own replicas

CONVERGE = 15.0  # seconds: status must follow a change well within this


@pytest.fixture(scope="module")
def operator(
    deployed: Deployed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(deployed, "catalog", tmp_path_factory.mktemp("op"))
    try:
        op.wait_ready()
        yield op
    finally:
        op.stop()


@pytest.fixture
def fleet(fleet: Fleet, operator: OperatorProcess) -> Fleet:
    """The shared fleet, with this module's operator running."""
    return fleet


@pytest.fixture
def namespace(hoster_namespace: str) -> str:
    """Plain GPU pods (requesting a class's resource without a claim) are the hoster's jobs: the
    admission policies admit them only in an exempt namespace, so this module's tests run in
    the test cluster's exempt hoster namespace."""
    return hoster_namespace


def class_status(api: pykube.HTTPClient, name: str) -> Obj:
    status: Obj = GPUClass.objects(api).get(name=name).obj.get("status") or {}
    return status


def figures(api: pykube.HTTPClient, name: str) -> tuple[int, int, int]:
    s = class_status(api, name)
    return s.get("free", -1), s.get("maxFreePerNode", -1), s.get("nodes", -1)


def wait_figures(api: pykube.HTTPClient, cls: str, expected: tuple[int, int, int]) -> None:
    wait_for(
        f"{cls} status free/maxFreePerNode/nodes = {expected}",
        lambda: figures(api, cls),
        until=lambda f: f == expected,
        timeout=CONVERGE,
    )


def gpu_pod(
    api: pykube.HTTPClient,
    namespace: str,
    name: str,
    resource: str,
    units: int,
    tolerate: bool = True,
    labels: dict[str, str] | None = None,
) -> pykube.Pod:
    pod = pykube.Pod(
        api,
        {
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}] if tolerate else [],
                "containers": [
                    {
                        "name": "c",
                        "image": "gpu-job",
                        "resources": {"limits": {resource: str(units)}},
                    }
                ],
            },
        },
    )
    wait_for(
        "the namespace's default ServiceAccount",
        lambda: pykube.ServiceAccount.objects(api, namespace=namespace).get_or_none(name="default"),
    )
    pod.create()
    return pod


def test_a_gpunode_appears_for_each_gpu_node_owned_by_the_node(
    api: pykube.HTTPClient, fleet: Fleet
) -> None:
    fleet.gpu_class()
    name = fleet.node(8)
    gpunode = wait_for(
        f"GPUNode {name}", lambda: GPUNode.objects(api).get_or_none(name=name), timeout=CONVERGE
    )
    owner = gpunode.obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", name, True)
    # The node may be seen before it is Ready (no eligible class yet): wait for the
    # status to converge on the Ready node.
    status = wait_for(
        "devices and the eligible class",
        lambda: GPUNode.objects(api).get(name=name).obj.get("status"),
        until=lambda s: bool(s and s.get("devices") and s.get("classes")),
        timeout=CONVERGE,
    )
    assert status["devices"] == [
        {"resourceName": fleet.resource, "capacity": 8, "allocatable": 8, "allocated": 0, "free": 8}
    ]
    assert status["classes"] == [{"name": f"c-{fleet.tag}", "free": 8}]
    schedulable = next(c for c in status["conditions"] if c["type"] == "Schedulable")
    assert schedulable["status"] == "True"


def test_scheduled_gpu_pods_lower_free_and_deleting_them_restores_it(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str
) -> None:
    cls = fleet.gpu_class()
    a, b = fleet.node(8), fleet.node(4)
    wait_figures(api, cls, (12, 8, 2))
    p1 = gpu_pod(api, namespace, "job-1", fleet.resource, 3)
    p2 = gpu_pod(api, namespace, "job-2", fleet.resource, 4)
    for p in (p1, p2):
        wait_for(f"{p.name} placed by the scheduler", partial(_node_of, p), timeout=CONVERGE)
    placed = sorted([_node_of(p1), _node_of(p2)])
    assert set(placed) <= {a, b}
    wait_figures(api, cls, (12 - 7, _max_free({a: 8, b: 4}, {p1: 3, p2: 4}), 2))
    p1.delete()
    p2.delete()
    wait_figures(api, cls, (12, 8, 2))


def _node_of(pod: pykube.Pod) -> str:
    pod.reload()
    return str(pod.obj["spec"].get("nodeName") or "")


def _max_free(nodes: dict[str, int], pods: dict[pykube.Pod, int]) -> int:
    left = dict(nodes)
    for pod, units in pods.items():
        left[_node_of(pod)] -= units
    return max(left.values())


@pytest.mark.parametrize(
    ("change", "undo"),
    [
        ("cordon", "uncordon"),
        ("not-ready", "ready"),
        ("taint-noschedule", "tolerate"),
        ("taint-disk-pressure", "tolerate"),
    ],
)
def test_a_node_leaves_the_class_when_unfit_and_returns_when_fit_again(
    api: pykube.HTTPClient, fleet: Fleet, change: str, undo: str
) -> None:
    cls = fleet.gpu_class()
    name = fleet.node(8)
    fleet.node(4)
    wait_figures(api, cls, (12, 8, 2))
    node = pykube.Node.objects(api).get(name=name)
    taint = (
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
        if change == "taint-noschedule"
        else {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}
    )
    if change == "cordon":
        mutate(node, lambda o: o["spec"].__setitem__("unschedulable", True))
    elif change == "not-ready":
        _set_condition(node, "Ready", "False")
    elif change == "taint-disk-pressure":
        # As kubelet reports it: the node lifecycle controller turns the condition into
        # the taint (and would remove a hand-made taint while the condition is False).
        _set_condition(node, "DiskPressure", "True")
    else:
        mutate(node, lambda o: o["spec"].__setitem__("taints", [taint]))
    wait_figures(api, cls, (4, 4, 1))
    if change == "cordon":  # the node inventory says why (its own controller: wait for it)
        wait_for(
            "Schedulable=False/Cordoned",
            lambda: GPUNode.objects(api).get(name=name).obj,
            until=lambda o: _condition(o, "Schedulable")["reason"] == "Cordoned",
            timeout=CONVERGE,
        )
    if undo == "uncordon":
        mutate(node, lambda o: o["spec"].__setitem__("unschedulable", False))
    elif undo == "ready":
        _set_condition(node, "Ready", "True")
    else:
        mutate(
            GPUClass.objects(api).get(name=cls),
            lambda o: o["spec"].__setitem__("tolerations", [dict(taint)]),
        )
    wait_figures(api, cls, (12, 8, 2))


def _set_condition(node: pykube.Node, type_: str, status: str) -> None:
    def change(obj: Obj) -> None:
        for c in obj["status"]["conditions"]:
            if c["type"] == type_:
                c["status"] = status
                c["reason"] = f"Test{type_}{status}"

    mutate(node, change, subresource="status")


def _condition(obj: Obj, type_: str) -> Obj:
    found: Obj = next(c for c in obj["status"]["conditions"] if c["type"] == type_)
    return found


def test_classes_sharing_a_resource_see_the_same_capacity(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str
) -> None:
    first = fleet.gpu_class("-a")
    second = fleet.gpu_class("-b", tolerations=[{"operator": "Exists"}])
    fleet.node(6)
    wait_figures(api, first, (6, 6, 1))
    wait_figures(api, second, (6, 6, 1))
    gpu_pod(api, namespace, "shared", fleet.resource, 2)
    wait_figures(api, first, (4, 4, 1))
    wait_figures(api, second, (4, 4, 1))


def test_a_plain_gpu_pod_labelled_as_claim_backed_still_counts(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str
) -> None:
    cls = fleet.gpu_class()
    name = fleet.node(6)
    wait_figures(api, cls, (6, 6, 1))
    pod = gpu_pod(
        api, namespace, "labelled", fleet.resource, 2, labels={names.CLAIMS_LABEL: names.TRUE}
    )
    wait_for("the pod placed", lambda: _node_of(pod), until=lambda n: n == name, timeout=CONVERGE)
    wait_figures(api, cls, (4, 4, 1))
    wait_for(
        "the GPUNode counting the pod",
        lambda: [
            (d["allocatable"], d["allocated"], d["free"])
            for d in (GPUNode.objects(api).get(name=name).obj.get("status") or {}).get("devices")
            or []
        ],
        until=lambda figures: figures == [(6, 2, 4)],
        timeout=CONVERGE,
    )


@pytest.mark.overcommits
def test_bound_claims_hold_units_and_pods_overrunning_them_mark_the_node_overcommitted(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str
) -> None:
    cls = fleet.gpu_class()
    name = fleet.node(4)
    wait_figures(api, cls, (4, 4, 1))
    claim = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": "hold", "namespace": namespace},
            "spec": {"className": cls, "count": 3},
        },
    )
    claim.create()  # the operator's binder binds it to the only node of the class
    wait_for(
        "the claim bound",
        lambda: GPUClaim.objects(api, namespace=namespace).get(name="hold").obj.get("status") or {},
        until=lambda s: s.get("phase") == "Bound" and s.get("nodeName") == name,
        timeout=CONVERGE,
    )
    wait_figures(api, cls, (1, 1, 1))
    pod = gpu_pod(api, namespace, "intruder", fleet.resource, 2)  # the scheduler sees 4 free
    wait_for(
        "the intruder placed", lambda: _node_of(pod), until=lambda n: n == name, timeout=CONVERGE
    )
    wait_figures(api, cls, (0, 0, 1))
    over = wait_for(
        "Overcommitted",
        lambda: GPUNode.objects(api).get(name=name).obj,
        until=lambda o: _condition(o, "Overcommitted")["status"] == "True",
        timeout=CONVERGE,
    )
    assert f"{namespace}/intruder" in _condition(over, "Overcommitted")["message"]
    device = over["status"]["devices"][0]
    assert (device["allocated"], device["free"]) == (5, 0)
    # A fresh query per look: a pykube query caches its first result.
    wait_for(
        "an Overcommitted event",
        lambda: len(
            pykube.Event.objects(api, namespace="default").filter(
                field_selector={"involvedObject.name": name, "reason": "Overcommitted"}
            )
        ),
        until=lambda n: n >= 1,
        timeout=CONVERGE,
    )
    pod.delete()
    wait_for(
        "no longer overcommitted",
        lambda: GPUNode.objects(api).get(name=name).obj,
        until=lambda o: _condition(o, "Overcommitted")["status"] == "False",
        timeout=CONVERGE,
    )


def test_a_class_named_by_a_claim_is_held_until_the_claim_goes(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str
) -> None:
    cls = fleet.gpu_class()
    wait_for(
        "the protection finalizer",
        lambda: GPUClass.objects(api).get(name=cls).obj,
        until=lambda o: names.CLASS_PROTECTION_FINALIZER in o["metadata"].get("finalizers", []),
        timeout=CONVERGE,
    )
    claim = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": "holder", "namespace": namespace},
            "spec": {"className": cls, "count": 1},
        },
    )
    claim.create()
    GPUClass.objects(api).get(name=cls).delete()
    held = wait_for(
        "the deletion to be held",
        lambda: GPUClass.objects(api).get(name=cls).obj,
        until=lambda o: bool(o["metadata"].get("deletionTimestamp")),
    )
    assert names.CLASS_PROTECTION_FINALIZER in held["metadata"]["finalizers"]
    claim.delete()
    wait_for(
        "the class to be gone",
        lambda: GPUClass.objects(api).get_or_none(name=cls),
        until=lambda o: o is None,
        timeout=CONVERGE,
    )
    fleet.classes = [c for c in fleet.classes if c.name != cls]
