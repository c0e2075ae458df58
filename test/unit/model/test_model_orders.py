"""An order is refused exactly as docs/design.md §5 "Ordering a claim" says (unknown class,
count above maxCount, count above maxFreePerNode, a budget, missing vGPU entitlement), in that
order and with messages naming the field, the value and what is allowed; budgets (§3) charge
every claim that exists, one being deleted until it is gone, each quota must hold, and the
binder's re-check only judges budgets, the older of two racing orders winning."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuoperator.model import capacity, orders, quantities

Obj = dict[str, Any]
NS = "tenant-a"
A10_RES = "nvidia.com/GA102GL_A10"
L40S_RES = "nvidia.com/L40S-24Q"
A10_KEY = "a10.gpuclass.cozystack.io/devices"
L40S_KEY = "l40s-24q.gpuclass.cozystack.io/devices"
TOTAL = "gpuclass.cozystack.io/devices"
ENTITLED = "gpu.cozystack.io/vgpu-entitled"


def gpuclass(name: str, mode: str, resource: str, max_count: int | None = None) -> Obj:
    spec: Obj = {
        "vendor": "nvidia",
        "model": name,
        "mode": mode,
        "source": {"devicePlugin": {"resourceName": resource}},
    }
    if max_count is not None:
        spec["maxCount"] = max_count
    return {"metadata": {"name": name}, "spec": spec}


A10 = gpuclass("a10", "passthrough", A10_RES)
A10_MAX4 = gpuclass("a10", "passthrough", A10_RES, max_count=4)
L40S = gpuclass("l40s-24q", "vgpu", L40S_RES)
L40S_MAX2 = gpuclass("l40s-24q", "vgpu", L40S_RES, max_count=2)


def claim(
    name: str = "new",
    class_name: str = "a10",
    count: int = 1,
    *,
    namespace: str = NS,
    deleting: bool = False,
    template: bool = False,
    phase: str | None = None,
    created: str | None = "2024-05-01T10:00:00Z",
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if created is not None:
        meta["creationTimestamp"] = created
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T11:00:00Z"
    if template:
        meta["labels"] = {"gpu.cozystack.io/template-claim": "true"}
    obj: Obj = {"metadata": meta, "spec": {"className": class_name, "count": count}}
    if phase is not None:
        # A Bound claim holds its units on a node (``claims.is_bound``).
        obj["status"] = {"phase": phase, **({"nodeName": "n1"} if phase == "Bound" else {})}
    return obj


def rq(name: str, hard: dict[str, Any], namespace: str = NS) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}


def namespace(entitled: bool = False, name: str = NS) -> Obj:
    labels = {ENTITLED: "true"} if entitled else {}
    return {"metadata": {"name": name, "labels": labels}}


def figures(max_free: int) -> capacity.ClassFigures:
    return capacity.ClassFigures(free=max_free * 2, max_free_per_node=max_free, nodes=2)


# -- reading claims ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(claim(template=True), True, id="marked"),
        pytest.param(claim(), False, id="unmarked"),
        pytest.param(
            {"metadata": {"labels": {"gpu.cozystack.io/template-claim": "True"}}},
            False,
            id="wrong-case",
        ),
        pytest.param({"metadata": {"labels": None}}, False, id="null-labels"),
        pytest.param({}, False, id="no-metadata"),
    ],
)
def test_is_template_claim(obj: Obj, expected: bool) -> None:
    assert orders.is_template_claim(obj) is expected


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(claim(), id="held"),
        pytest.param(claim(template=True), id="template"),
        pytest.param(claim(phase="Bound"), id="bound"),
        pytest.param(claim(phase="Pending"), id="pending"),
        pytest.param(claim(deleting=True), id="deleting"),
        pytest.param(claim(phase="Bound", deleting=True), id="bound-deleting"),
        pytest.param(claim(template=True, deleting=True), id="template-deleting"),
    ],
)
def test_every_claim_that_exists_is_charged_its_count(obj: Obj) -> None:
    assert orders.usage([obj]) == obj["spec"]["count"]


def test_usage_sums_every_existing_claim_per_class_and_in_total() -> None:
    claims = [
        claim("a", "a10", 2),
        claim("b", "a10", 3, template=True),
        claim("c", "l40s-24q", 1, phase="Bound"),
        claim("d", "a10", 8, deleting=True),
    ]
    assert orders.usage(claims) == 2 + 3 + 1 + 8
    assert orders.usage(claims, "a10") == 2 + 3 + 8
    assert orders.usage(claims, class_name="l40s-24q") == 1
    assert orders.usage(claims, "h100") == 0
    assert orders.usage([]) == 0


def test_creation_order_is_time_then_namespace_then_name() -> None:
    claims = [
        claim("z", created="2024-05-01T10:00:01Z"),
        claim("b", namespace="tenant-b", created="2024-05-01T10:00:00Z"),
        claim("a", namespace="tenant-b", created="2024-05-01T10:00:00Z"),
        claim("y", created="2024-05-01T10:00:00Z"),
        claim("unknown", created=None),
    ]
    ordered = sorted(claims, key=orders.creation_order)
    names = [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in ordered]
    assert names == [
        (NS, "y"),
        ("tenant-b", "a"),
        ("tenant-b", "b"),
        (NS, "z"),
        (NS, "unknown"),
    ]


# -- budget quantities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        pytest.param("4", 4, id="string"),
        pytest.param(4, 4, id="int"),
        pytest.param("10", 10, id="ten"),
        pytest.param("1k", 1000, id="kilo"),
        pytest.param("2Ki", 2048, id="kibi"),
        pytest.param("1e2", 100, id="exponent"),
        pytest.param("2000m", 2, id="milli-whole"),
        pytest.param("0", 0, id="zero"),
        pytest.param(0, 0, id="int-zero"),
        pytest.param("0.0", 0, id="zero-decimal"),
        pytest.param("0k", 0, id="zero-suffix"),
        pytest.param("1.5", None, id="fraction"),
        pytest.param("500m", None, id="milli-fraction"),
        pytest.param("-1", None, id="negative"),
        pytest.param("four", None, id="garbage"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="null"),
        pytest.param(True, None, id="bool"),
        pytest.param(1.5, None, id="float"),
    ],
)
def test_parse_budget(quantity: Any, expected: int | None) -> None:
    assert quantities.parse_whole(quantity) == expected


# -- budgets ---------------------------------------------------------------------------------

BUDGET_CASES = [
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=2)],
        [],
        id="class-within",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=3)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
        ],
        id="class-exceeded",
    ),
    pytest.param(
        claim(count=1),
        [rq("gpus", {A10_KEY: "1"})],
        [claim("h1", count=1)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 1 of "
            "a10.gpuclass.cozystack.io/devices, 1 is held, 1 was ordered"
        ],
        id="singular",
    ),
    pytest.param(
        claim(count=4),
        [rq("gpus", {A10_KEY: "4"})],
        [],
        [],
        id="exactly-the-limit",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {L40S_KEY: "0"})],
        [claim("h1", "l40s-24q", 1)],
        [],
        id="other-class-key-ignored",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", "l40s-24q", 5)],
        [],
        id="other-class-usage-ignored-by-class-key",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {TOTAL: "4"})],
        [claim("h1", "a10", 2), claim("h2", "l40s-24q", 1)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
        ],
        id="total-counts-every-class",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {TOTAL: "5", A10_KEY: "3"})],
        [claim("h1", "a10", 2), claim("h2", "l40s-24q", 2)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 3 of "
            "a10.gpuclass.cozystack.io/devices, 2 are held, 2 were ordered",
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 5 of "
            "gpuclass.cozystack.io/devices, 4 are held, 2 were ordered",
        ],
        id="class-and-total-both-exceeded",
    ),
    pytest.param(
        claim(count=2),
        [rq("wide", {TOTAL: "10"}), rq("narrow", {A10_KEY: "2"})],
        [claim("h1", "a10", 1)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/narrow allows 2 of "
            "a10.gpuclass.cozystack.io/devices, 1 is held, 2 were ordered"
        ],
        id="several-quotas-each-must-hold",
    ),
    pytest.param(
        claim(count=2),
        [rq("b", {TOTAL: "1"}), rq("a", {TOTAL: "2"})],
        [claim("h1", "a10", 1)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/a allows 2 of "
            "gpuclass.cozystack.io/devices, 1 is held, 2 were ordered",
            "spec.count: budget exceeded: ResourceQuota tenant-a/b allows 1 of "
            "gpuclass.cozystack.io/devices, 1 is held, 2 were ordered",
        ],
        id="several-quotas-sorted-by-name",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=3, deleting=True)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 3 are held (3 by claims being deleted, "
            "charged until they are gone), 2 were ordered"
        ],
        id="deleting-charged-until-gone",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=1, deleting=True), claim("h2", count=1, phase="Bound")],
        [],
        id="deleting-charged-within-budget",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=3, template=True)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
        ],
        id="template-charged",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=3, phase="Pending")],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
        ],
        id="pending-charged",
    ),
    pytest.param(
        claim("new", count=4),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("new", count=4, phase="Bound")],
        [],
        id="itself-not-counted-twice",
    ),
    pytest.param(
        claim("new", count=4),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("new", count=4, namespace="tenant-b")],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 4 are held, 4 were ordered"
        ],
        id="same-name-other-namespace-is-another-claim",
    ),
    pytest.param(
        {"metadata": {"namespace": NS}, "spec": {"className": "a10", "count": 1}},
        [rq("gpus", {A10_KEY: "1"})],
        [claim("h1", count=1)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 1 of "
            "a10.gpuclass.cozystack.io/devices, 1 is held, 1 was ordered"
        ],
        id="generate-name-excludes-nothing",
    ),
    pytest.param(
        claim(count=2),
        [rq("gpus", {A10_KEY: "1k"})],
        [claim("h1", count=500)],
        [],
        id="kilo-quantity",
    ),
    pytest.param(
        claim(count=1),
        [rq("gpus", {A10_KEY: "0"})],
        [],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 0 of "
            "a10.gpuclass.cozystack.io/devices, 0 are held, 1 was ordered"
        ],
        id="zero-budget",
    ),
    pytest.param(
        claim(count=1),
        [rq("gpus", {A10_KEY: "1.5"})],
        [],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus has an invalid value "
            "'1.5' for "
            "a10.gpuclass.cozystack.io/devices (a whole number of GPUs is allowed), so it "
            "allows 0; 0 are held, 1 was ordered"
        ],
        id="fraction-is-invalid",
    ),
    pytest.param(
        claim(count=1),
        [rq("gpus", {TOTAL: "lots"})],
        [claim("h1", count=2)],
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus has an invalid value "
            "'lots' for "
            "gpuclass.cozystack.io/devices (a whole number of GPUs is allowed), so it "
            "allows 0; 2 are held, 1 was ordered"
        ],
        id="garbage-is-invalid",
    ),
    pytest.param(
        claim(count=8),
        [
            rq(
                "compute",
                {
                    "cpu": "1",
                    "requests.nvidia.com/GA102GL_A10": "0",
                    "limits.a10.gpuclass.cozystack.io/devices": "0",
                    "requests.gpuclass.cozystack.io/devices": "0",
                },
            )
        ],
        [],
        [],
        id="other-keys-ignored",
    ),
    pytest.param(
        claim(count=8),
        [{"metadata": {"name": "empty", "namespace": NS}, "spec": {}}],
        [],
        [],
        id="quota-without-hard",
    ),
    pytest.param(claim(count=8), [], [claim("h1", count=100)], [], id="no-quota"),
]


@pytest.mark.parametrize(("new", "quotas", "others", "expected"), BUDGET_CASES)
def test_budget_refusals(
    new: Obj, quotas: list[Obj], others: list[Obj], expected: list[str]
) -> None:
    assert orders.budget_refusals(new, quotas, others) == expected


# -- the order -------------------------------------------------------------------------------

OrderCase = tuple[
    Obj, Obj | None, Obj | None, list[Obj], list[Obj], capacity.ClassFigures | None, list[str]
]
ORDER_CASES = [
    pytest.param(claim(count=2), A10, namespace(), [], [], figures(4), [], id="acceptable"),
    pytest.param(
        claim(count=64), A10, namespace(), [], [], figures(64), [], id="passthrough-unlimited"
    ),
    pytest.param(
        claim(count=2), A10, namespace(), [], [], None, [], id="figures-unknown-skip-max-free"
    ),
    pytest.param(
        claim("v", "l40s-24q", 1),
        L40S,
        namespace(entitled=True),
        [],
        [],
        figures(3),
        [],
        id="vgpu-entitled",
    ),
    pytest.param(
        claim(class_name="a10x"),
        None,
        namespace(),
        [],
        [],
        None,
        [
            "spec.className: class a10x does not exist; "
            "the classes are listed by kubectl get gpuclasses"
        ],
        id="class-missing",
    ),
    pytest.param(
        claim(count=5),
        A10_MAX4,
        namespace(),
        [],
        [],
        figures(8),
        ["spec.count: class a10 allows at most 4 GPUs per claim, 5 were ordered"],
        id="count-above-max-count",
    ),
    pytest.param(
        claim(count=4),
        A10_MAX4,
        namespace(),
        [],
        [],
        figures(8),
        [],
        id="count-at-max-count",
    ),
    pytest.param(
        claim("v", "l40s-24q", 2),
        L40S,
        namespace(entitled=True),
        [],
        [],
        figures(4),
        ["spec.count: class l40s-24q allows at most 1 GPU per claim, 2 were ordered"],
        id="vgpu-default-max-count-1",
    ),
    pytest.param(
        claim("v", "l40s-24q", 2),
        L40S_MAX2,
        namespace(entitled=True),
        [],
        [],
        figures(4),
        [],
        id="vgpu-explicit-max-count",
    ),
    pytest.param(
        claim(count=4),
        A10,
        namespace(),
        [],
        [],
        figures(2),
        ["spec.count: class a10 has at most 2 free GPUs on one node, 4 were ordered"],
        id="count-above-max-free",
    ),
    pytest.param(
        claim(count=1),
        A10,
        namespace(),
        [],
        [],
        figures(0),
        ["spec.count: class a10 has no free GPU on any node, 1 was ordered"],
        id="no-free-anywhere",
    ),
    pytest.param(
        claim(count=2),
        A10,
        namespace(),
        [],
        [],
        figures(1),
        ["spec.count: class a10 has at most 1 free GPU on one node, 2 were ordered"],
        id="max-free-singular",
    ),
    pytest.param(
        claim(count=2),
        A10,
        namespace(),
        [rq("gpus", {A10_KEY: "4"})],
        [claim("h1", count=3)],
        figures(8),
        [
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
            "a10.gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
        ],
        id="budget",
    ),
    pytest.param(
        claim("v", "l40s-24q", 1),
        L40S,
        namespace(),
        [],
        [],
        figures(4),
        [
            "spec.className: class l40s-24q is a vGPU class; namespace tenant-a is not "
            "entitled to vGPU (label gpu.cozystack.io/vgpu-entitled=true)"
        ],
        id="vgpu-not-entitled",
    ),
    pytest.param(
        claim("v", "l40s-24q", 1, namespace="tenant-z"),
        L40S,
        None,
        [],
        [],
        figures(4),
        [
            "spec.className: class l40s-24q is a vGPU class; namespace tenant-z is not "
            "entitled to vGPU (label gpu.cozystack.io/vgpu-entitled=true)"
        ],
        id="vgpu-namespace-unknown",
    ),
    pytest.param(
        claim("v", "l40s-24q", 3),
        L40S,
        namespace(),
        [rq("gpus", {TOTAL: "2"})],
        [],
        figures(2),
        [
            "spec.count: class l40s-24q allows at most 1 GPU per claim, 3 were ordered",
            "spec.count: class l40s-24q has at most 2 free GPUs on one node, 3 were ordered",
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 2 of "
            "gpuclass.cozystack.io/devices, 0 are held, 3 were ordered",
            "spec.className: class l40s-24q is a vGPU class; namespace tenant-a is not "
            "entitled to vGPU (label gpu.cozystack.io/vgpu-entitled=true)",
        ],
        id="every-refusal-in-order",
    ),
    pytest.param(
        claim(class_name="gone", count=3),
        None,
        namespace(),
        [rq("gpus", {TOTAL: "2"})],
        [],
        None,
        [
            "spec.className: class gone does not exist; "
            "the classes are listed by kubectl get gpuclasses",
            "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 2 of "
            "gpuclass.cozystack.io/devices, 0 are held, 3 were ordered",
        ],
        id="missing-class-and-budget",
    ),
]


@pytest.mark.parametrize(("new", "cls", "ns", "quotas", "others", "figs", "expected"), ORDER_CASES)
def test_order_refusals(
    new: Obj,
    cls: Obj | None,
    ns: Obj | None,
    quotas: list[Obj],
    others: list[Obj],
    figs: capacity.ClassFigures | None,
    expected: list[str],
) -> None:
    assert orders.order_refusals(new, cls, ns, quotas, others, figs) == expected


@pytest.mark.parametrize(
    ("known", "suffix"),
    [
        pytest.param(["l40s-24q", "a10"], " (known: a10, l40s-24q)", id="listed-sorted"),
        pytest.param([], " (no class exists yet)", id="none"),
        pytest.param(
            [f"c{i:02d}" for i in range(25)],
            " (known: " + ", ".join(f"c{i:02d}" for i in range(20)) + " and 5 more)",
            id="capped",
        ),
    ],
)
def test_missing_class_lists_known_classes(known: list[str], suffix: str) -> None:
    refusals = orders.order_refusals(
        claim(class_name="a10x"), None, namespace(), [], [], None, known
    )
    assert refusals == [
        f"spec.className: class a10x does not exist{suffix}; "
        "the classes are listed by kubectl get gpuclasses"
    ]


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        pytest.param(
            "class-missing", ["spec.className", "a10x", "kubectl get gpuclasses"], id="cls"
        ),
        pytest.param("count-above-max-count", ["spec.count", "at most 4", "5 were"], id="max"),
        pytest.param("count-above-max-free", ["spec.count", "at most 2 free", "4 were"], id="free"),
        pytest.param("budget", ["tenant-a/gpus", A10_KEY, "allows 4", "3 are held"], id="budget"),
        pytest.param(
            "vgpu-not-entitled", ["spec.className", "l40s-24q", ENTITLED + "=true"], id="vgpu"
        ),
    ],
)
def test_every_message_names_field_value_and_allowance(case: str, needles: list[str]) -> None:
    (params,) = [p for p in ORDER_CASES if p.id == case]
    new, cls, ns, quotas, others, figs, _ = cast(OrderCase, params.values)
    (message,) = orders.order_refusals(new, cls, ns, quotas, others, figs)
    for needle in needles:
        assert needle in message


def test_order_refusals_do_not_look_at_the_template_mark() -> None:
    """The caller skips template claims; the rule itself judges any claim alike."""
    marked = claim(count=4, template=True)
    assert orders.order_refusals(marked, A10, namespace(), [], [], figures(2)) == [
        "spec.count: class a10 has at most 2 free GPUs on one node, 4 were ordered"
    ]


# -- the binder's re-check -------------------------------------------------------------------

OLDER = "2024-05-01T10:00:00Z"
YOUNGER = "2024-05-01T10:00:05Z"


@pytest.mark.parametrize(
    ("target", "namespace_claims", "quotas", "expected"),
    [
        pytest.param(
            claim("a", count=4, phase="Pending", created=OLDER),
            [
                claim("a", count=4, phase="Pending", created=OLDER),
                claim("b", count=4, phase="Pending", created=YOUNGER),
            ],
            [rq("gpus", {A10_KEY: "4"})],
            [],
            id="racing-older-wins",
        ),
        pytest.param(
            claim("b", count=4, phase="Pending", created=YOUNGER),
            [
                claim("a", count=4, phase="Pending", created=OLDER),
                claim("b", count=4, phase="Pending", created=YOUNGER),
            ],
            [rq("gpus", {A10_KEY: "4"})],
            [
                "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
                "a10.gpuclass.cozystack.io/devices, 4 are held, 4 were ordered"
            ],
            id="racing-younger-waits",
        ),
        pytest.param(
            claim("b", count=4, phase="Pending", created=OLDER),
            [
                claim("a", count=4, phase="Pending", created=OLDER),
                claim("b", count=4, phase="Pending", created=OLDER),
            ],
            [rq("gpus", {A10_KEY: "4"})],
            [
                "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
                "a10.gpuclass.cozystack.io/devices, 4 are held, 4 were ordered"
            ],
            id="same-second-name-decides",
        ),
        pytest.param(
            claim("a", count=4, phase="Pending", created=OLDER),
            [claim("b", count=4, phase="Bound", created=YOUNGER)],
            [rq("gpus", {TOTAL: "4"})],
            [
                "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
                "gpuclass.cozystack.io/devices, 4 are held, 4 were ordered"
            ],
            id="bound-claims-always-count",
        ),
        pytest.param(
            claim("a", count=4, phase="Pending", created=YOUNGER),
            [claim("b", count=4, phase="Bound", created=OLDER, deleting=True)],
            [rq("gpus", {TOTAL: "4"})],
            [
                "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
                "gpuclass.cozystack.io/devices, 4 are held (4 by claims being deleted, "
                "charged until they are gone), 4 were ordered"
            ],
            id="deleting-charged-until-gone",
        ),
        pytest.param(
            claim("t", count=2, phase="Pending", created=YOUNGER, template=True),
            [claim("h", count=3, phase="Pending", created=OLDER)],
            [rq("gpus", {A10_KEY: "4"})],
            [
                "spec.count: budget exceeded: ResourceQuota tenant-a/gpus allows 4 of "
                "a10.gpuclass.cozystack.io/devices, 3 are held, 2 were ordered"
            ],
            id="template-rechecked",
        ),
        pytest.param(
            claim("v", "l40s-24q", 3, phase="Pending"),
            [],
            [],
            [],
            id="only-budgets-not-max-count-or-entitlement",
        ),
    ],
)
def test_order_refusals_for_binding(
    target: Obj, namespace_claims: list[Obj], quotas: list[Obj], expected: list[str]
) -> None:
    assert orders.order_refusals_for_binding(target, quotas, namespace_claims) == expected


def test_an_order_is_admitted_up_to_what_it_may_take_back_and_refused_above_it() -> None:
    room = capacity.ClassFigures(
        free=0, max_free_per_node=0, nodes=1, reclaimable=3, max_reclaimable_per_node=3
    )
    assert orders.order_refusals(claim(count=3), A10, namespace(), [], [], room) == []
    assert orders.order_refusals(claim(count=4), A10, namespace(), [], [], room) == [
        "spec.count: class a10 has no free GPU on any node (3 GPUs counting the idle "
        "preemptible holds it may take back), 4 were ordered"
    ]
