"""The P3 floor benchmark's pure parts: the null webhook's registration is ours but for
its name, URL, CA and selector; the three setups select disjoint namespaces; the rounds
turn the setups' order."""

from __future__ import annotations

import base64
import math
from typing import Any

from bench import webhook_floor as wf

OURS: dict[str, Any] = {
    "name": "orders.gpu.cozystack.io",
    "admissionReviewVersions": ["v1"],
    "sideEffects": "None",
    "failurePolicy": "Fail",
    "timeoutSeconds": 10,
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "clientConfig": {"url": "https://127.0.0.1:9443/validate-gpuclaim", "caBundle": "b3Vycw=="},
    "rules": [
        {
            "apiGroups": ["cozystack.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE"],
            "resources": ["gpuclaims"],
            "scope": "Namespaced",
        }
    ],
}


def test_the_null_webhook_is_called_as_ours_is() -> None:
    config = wf.null_configuration(OURS, "https://127.0.0.1:1234/x", b"CA PEM")
    (hook,) = config["webhooks"]
    for field in (
        "admissionReviewVersions",
        "sideEffects",
        "failurePolicy",
        "timeoutSeconds",
        "matchPolicy",
        "rules",
        "objectSelector",
    ):
        assert hook[field] == OURS[field], field
    assert hook["name"] != OURS["name"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:1234/x",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert config["kind"] == "ValidatingWebhookConfiguration"
    # a copy: changing it leaves ours alone
    hook["rules"][0]["operations"].append("UPDATE")
    assert OURS["rules"][0]["operations"] == ["CREATE"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A namespaceSelector's matchExpressions (In / NotIn), evaluated as the API server
    does, written out here rather than taken from the module under test."""
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
    return True


def test_each_setup_namespace_meets_only_its_own_webhook() -> None:
    ours, null = wf.selector_for("ours"), wf.null_configuration(OURS, "u", b"c")["webhooks"][0]
    for setup in wf.SETUPS:
        labels = {wf.LABEL: setup}
        assert _selects(ours, labels) is (setup == "ours"), setup
        assert _selects(null["namespaceSelector"], labels) is (setup == "null"), setup
    # any other namespace (a tenant's, the other benchmarks') still meets our webhook only
    assert _selects(ours, {}) and not _selects(null["namespaceSelector"], {})


def test_rounds_turn_the_order_of_the_setups() -> None:
    orders = [wf.round_order(r) for r in range(3)]
    assert all(sorted(o) == sorted(wf.SETUPS) for o in orders)
    assert [o[0] for o in orders] == ["ours", "null", "none"]
    assert wf.round_order(3) == orders[0]


def test_measure_times_the_same_number_of_creates_in_each_setup() -> None:
    calls: list[tuple[str, str]] = []
    out = wf.measure(lambda ns, name: calls.append((ns, name)), 2, 3, lambda _m: None)
    assert {s: len(v) for s, v in out.items()} == {"ours": 6, "null": 6, "none": 6}
    assert len(set(calls)) == 18
    assert [ns for ns, _ in calls[:3]] == [wf.namespace("ours")] * 3
    assert [ns for ns, _ in calls[9:12]] == [wf.namespace("null")] * 3  # round 2 starts at null


def test_quantile_of_nothing_is_nan() -> None:
    q = wf.quantile([], 0.5)
    assert math.isnan(q)
    assert wf.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert wf.quantile([float(i) for i in range(100)], 0.99) == 99.0


BEFORE = """# HELP h x
h_bucket{server="webhooks",connection="kept-alive",le="0.001"} 10.0
h_bucket{server="webhooks",connection="kept-alive",le="0.01"} 12.0
h_bucket{server="webhooks",connection="kept-alive",le="+Inf"} 12.0
h_bucket{server="webhooks",connection="fresh",le="0.001"} 0.0
h_bucket{server="webhooks",connection="fresh",le="0.01"} 1.0
h_bucket{server="webhooks",connection="fresh",le="+Inf"} 1.0
h_count{server="webhooks",connection="kept-alive"} 12.0
"""
AFTER = """h_bucket{server="webhooks",connection="kept-alive",le="0.001"} 108.0
h_bucket{server="webhooks",connection="kept-alive",le="0.01"} 111.0
h_bucket{server="webhooks",connection="kept-alive",le="+Inf"} 112.0
h_bucket{server="webhooks",connection="fresh",le="0.001"} 0.0
h_bucket{server="webhooks",connection="fresh",le="0.01"} 3.0
h_bucket{server="webhooks",connection="fresh",le="+Inf"} 3.0
"""


def test_what_a_histogram_observed_between_two_scrapes() -> None:
    # kept-alive: 100 new, 98 within 1 ms, 99 within 10 ms, one beyond
    count, p50, p99 = wf.delta_quantiles(BEFORE, AFTER, "h", {"connection": "kept-alive"})
    assert (count, p50, p99) == (100.0, 0.001, 0.01)
    count, p50, p99 = wf.delta_quantiles(BEFORE, AFTER, "h", {"connection": "fresh"})
    assert (count, p50, p99) == (2.0, 0.01, 0.01)
    # both connections together
    assert wf.delta_quantiles(BEFORE, AFTER, "h", {})[0] == 102.0
    count, p50, _ = wf.delta_quantiles(AFTER, AFTER, "h", {})
    assert count == 0 and math.isnan(p50)
