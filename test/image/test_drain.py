"""`kubectl drain` of the node the Deployment's pods run on honours the PodDisruptionBudget.

No kubelet runs pods on these machines (docs/development.md, the image): the Deployment's
two pods run on a node kwok simulates, kwok playing the kubelet (pods turn Running and
Ready at once, and go when deleted). Everything else is real: the rendered Deployment and
PDB (``config/manager``), the deployment, ReplicaSet and disruption controllers of
kube-controller-manager, the scheduler, the Eviction API and kubectl's drain. The pods are
pinned to a node of their own (a label and a taint only they tolerate, as a hoster would
give the operator nodes of its own beside the GPU nodes), scaled up and back down the way
the e2e suite does it on kind (``harness.scaled``).

While only that node can take them, the drain evicts one pod (the PDB allows one
disruption of two) and the API server refuses the other's eviction (429) until its
replacement is Ready elsewhere; once a second such node joins, the replacement lands
there and the drain completes. At no moment is fewer than one pod Ready.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pykube
import pytest

from harness import kube
from harness.scaled import ScaledDeployment
from harness.waiting import wait_for
from localcluster import deployment, profile
from localcluster.cluster import LocalCluster, kubectl, kubectl_binary

LABEL = "gpuoperator.test/operator-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
#: How long the blocked drain keeps retrying the refused eviction (kubectl retries every 5 s).
BLOCKED_FOR = 20


def operator_node(api: pykube.HTTPClient, name: str) -> pykube.Node:
    group = profile.NodeGroup(name=name, resources={}, labels={LABEL: "true"})
    manifest = profile.node_manifest(name, group)
    manifest["spec"]["taints"] = [TAINT]
    node = pykube.Node(api, manifest)
    node.create()
    wait_for(
        f"node {name} Ready",
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (pykube.Node.objects(api).get(name=name).obj.get("status") or {}).get(
                "conditions", []
            )
        ),
        timeout=60,
    )
    return node


@dataclass
class ReadyWatch:
    """The Deployment's Ready pods (not terminating), sampled from a thread: the fewest seen."""

    api: pykube.HTTPClient
    namespace: str
    selector: dict[str, str]
    fewest: int | None = None
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def ready(self, api: pykube.HTTPClient | None = None) -> int:
        pods = pykube.Pod.objects(api or self.api, namespace=self.namespace).filter(
            selector=self.selector
        )
        return sum(
            1
            for p in pods
            if not p.obj["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.obj.get("status") or {}).get("conditions", [])
            )
        )

    def __enter__(self) -> ReadyWatch:
        self._thread = threading.Thread(target=self._run, name="ready-pods", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        client = pykube.HTTPClient(self.api.config, timeout=10)
        while not self._stop.wait(0.2):
            n = self.ready(client)
            self.samples += 1
            self.fewest = n if self.fewest is None else min(self.fewest, n)


def drain(cluster: LocalCluster, node: str, timeout: int) -> tuple[int, str, float]:
    """``kubectl drain`` (exit code, its output, seconds taken)."""
    start = time.monotonic()
    proc = subprocess.run(
        [
            kubectl_binary(),
            f"--kubeconfig={cluster.kubeconfig}",
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            f"--timeout={timeout}s",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout + 60,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def pods_by_node(
    api: pykube.HTTPClient, namespace: str, selector: dict[str, str]
) -> dict[str, str]:
    pods = pykube.Pod.objects(api, namespace=namespace).filter(selector=selector)
    return {
        p.name: (p.obj["spec"].get("nodeName") or "Pending")
        + (" (terminating)" if p.obj["metadata"].get("deletionTimestamp") else "")
        for p in pods
    }


@pytest.fixture
def pinned(
    cluster: LocalCluster, rendered: deployment.Rendered
) -> Iterator[tuple[ScaledDeployment, pykube.HTTPClient, list[pykube.Node]]]:
    """The Deployment pinned to the operator's own nodes (a nodeSelector and a toleration),
    the first such node made; its pods scaled up by ``ScaledDeployment`` (without the
    webhook configurations: here nothing in those pods would serve them). Afterwards:
    scaled to 0, pods gone, the pinning undone, the nodes deleted."""
    api = kube.client(cluster.kubeconfig)
    name = rendered.deployment["metadata"]["name"]
    ns = rendered.namespace
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {LABEL: "true"},
                    "tolerations": [{**TAINT, "operator": "Equal"}],
                }
            }
        }
    }
    nodes = [operator_node(api, "image-operator-0")]
    kubectl(cluster.kubeconfig, "-n", ns, "patch", "deployment", name, "-p", json.dumps(patch))
    without_webhooks = dataclasses.replace(
        rendered,
        objects=tuple(o for o in rendered.objects if o["kind"] not in deployment.WEBHOOK_KINDS),
    )
    scaled = ScaledDeployment(
        cluster.kubeconfig, without_webhooks, kubectl, replicas=2, timeout=120
    )
    try:
        yield scaled, api, nodes
    finally:
        assert scaled.users == 0
        scaled.absent()  # the same take-out as between e2e modules
        undo = [
            {"op": "remove", "path": "/spec/template/spec/nodeSelector"},
            {"op": "remove", "path": "/spec/template/spec/tolerations"},
        ]
        kubectl(
            cluster.kubeconfig,
            "-n",
            ns,
            "patch",
            "deployment",
            name,
            "--type=json",
            "-p",
            json.dumps(undo),
        )
        for node in nodes:
            node.delete()


def test_a_drain_of_the_operators_node_honours_the_pdb(
    pinned: tuple[ScaledDeployment, pykube.HTTPClient, list[pykube.Node]],
    cluster: LocalCluster,
    rendered: deployment.Rendered,
) -> None:
    scaled, api, nodes = pinned
    ns = rendered.namespace
    selector = rendered.deployment["spec"]["selector"]["matchLabels"]
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    first = nodes[0].name
    with scaled.serving():
        rollout = scaled.changes[-1].seconds
        before = pods_by_node(api, ns, selector)
        assert sorted(before.values()) == [first, first], before
        with ReadyWatch(api, ns, selector) as watch:
            code, blocked_out, blocked_for = drain(cluster, first, BLOCKED_FOR)
            during = pods_by_node(api, ns, selector)
            refusals = blocked_out.count("violate the pod's disruption budget")
            nodes.append(operator_node(api, "image-operator-1"))
            second = nodes[-1].name
            code2, done_out, done_in = drain(cluster, first, 120)
            wait_for("two pods Ready again", watch.ready, until=lambda n: n == 2, timeout=60)
        after = wait_for(
            f"the pods on {second} only",
            lambda: pods_by_node(api, ns, selector),
            until=lambda pods: sorted(pods.values()) == [second, second],
            timeout=60,
        )
    print(
        f"\ndrain: 2 pods Ready on {first} after {rollout:.1f}s; PDB minAvailable 1. "
        f"Drain with only {first} for them: exit {code} after {blocked_for:.1f}s, "
        f"{refusals} evictions refused by the PDB (429), pods then {during}. "
        f"{second} joined: drain exit {code2} in {done_in:.1f}s; pods {after}; "
        f"fewest Ready pods seen {watch.fewest} in {watch.samples} samples"
    )
    assert code != 0, f"the drain finished although the PDB allowed one disruption:\n{blocked_out}"
    assert refusals >= 1, blocked_out
    assert list(during.values()).count(first) == 1, during
    assert list(during.values()).count("Pending") == 1, during
    assert code2 == 0, done_out
    assert sorted(after.values()) == [second, second], after
    assert watch.samples > 0
    assert watch.fewest is not None
    assert watch.fewest >= 1
