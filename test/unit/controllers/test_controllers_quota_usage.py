"""The quota-usage controller on in-memory caches and a writer double: it merge-patches the
status subresource with exactly the budget keys that differ, and nothing when the status
already says the usage."""

from __future__ import annotations

from typing import Any

import pykube
from prometheus_client import CollectorRegistry

from controllers import quota_usage as quotamod
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Kind
from harness.offline import offline_caches

Obj = dict[str, Any]
A10 = "a10.gpuclass.cozystack.io/devices"
TOTAL = "gpuclass.cozystack.io/devices"


class Writer:
    def __init__(self, *, gone: bool = False) -> None:
        self.patches: list[tuple[Any, str, Obj, str | None, str | None]] = []
        self.gone = gone

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> Obj:
        self.patches.append((kind, name, patch, namespace, subresource))
        if self.gone:
            raise errors.NotFoundError(404, "NotFound", "gone")
        return {}


def world(writer: Writer, used: dict[str, str] | None = None) -> quotamod.QuotaUsage:
    caches = offline_caches()
    rq: Obj = {
        "metadata": {"name": "gpus", "namespace": "t"},
        "spec": {"hard": {A10: "4", TOTAL: "8", "pods": "10"}},
        "status": {
            "hard": {A10: "4", TOTAL: "8", "pods": "10"},
            "used": {"pods": "2", **(used or {})},
        },
    }
    caches.quotas.store.put(rq)
    for name, cls, count in (("a", "a10", 2), ("b", "l40s", 3)):
        caches.claims.store.put(
            {
                "metadata": {"name": name, "namespace": "t"},
                "spec": {"className": cls, "count": count},
            }
        )
    return quotamod.QuotaUsage(caches, writer, registry=CollectorRegistry())


def test_only_the_budget_keys_that_differ_are_patched_into_status() -> None:
    writer = Writer()
    world(writer, {A10: "2"}).reconcile(("t", "gpus"))
    assert writer.patches == [
        (pykube.ResourceQuota, "gpus", {"status": {"used": {TOTAL: "5"}}}, "t", "status")
    ]


def test_a_status_that_says_the_usage_is_left_alone() -> None:
    writer = Writer()
    world(writer, {A10: "2", TOTAL: "5"}).reconcile(("t", "gpus"))
    assert writer.patches == []


def test_a_quota_deleted_meanwhile_is_no_error() -> None:
    writer = Writer(gone=True)
    assert world(writer).reconcile(("t", "gpus")) is None
    assert len(writer.patches) == 1
    assert world(Writer()).reconcile(("t", "other")) is None
