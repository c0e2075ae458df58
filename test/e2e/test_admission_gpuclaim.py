"""GPUClaim admission on the real API server: spec rules, immutability, status, and the
``status.nodeName`` field selector."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykube
import pytest

from gpuoperator.kinds import GPUClaim
from harness.kube import Obj, refused, replace
from localcluster.cluster import kubectl

MakeClaim = Callable[..., GPUClaim]


def claim(name: str, namespace: str, class_name: str = "a10", count: int = 1) -> Obj:
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": class_name, "count": count},
    }


@pytest.fixture
def make_claim(api: pykube.HTTPClient, namespace: str) -> MakeClaim:
    def create(name: str = "hold", **spec: Any) -> GPUClaim:
        obj = claim(name, namespace)
        for key, value in spec.items():
            if value is None:
                obj["spec"].pop(key, None)
            else:
                obj["spec"][key] = value
        c = GPUClaim(api, obj)
        c.create()
        return c

    return create


def test_a_valid_claim_is_accepted(make_claim: MakeClaim) -> None:
    c = make_claim(count=2)
    assert c.obj["spec"] == {"className": "a10", "count": 2}


REFUSED: list[tuple[str, Obj, tuple[str, ...]]] = [
    ("class-missing", {"className": None}, ("spec.className", "Required")),
    ("class-uppercase", {"className": "A10"}, ("spec.className", "DNS label")),
    ("class-dotted", {"className": "a10.big"}, ("spec.className", "DNS label")),
    ("class-too-long", {"className": "c" * 64}, ("spec.className", "63")),
    ("count-missing", {"count": None}, ("spec.count", "Required")),
    ("count-zero", {"count": 0}, ("spec.count", "greater than or equal to 1")),
    ("count-negative", {"count": -2}, ("spec.count", "greater than or equal to 1")),
    ("count-not-integer", {"count": "two"}, ("spec.count", "integer")),
]


@pytest.mark.parametrize(
    ("changes", "fragments"), [(c, f) for _, c, f in REFUSED], ids=[i for i, _, _ in REFUSED]
)
def test_invalid_claim_is_refused_naming_the_field(
    make_claim: MakeClaim, changes: Obj, fragments: tuple[str, ...]
) -> None:
    with refused() as r:
        make_claim(**changes)
    for fragment in fragments:
        assert fragment in r[0].message, f"{fragment!r} not in refusal: {r[0].message}"


def test_a_claim_without_spec_is_refused(api: pykube.HTTPClient, namespace: str) -> None:
    obj = claim("nospec", namespace)
    del obj["spec"]
    with refused() as r:
        GPUClaim(api, obj).create()
    assert "spec" in r[0].message and "Required" in r[0].message


@pytest.mark.parametrize(
    "changes", [{"count": 3}, {"className": "l40s-24q"}], ids=["count", "className"]
)
def test_the_spec_is_immutable(make_claim: MakeClaim, changes: Obj) -> None:
    c = make_claim(count=2)
    c.obj["spec"].update(changes)
    with refused() as r:
        replace(c)
    assert "spec is immutable" in r[0].message and "new claim" in r[0].message, r[0].message
    c.reload()
    assert c.obj["spec"] == {"className": "a10", "count": 2}


def test_metadata_stays_mutable(make_claim: MakeClaim) -> None:
    c = make_claim()
    c.obj["metadata"].setdefault("labels", {})["team"] = "ml"
    replace(c)
    c.reload()
    assert c.obj["metadata"]["labels"]["team"] == "ml"


def test_status_sent_on_create_is_dropped(api: pykube.HTTPClient, namespace: str) -> None:
    obj = claim("with-status", namespace)
    obj["status"] = {"phase": "Bound", "nodeName": "a10-0"}
    c = GPUClaim(api, obj)
    c.create()
    c.reload()
    assert "nodeName" not in c.obj.get("status", {})


def bind(c: GPUClaim, node: str, **extra: Any) -> None:
    c.obj["status"] = {"phase": "Bound", "nodeName": node, **extra}
    replace(c, subresource="status")


def test_a_status_update_leaves_spec_untouched(make_claim: MakeClaim) -> None:
    c = make_claim(count=2)
    c.obj["spec"]["count"] = 5  # ignored by the status subresource, so no immutability refusal
    bind(c, "a10-0", boundTime="2026-01-01T00:00:00Z", attachment={"vmi": "vm-1", "uid": "u-1"})
    c.reload()
    assert c.obj["spec"]["count"] == 2
    assert c.obj["status"]["nodeName"] == "a10-0"
    assert c.obj["status"]["attachment"] == {"vmi": "vm-1", "uid": "u-1"}


@pytest.mark.parametrize(
    ("status", "fragments"),
    [
        ({"phase": "Running"}, ("status.phase", "Pending", "Bound", "Lost")),
        (
            {
                "refusedNodes": [
                    {"nodeName": f"n{i}", "until": "2026-01-01T00:00:00Z"} for i in range(17)
                ]
            },
            ("status.refusedNodes", "16"),
        ),
        ({"refusedNodes": [{"nodeName": "n0"}]}, ("status.refusedNodes[0].until", "Required")),
        (
            {"refusedNodes": [{"nodeName": "n0", "until": "2026-01-01T00:00:00Z"}] * 2},
            ("status.refusedNodes[1]", "Duplicate"),
        ),
        ({"nodeName": "n" * 254}, ("status.nodeName", "253")),
    ],
    ids=["phase", "refused-17", "refused-no-until", "refused-duplicate", "node-too-long"],
)
def test_invalid_status_is_refused(
    make_claim: MakeClaim, status: Obj, fragments: tuple[str, ...]
) -> None:
    c = make_claim()
    c.obj["status"] = status
    with refused() as r:
        replace(c, subresource="status")
    for fragment in fragments:
        assert fragment in r[0].message, f"{fragment!r} not in refusal: {r[0].message}"


def test_bound_claims_are_listable_per_node_with_a_field_selector(
    make_claim: MakeClaim, api: pykube.HTTPClient, namespace: str, kubeconfig: Path
) -> None:
    on_a = [make_claim(f"a{i}") for i in range(2)]
    on_b = make_claim("b0")
    pending = make_claim("p0")
    for c in on_a:
        bind(c, "a10-0")
    bind(on_b, "a10-1")

    out = kubectl(
        kubeconfig,
        "get",
        "gpuclaims",
        "-n",
        namespace,
        "--field-selector",
        "status.nodeName=a10-0",
        "-o",
        "json",
    )
    assert sorted(i["metadata"]["name"] for i in json.loads(out)["items"]) == ["a0", "a1"]
    via_api = GPUClaim.objects(api, namespace=namespace).filter(
        field_selector={"status.nodeName": "a10-1"}
    )
    assert [c.name for c in via_api] == ["b0"]
    unbound = GPUClaim.objects(api, namespace=namespace).filter(
        field_selector={"status.nodeName": ""}
    )
    assert [c.name for c in unbound] == [pending.name]


def test_the_claim_is_listed_with_its_printer_columns_short_name_and_category(
    make_claim: MakeClaim, namespace: str, kubeconfig: Path
) -> None:
    c = make_claim(count=3)
    bind(c, "a10-0", attachment={"vmi": "vm-1"})
    for resource in ("gpuclaims", "gpuc"):
        out = kubectl(kubeconfig, "get", resource, "-n", namespace)
        lines = out.splitlines()
        assert lines[0].split()[:7] == ["NAME", "CLASS", "COUNT", "PHASE", "NODE", "VM", "AGE"], out
        assert lines[1].split()[:6] == ["hold", "a10", "3", "Bound", "a10-0", "vm-1"], out
    in_category = kubectl(kubeconfig, "get", "gpu", "-n", namespace, "-o", "name").split()
    assert "gpuclaim.cozystack.io/hold" in in_category
