"""What ResourceQuota ``status.used`` says for GPU budget keys: the budget usage of docs/design.md
§3, only for the budget keys in ``spec.hard``, and nothing rewritten that already says it."""

from __future__ import annotations

from typing import Any

from gpuoperator.model import quota_usage

TOTAL = "gpuclass.cozystack.io/devices"
A10 = "a10.gpuclass.cozystack.io/devices"
L40S = "l40s.gpuclass.cozystack.io/devices"


def claim(name: str, cls: str, count: int, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t", **meta},
        "spec": {"className": cls, "count": count},
    }


def rq(hard: dict[str, str], used: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"metadata": {"name": "q", "namespace": "t"}, "spec": {"hard": hard}}
    if used is not None:
        out["status"] = {"hard": hard, "used": used}
    return out


CLAIMS = [
    claim("a", "a10", 2),
    claim("b", "a10", 1, labels={"gpu.cozystack.io/template-claim": "true"}),
    claim("c", "l40s", 4),
]
LEAVING = claim("leaving", "a10", 8, deletionTimestamp="2026-01-01T00:00:00Z")


def test_each_budget_key_shows_the_charged_units_of_its_class_or_of_all() -> None:
    # a10: 2 + 1 (template claims are charged alike).
    hard = {A10: "4", L40S: "4", TOTAL: "10", "pods": "10", "requests.cpu": "4"}
    assert quota_usage.desired_used(rq(hard), CLAIMS) == {A10: "3", L40S: "4", TOTAL: "7"}


def test_a_claim_being_deleted_shows_as_used_until_it_is_gone() -> None:
    hard = {A10: "4", TOTAL: "10"}
    leaving = [*CLAIMS, LEAVING]
    assert quota_usage.desired_used(rq(hard), leaving) == {A10: "11", TOTAL: "15"}
    assert quota_usage.used_patch(rq(hard, {A10: "11", TOTAL: "15"}), CLAIMS) == {
        A10: "3",
        TOTAL: "7",
    }


def test_keys_kubernetes_computes_are_never_written() -> None:
    hard = {"pods": "10", "count/gpuclaims.cozystack.io": "5", A10: "4"}
    patch = quota_usage.used_patch(rq(hard, {"pods": "3"}), CLAIMS)
    assert patch == {A10: "3"}


def test_a_budget_key_that_is_not_in_spec_hard_is_not_written() -> None:
    assert quota_usage.used_patch(rq({TOTAL: "10"}), CLAIMS) == {TOTAL: "7"}


def test_a_status_that_already_says_the_usage_is_not_rewritten() -> None:
    hard = {A10: "4", TOTAL: "10"}
    assert quota_usage.used_patch(rq(hard, {A10: "3", TOTAL: 7}), CLAIMS) == {}


def test_only_the_keys_that_differ_are_patched() -> None:
    hard = {A10: "4", TOTAL: "10"}
    assert quota_usage.used_patch(rq(hard, {A10: "3", TOTAL: "6"}), CLAIMS) == {TOTAL: "7"}


def test_no_claim_shows_zero_used() -> None:
    assert quota_usage.used_patch(rq({A10: "4"}), []) == {A10: "0"}
    assert quota_usage.used_patch(rq({A10: "4"}, {A10: "0"}), []) == {}


def test_an_invalid_stored_value_is_corrected() -> None:
    assert quota_usage.used_patch(rq({A10: "4"}, {A10: "garbage"}), []) == {A10: "0"}


def test_keys_with_resourcequota_prefixes_are_not_budgets() -> None:
    hard = {"requests.a10.gpuclass.cozystack.io/devices": "1", "limits." + TOTAL: "1"}
    assert quota_usage.budget_keys(rq(hard)) == []
    assert quota_usage.used_patch(rq(hard), CLAIMS) == {}
