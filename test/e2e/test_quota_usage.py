"""Budgets visible where tenants look: ``kubectl describe quota`` prints, beside each GPU
budget's ``Hard``, the units the namespace's claims hold, and keeps doing so while the quota
controller keeps computing its own keys (``pods``) in the same status."""

from __future__ import annotations

from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from harness.claims import create_claim
from harness.fleet import Fleet
from harness.operator import Start
from harness.waiting import wait_for
from localcluster.cluster import kubectl

pytestmark = pytest.mark.operator_process  # it starts its own replica

CONVERGE = 30.0


def described(kubeconfig: Path, ns: str, name: str) -> dict[str, tuple[str, str]]:
    """``kubectl describe quota``'s table as ``{resource: (used, hard)}``."""
    out = kubectl(kubeconfig, "describe", "quota", name, "-n", ns)
    rows: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in out.splitlines():
        fields = line.split()
        if fields[:3] == ["Resource", "Used", "Hard"]:
            in_table = True
            continue
        if in_table and len(fields) == 3 and not set(fields[0]) <= {"-"}:
            rows[fields[0]] = (fields[1], fields[2])
    return rows


def test_describe_quota_shows_the_gpus_held_beside_each_budget(
    api: pykube.HTTPClient,
    kubeconfig: Path,
    fleet: Fleet,
    namespace: str,
    start_operator: Start,
) -> None:
    a = fleet.gpu_class("a")
    b = fleet.gpu_class("b")
    fleet.node(8)
    key_a, key_b = names.quota_key(a), names.quota_key(b)
    pykube.ResourceQuota(
        api,
        {
            "metadata": {"name": "gpus", "namespace": namespace},
            "spec": {"hard": {key_a: "4", names.QUOTA_TOTAL_KEY: "6", "pods": "10"}},
        },
    ).create()
    start_operator()
    create_claim(api, namespace, "two", a, 2)
    create_claim(api, namespace, "one", a, 1)
    one_b = create_claim(api, namespace, "one-b", b, 1)

    # a: 2 + 1; total: 2 + 1 + 1; the class without a budget key shows nowhere; pods is the
    # quota controller's own, computed alongside.
    expected = {key_a: ("3", "4"), names.QUOTA_TOTAL_KEY: ("4", "6"), "pods": ("0", "10")}
    wait_for(
        "describe quota to show the held units",
        lambda: described(kubeconfig, namespace, "gpus"),
        until=lambda rows: rows == expected,
        timeout=CONVERGE,
    )
    assert key_b not in described(kubeconfig, namespace, "gpus")

    # A released claim no longer counts; a pod counted by Kubernetes leaves our keys alone.
    one_b.delete()
    pykube.Pod(
        api,
        {
            "metadata": {"name": "plain", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    ).create()
    expected = {key_a: ("3", "4"), names.QUOTA_TOTAL_KEY: ("3", "6"), "pods": ("1", "10")}
    wait_for(
        "describe quota to show the release and the pod",
        lambda: described(kubeconfig, namespace, "gpus"),
        until=lambda rows: rows == expected,
        timeout=CONVERGE,
    )

    # A budget added later is filled in too.
    rq = pykube.ResourceQuota.objects(api, namespace=namespace).get(name="gpus")
    rq.patch(
        {"spec": {"hard": {key_b: "2"}}}
    )  # no resourceVersion: the quota controller writes it too
    expected = {**expected, key_b: ("0", "2")}
    wait_for(
        "describe quota to show the new budget",
        lambda: described(kubeconfig, namespace, "gpus"),
        until=lambda rows: rows == expected,
        timeout=CONVERGE,
    )
