"""The order webhook on the real API server (registered by URL with a caBundle): every
refusal of docs/design.md §5 with its message, dry runs, and template claims passing through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from harness import kube
from harness.edit_tenant import edit_tenant
from harness.fleet import Fleet, published
from harness.kube import refused
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator
from localcluster.cluster import kubectl


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


def order(
    api: pykube.HTTPClient,
    namespace: str,
    class_name: str,
    count: int,
    name: str = "order",
    **labels: str,
) -> GPUClaim:
    claim = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"className": class_name, "count": count},
        },
    )
    claim.create()
    return claim


def quota(api: pykube.HTTPClient, namespace: str, name: str, hard: dict[str, str]) -> None:
    pykube.ResourceQuota(
        api, {"metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}
    ).create()


def test_an_unknown_class_is_refused_naming_it(
    api: pykube.HTTPClient, hooks: WebhookOperator
) -> None:
    ns = hooks.tenant(api)
    with refused(403) as r:
        order(api, ns, "no-such-class", 1, name="big")
    assert f"GPUClaim {ns}/big" in r[0].message
    assert "spec.className: class no-such-class does not exist" in r[0].message


def test_an_order_that_fits_is_created(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    published(api, cls, 4)
    ns = hooks.tenant(api)
    claim = order(api, ns, cls, 2)
    assert claim.obj["spec"]["count"] == 2


def test_an_order_above_max_free_per_node_is_refused(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet
) -> None:
    cls = fleet.gpu_class()
    fleet.node(2)
    fleet.node(2)
    published(api, cls, 2)
    ns = hooks.tenant(api)
    with refused(403) as r:
        order(api, ns, cls, 4, name="big")
    assert (
        f"GPUClaim {ns}/big: spec.count: class {cls} has at most 2 free GPUs on one node, "
        "4 were ordered" in r[0].message
    ), r[0].message


def test_an_order_above_max_count_is_refused(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet
) -> None:
    cls = fleet.gpu_class(maxCount=1)
    fleet.node(4)
    published(api, cls, 4)
    ns = hooks.tenant(api)
    with refused(403) as r:
        order(api, ns, cls, 2)
    assert f"spec.count: class {cls} allows at most 1 GPU per claim" in r[0].message


@pytest.mark.parametrize("which", ["per-class", "total", "two-quotas"])
def test_budgets_refuse_orders_that_would_exceed_them(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet, which: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(8)
    published(api, cls, 8)
    ns = hooks.tenant(api)
    if which == "per-class":
        quota(api, ns, "gpus", {names.quota_key(cls): "3"})
    elif which == "total":
        quota(api, ns, "gpus", {names.QUOTA_TOTAL_KEY: "3"})
    else:
        quota(api, ns, "generous", {names.QUOTA_TOTAL_KEY: "10"})
        quota(api, ns, "strict", {names.quota_key(cls): "3"})
    order(api, ns, cls, 2, name="first")
    # The webhook judges on its cache: an order placed the same instant as another can
    # pass it (the binder re-checks, see test_binding). Wait until the first order is
    # bound, so the operator has certainly seen it.
    wait_for(
        "the first order bound",
        lambda: GPUClaim.objects(api, namespace=ns).get(name="first").obj.get("status"),
        until=lambda s: bool(s) and s.get("phase") == "Bound",
        timeout=15,
    )
    with refused(403) as r:
        order(api, ns, cls, 2, name="second")
    message = r[0].message
    assert "budget exceeded" in message and "2 were ordered" in message, message
    key = names.QUOTA_TOTAL_KEY if which == "total" else names.quota_key(cls)
    assert key in message
    order(api, ns, cls, 1, name="third")  # what is left still fits


def test_a_vgpu_class_needs_the_entitlement(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet
) -> None:
    cls = fleet.gpu_class(mode="vgpu", profile="G1-8Q")
    fleet.node(4)
    published(api, cls, 4)
    plain = hooks.tenant(api)
    with refused(403) as r:
        order(api, plain, cls, 1)
    assert f"namespace {plain} is not entitled to vGPU" in r[0].message
    assert "gpu.cozystack.io/vgpu-entitled=true" in r[0].message
    entitled = hooks.tenant(api, entitled=True)
    order(api, entitled, cls, 1)


def test_a_dry_run_is_judged_the_same_and_leaves_nothing(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet, kubeconfig: Path
) -> None:
    cls = fleet.gpu_class()
    fleet.node(2)
    published(api, cls, 2)
    ns = hooks.tenant(api)

    def dry(count: int) -> Any:
        manifest = (
            f"apiVersion: {names.API_VERSION}\nkind: GPUClaim\nmetadata:\n"
            f"  name: dry\n  namespace: {ns}\nspec:\n  className: {cls}\n"
            f"  count: {count}\n"
        )
        return kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=manifest)

    with pytest.raises(Exception, match="has at most 2 free GPUs on one node"):
        dry(3)
    assert "created (server dry run)" in dry(1)
    assert GPUClaim.objects(api, namespace=ns).get_or_none(name="dry") is None


def test_template_claims_are_not_judged_they_wait_for_capacity(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet, deployed: Deployed
) -> None:
    cls = fleet.gpu_class()
    fleet.node(2)
    published(api, cls, 2)
    ns = hooks.tenant(api)
    # Only the operator's ServiceAccount may set the mark (the tamper policy, deployed).
    operator = kube.client(deployed.kubeconfig)
    claim = order(operator, ns, cls, 6, name="vm-template", **{names.TEMPLATE_CLAIM_LABEL: "true"})
    assert claim.obj["spec"]["count"] == 6


KEEP = "gpuoperator.test/keep"  # the test's own finalizer: keeps a deleted claim around


def test_a_claim_being_deleted_is_charged_until_it_is_gone(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet, kubeconfig: Path
) -> None:
    """A tenant with ``edit`` uses her whole budget, then deletes the claim while something
    keeps it (here a finalizer the admin adds, as a running VM keeps a claim): she cannot
    order the units again until the claim is gone, whatever she does to her own objects."""
    cls = fleet.gpu_class()
    fleet.node(4)
    published(api, cls, 4)
    ns = hooks.tenant(api)
    tenant = edit_tenant(api, kubeconfig, ns)
    quota(api, ns, "gpus", {names.quota_key(cls): "2"})
    first = order(tenant.api, ns, cls, 2, name="first")
    wait_for(
        "the first order bound",
        lambda: GPUClaim.objects(api, namespace=ns).get(name="first").obj.get("status"),
        until=lambda s: bool(s) and s.get("phase") == "Bound",
        timeout=15,
    )
    kept = GPUClaim.objects(api, namespace=ns).get(name="first")
    kube.mutate(kept, lambda c: c["metadata"].setdefault("finalizers", []).append(KEEP))
    first.delete()  # as the tenant
    # The operator has seen the deletion once it released its own finalizer (no VM uses the
    # claim): the webhook reads the same caches.
    leaving = wait_for(
        "the operator to release its finalizer of the deleted claim",
        lambda: GPUClaim.objects(api, namespace=ns).get(name="first").obj["metadata"],
        until=lambda m: m.get("deletionTimestamp") and m.get("finalizers") == [KEEP],
        timeout=15,
    )
    assert leaving["deletionTimestamp"]
    with refused(403) as r:
        order(tenant.api, ns, cls, 1, name="again")
    assert (
        f"GPUClaim {ns}/again: spec.count: budget exceeded: ResourceQuota {ns}/gpus allows 2 "
        f"of {names.quota_key(cls)}, 2 are held (2 by claims being deleted, charged until "
        "they are gone), 1 was ordered"
    ) in r[0].message, r[0].message
    wait_for(
        "the quota to show the deleted claim as used",
        lambda: pykube.ResourceQuota.objects(api, namespace=ns).get(name="gpus").obj,
        until=lambda q: (q.get("status") or {}).get("used", {}).get(names.quota_key(cls)) == "2",
        timeout=15,
    )

    kube.mutate(kept, lambda c: c["metadata"].update(finalizers=[]))
    wait_for(
        "the deleted claim to be gone",
        lambda: GPUClaim.objects(api, namespace=ns).get_or_none(name="first"),
        until=lambda c: c is None,
        timeout=15,
    )

    def dry_run_refusal() -> str:
        r = tenant.api.post(
            version=names.API_VERSION,
            namespace=ns,
            url=names.GPU_CLAIMS,
            params={"dryRun": "All"},
            data=json.dumps(
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.GPU_CLAIM,
                    "metadata": {"name": "again", "namespace": ns},
                    "spec": {"className": cls, "count": 2},
                }
            ),
        )
        return "" if r.ok else str(r.json().get("message", r.text))

    wait_for("the webhook to admit the order again", dry_run_refusal, until=lambda m: m == "")
    assert order(tenant.api, ns, cls, 2, name="again").obj["spec"]["count"] == 2
