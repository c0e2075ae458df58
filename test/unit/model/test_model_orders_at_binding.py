"""The bind-time refusal the binder applies before planning (``orders.binding_refusal``): the
vGPU entitlement first, then the budgets, with the same messages as the order webhook's
refusals (only the field in front differs)."""

from __future__ import annotations

from typing import Any

from gpuoperator.model import orders

Obj = dict[str, Any]
NS = "tenant-a"
ENTITLED = "gpu.cozystack.io/vgpu-entitled"
TOTAL = "gpuclass.cozystack.io/devices"


def gpuclass(name: str, mode: str, max_count: int | None = None) -> Obj:
    spec: Obj = {"mode": mode, "source": {"devicePlugin": {"resourceName": f"x.com/{name}"}}}
    if max_count is not None:
        spec["maxCount"] = max_count
    return {"metadata": {"name": name}, "spec": spec}


def claim(name: str, class_name: str, count: int, phase: str | None = None) -> Obj:
    obj: Obj = {
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": "2024-05-01T10:00:00Z"},
        "spec": {"className": class_name, "count": count},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def namespace(entitled: bool) -> Obj:
    return {"metadata": {"name": NS, "labels": {ENTITLED: "true"} if entitled else {}}}


QUOTA = {"metadata": {"name": "gpus", "namespace": NS}, "spec": {"hard": {TOTAL: "2"}}}
VGPU = gpuclass("l40s", "vgpu")
A10 = gpuclass("a10", "passthrough", max_count=2)


def test_an_unentitled_namespace_is_refused_with_the_order_webhooks_message() -> None:
    new = claim("t", "l40s", 1)
    refusal = orders.binding_refusal(new, VGPU, namespace(False), [], [])
    assert refusal == orders.Refusal(
        orders.RefusalReason.NOT_ENTITLED,
        f"class l40s is a vGPU class; namespace {NS} is not entitled to vGPU (label "
        f"{ENTITLED}=true)",
    )
    at_order = orders.order_refusals(new, VGPU, namespace(False), [], [], None)
    assert at_order == [f"spec.className: {refusal.message}"]


def test_the_entitlement_is_judged_before_the_budgets() -> None:
    new = claim("t", "l40s", 3)
    refusal = orders.binding_refusal(new, VGPU, None, [QUOTA], [new])
    assert refusal is not None
    assert refusal.reason is orders.RefusalReason.NOT_ENTITLED


def test_budgets_are_rechecked_at_binding() -> None:
    new = claim("new", "a10", 1)
    held = claim("held", "a10", 2, phase="Bound")
    refusal = orders.binding_refusal(new, A10, namespace(False), [QUOTA], [held, new])
    assert refusal is not None
    assert refusal.reason is orders.RefusalReason.BUDGET_EXCEEDED
    assert refusal.message == "; ".join(orders.order_refusals_for_binding(new, [QUOTA], [held]))


def test_an_entitled_claim_within_budget_may_be_bound() -> None:
    new = claim("t", "l40s", 1)
    assert orders.binding_refusal(new, VGPU, namespace(True), [QUOTA], [new]) is None


def test_the_max_count_message_is_one_for_every_caller() -> None:
    assert orders.max_count_refusal(A10, 2) is None
    message = orders.max_count_refusal(A10, 3)
    assert message == "class a10 allows at most 2 GPUs per claim, 3 were ordered"
    refused = orders.order_refusals(claim("new", "a10", 3), A10, namespace(False), [], [], None)
    assert refused == [f"spec.count: {message}"]
    assert orders.max_count_refusal(gpuclass("free", "passthrough"), 10**6) is None
