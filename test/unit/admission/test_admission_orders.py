"""The order webhook (docs/design.md §5) on the product's caches: an order is judged on what the
caches hold (its class and its published figures, its namespace's entitlement, quotas and
claims, never another namespace's), refused as 403 Forbidden with a message that names the
claim; template claims and operations other than CREATE pass; a dry run is judged the same;
a new class before its first status is not refused for room."""

from __future__ import annotations

from typing import Any

import pytest

from admission import orders
from gpuoperator import names
from gpuoperator.runtime import admitting
from harness import objects
from harness.objects import NS
from harness.offline import store_caches

Obj = objects.Obj
FIGURES = {"free": 6, "maxFreePerNode": 4, "nodes": 2}


order = objects.claim  # an order: a claim without status


def webhook(
    *classes: Obj, entitled: bool = False, claims: tuple[Obj, ...] = ()
) -> orders.OrderWebhook:
    caches = store_caches(
        classes=classes or [objects.gpuclass(status=dict(FIGURES))], claims=claims
    )
    caches.namespaces.store.put(objects.namespace(entitled=entitled))
    caches.namespaces.store.put(objects.namespace("other"))
    return orders.OrderWebhook(caches)


def judge(hook: orders.OrderWebhook, obj: Obj, **request: Any) -> admitting.Admission:
    return hook(objects.admission_request(obj, kind=names.GPU_CLAIM, group=names.GROUP, **request))


def test_an_order_that_fits_is_allowed_without_a_patch() -> None:
    assert judge(webhook(), order(count=4)) == admitting.Admission.allow()


def test_an_order_of_a_missing_class_is_refused_naming_the_claim_and_the_classes() -> None:
    answer = judge(webhook(), order(class_name="h100"))
    assert (answer.allowed, answer.code, answer.reason) == (False, 403, "Forbidden")
    assert answer.message.startswith(f"GPUClaim {NS}/hold: spec.className: class h100 ")
    assert "does not exist" in answer.message and "a10" in answer.message


def test_an_order_above_the_published_room_on_one_node_is_refused() -> None:
    answer = judge(webhook(), order(count=5))
    assert not answer.allowed
    assert "at most 4 free GPUs on one node" in answer.message


def test_a_class_before_its_first_status_is_not_refused_for_room() -> None:
    assert judge(webhook(objects.gpuclass()), order(count=5)).allowed


def test_an_order_above_maxcount_is_refused() -> None:
    answer = judge(webhook(objects.gpuclass(status=dict(FIGURES), maxCount=2)), order(count=3))
    assert not answer.allowed and "allows at most 2 GPUs per claim" in answer.message


def test_an_order_over_its_namespaces_budget_is_refused_counting_only_its_namespace() -> None:
    hook = webhook(
        claims=(
            objects.claim("held", count=2, phase="Bound", node="n1"),
            objects.claim("elsewhere", namespace="other", count=4, phase="Bound", node="n1"),
        )
    )
    hook.caches.quotas.store.put(objects.quota({names.quota_key("a10"): "3"}))
    hook.caches.quotas.store.put(objects.quota({names.quota_key("a10"): "0"}, namespace="other"))

    assert judge(hook, order(count=1)).allowed
    refused = judge(hook, order(count=2))
    assert not refused.allowed and "budget exceeded" in refused.message
    assert f"ResourceQuota {NS}/gpus allows 3" in refused.message


def test_a_claim_being_deleted_is_charged_until_it_is_gone() -> None:
    """The tenant deletes a claim her VM keeps (its finalizer holds it): the budget it uses
    is not free for a new order until the claim is gone from the cache."""
    leaving = objects.claim("leaving", count=2, phase="Bound", node="n1", deleting=True)
    hook = webhook(claims=(objects.claim("held", count=1, phase="Bound", node="n1"), leaving))
    hook.caches.quotas.store.put(objects.quota({names.QUOTA_TOTAL_KEY: "3"}))

    refused = judge(hook, order("again", count=2))
    assert not refused.allowed
    assert refused.message == (
        f"GPUClaim {NS}/again: spec.count: budget exceeded: ResourceQuota {NS}/gpus allows 3 "
        "of gpuclass.cozystack.io/devices, 3 are held (2 by claims being deleted, charged "
        "until they are gone), 2 were ordered"
    )
    hook.caches.claims.store.remove((NS, "leaving"))
    assert judge(hook, order("again", count=2)).allowed


def test_a_refusal_names_only_the_requests_own_namespaces_objects() -> None:
    """A review for namespace A (forged or not) reads A's quotas and claims only: another
    namespace's claims, quotas and usage never reach the message."""
    hook = webhook(
        claims=(
            objects.claim("mine", count=2, phase="Bound", node="n1"),
            objects.claim("secret-project", namespace="other", count=3, phase="Bound", node="n1"),
        )
    )
    hook.caches.quotas.store.put(objects.quota({names.QUOTA_TOTAL_KEY: "2"}))
    hook.caches.quotas.store.put(
        objects.quota({names.QUOTA_TOTAL_KEY: "7"}, name="other-budget", namespace="other")
    )
    refused = judge(hook, order(class_name="h100", count=5))
    assert not refused.allowed
    for foreign in ("other", "secret-project", "7", "3 are held"):
        assert foreign not in refused.message, (foreign, refused.message)
    assert f"ResourceQuota {NS}/gpus allows 2" in refused.message
    assert "2 are held" in refused.message


def test_a_vgpu_order_needs_the_namespaces_entitlement() -> None:
    vgpu = objects.gpuclass("l40s", mode="vgpu", status=dict(FIGURES), profile="NVIDIA L40S-24Q")
    refused = judge(webhook(vgpu), order(class_name="l40s"))
    assert not refused.allowed
    assert f"namespace {NS} is not entitled to vGPU" in refused.message
    assert judge(webhook(vgpu, entitled=True), order(class_name="l40s")).allowed


def test_an_order_with_a_generated_name_is_named_as_generated() -> None:
    obj = order(class_name="h100")
    obj["metadata"] = {"generateName": "hold-"}
    answer = judge(webhook(), obj)
    assert answer.message.startswith(f"GPUClaim {NS}/(generated): ")


def test_a_dry_run_order_is_judged_the_same() -> None:
    hook = webhook()
    assert judge(hook, order(count=5), dry_run=True) == judge(hook, order(count=5))
    assert judge(hook, order(count=1), dry_run=True).allowed


def test_template_claims_are_not_judged() -> None:
    made = order(class_name="h100", count=99)
    made["metadata"]["labels"] = {names.TEMPLATE_CLAIM_LABEL: names.TRUE}
    assert judge(webhook(), made) == admitting.Admission.allow()


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE"])
def test_only_creates_are_judged(operation: str) -> None:
    bad = order(class_name="h100")
    assert judge(webhook(), bad, operation=operation, old=bad) == admitting.Admission.allow()
