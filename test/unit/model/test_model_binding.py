"""Binding follows docs/design.md §5 "Binding": a waiting claim goes to an eligible node with
enough free units that has not refused it lately, chosen by binpack or spread with ties broken
by name; claims of a class wait FIFO with backfill (the oldest claim that fits nowhere
nominates the node it will fit on soonest, younger claims bind anywhere else, and it binds
once that node frees); one plan never places more on a node than it has free; refusedNodes
expire and keep at most 16 entries."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import binding, capacity
from gpuoperator.model import objects as model_objects
from harness import objects

Obj = dict[str, Any]
Key = tuple[str, str]
UTC = datetime.UTC
NOW = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
A10_RES = "nvidia.com/GA102GL_A10"
L40S_RES = "nvidia.com/L40S-24Q"
GPU_TAINT = {"key": "gpu.cozystack.io/dedicated", "value": "true", "effect": "NoSchedule"}
NS = "tenant-a"


def gpuclass(
    name: str = "a10",
    resource: str = A10_RES,
    mode: str = "passthrough",
    tolerations: list[Obj] | None = None,
) -> Obj:
    return objects.gpuclass(name, resource=resource, mode=mode, tolerations=tolerations)


A10 = gpuclass(tolerations=[{"key": "gpu.cozystack.io/dedicated", "operator": "Exists"}])
L40S = gpuclass("l40s-24q", L40S_RES, "vgpu")


def node(
    name: str,
    allocatable: dict[str, int],
    *,
    ready: bool = True,
    cordoned: bool = False,
    taints: list[Obj] | None = None,
) -> Obj:
    return objects.node(name, allocatable, ready=ready, cordoned=cordoned, taints=taints or None)


def stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def at(seconds: int) -> str:
    return stamp(NOW + datetime.timedelta(seconds=seconds))


def claim(
    name: str,
    count: int = 1,
    *,
    class_name: str = "a10",
    namespace: str = NS,
    created: int = 0,
    phase: str | None = "Pending",
    node_name: str | None = None,
    refused: list[Obj] | None = None,
    deleting: bool = False,
) -> Obj:
    obj = objects.claim(
        name,
        namespace=namespace,
        class_name=class_name,
        count=count,
        created=at(created),
        phase=phase,
        node=node_name,
        status={} if refused is None else {"refusedNodes": refused},
    )
    if deleting:
        obj["metadata"]["deletionTimestamp"] = at(created + 1)
    return obj


def ledger_of(nodes: list[Obj], bound: list[tuple[Obj, str]] | None = None) -> capacity.Ledger:
    ledger = capacity.Ledger()
    for n in nodes:
        ledger.set_node(n)
    for c, resource in bound or []:
        ledger.set_claim(c, resource)
    return ledger


def key(name: str, namespace: str = NS) -> Key:
    return (namespace, name)


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refused", "node_name", "expected"),
    [
        pytest.param([{"nodeName": "n1", "until": at(60)}], "n1", NOW.replace(minute=1), id="live"),
        pytest.param([{"nodeName": "n1", "until": at(-60)}], "n1", None, id="expired"),
        pytest.param([{"nodeName": "n1", "until": at(0)}], "n1", None, id="expires-now"),
        pytest.param([{"nodeName": "n1", "until": at(60)}], "n2", None, id="other-node"),
        pytest.param([{"nodeName": "n1", "until": "soon"}], "n1", None, id="unreadable"),
        pytest.param([{"nodeName": "n1"}], "n1", None, id="no-until"),
        pytest.param(
            [{"nodeName": "n1", "until": "2024-05-01T12:00:30.5+00:00"}],
            "n1",
            NOW + datetime.timedelta(seconds=30.5),
            id="fraction-and-offset",
        ),
        pytest.param(
            [{"nodeName": "n1", "until": at(-60)}, {"nodeName": "n1", "until": at(120)}],
            "n1",
            NOW.replace(minute=2),
            id="duplicate-latest-wins",
        ),
        pytest.param(None, "n1", None, id="no-refusals"),
        pytest.param(["n1", {"until": at(60)}], "n1", None, id="malformed-entries"),
    ],
)
def test_refused_until(
    refused: list[Any] | None, node_name: str, expected: datetime.datetime | None
) -> None:
    c = claim("c", refused=refused)
    assert binding.refused_until(c, node_name, NOW) == expected


def test_unexpired_refusals_ignores_expired_and_unreadable() -> None:
    c = claim(
        "c",
        refused=[
            {"nodeName": "n1", "until": at(60)},
            {"nodeName": "n2", "until": at(-1)},
            {"nodeName": "n3", "until": "never"},
            {"nodeName": "n4", "until": at(1)},
        ],
    )
    assert binding.unexpired_refusals(c, NOW) == {"n1", "n4"}
    assert binding.unexpired_refusals(c, NOW + datetime.timedelta(seconds=1)) == {"n1"}
    assert binding.unexpired_refusals(c, NOW + datetime.timedelta(hours=1)) == set()
    # A naive "now" is read as UTC.
    assert binding.unexpired_refusals(c, NOW.replace(tzinfo=None)) == {"n1", "n4"}
    assert binding.unexpired_refusals(claim("c", phase=None), NOW) == set()


def test_add_refusal_adds_and_replaces_one_entry_per_node() -> None:
    before = [{"nodeName": "n2", "until": at(60)}, {"nodeName": "n1", "until": at(30)}]
    kept = [dict(e) for e in before]
    after = binding.add_refusal(before, "n1", NOW + datetime.timedelta(minutes=10))
    assert after == [
        {"nodeName": "n1", "until": "2024-05-01T12:10:00Z"},
        {"nodeName": "n2", "until": at(60)},
    ]
    assert before == kept  # the input is not changed
    assert binding.add_refusal(None, "n9", NOW) == [{"nodeName": "n9", "until": at(0)}]


def test_add_refusal_with_now_drops_expired_and_unreadable() -> None:
    before = [
        {"nodeName": "old", "until": at(-5)},
        {"nodeName": "bad", "until": "tomorrow"},
        {"nodeName": "live", "until": at(5)},
    ]
    after = binding.add_refusal(before, "new", NOW + datetime.timedelta(minutes=10), now=NOW)
    assert [e["nodeName"] for e in after] == ["live", "new"]
    # Without now, expired entries stay below the cap; unreadable ones are always dropped
    # (there is no time to write back).
    after = binding.add_refusal(before, "new", NOW)
    assert [e["nodeName"] for e in after] == ["live", "new", "old"]


@pytest.mark.parametrize(
    ("existing", "dropped"),
    [
        pytest.param(
            [{"nodeName": f"n{i:02d}", "until": at(100 + i)} for i in range(16)],
            {"n00"},
            id="soonest-to-expire-dropped",
        ),
        pytest.param(
            [{"nodeName": f"n{i:02d}", "until": at(100 + i)} for i in range(15)]
            + [{"nodeName": "x-expired", "until": at(-100)}],
            {"x-expired"},
            id="expired-dropped-first",
        ),
        pytest.param(
            [{"nodeName": f"n{i:02d}", "until": at(-100 - i)} for i in range(15)]
            + [{"nodeName": "x-bad", "until": "?"}],
            {"x-bad"},
            id="unreadable-dropped-first",
        ),
        pytest.param(
            [{"nodeName": f"n{i:02d}", "until": at(100)} for i in range(16)],
            {"n00"},
            id="tie-by-name",
        ),
        pytest.param(
            [{"nodeName": f"n{i:02d}", "until": at(100 + i)} for i in range(20)],
            {"n00", "n01", "n02", "n03", "n04"},
            id="over-cap-input-trimmed",
        ),
    ],
)
def test_add_refusal_keeps_at_most_16(existing: list[Obj], dropped: set[str]) -> None:
    after = binding.add_refusal(existing, "new", NOW + datetime.timedelta(hours=1))
    names = {e["nodeName"] for e in after}
    assert len(after) == binding.MAX_REFUSED_NODES == 16
    assert "new" in names
    assert names == ({e["nodeName"] for e in existing} | {"new"}) - dropped


def test_add_refusal_replacing_does_not_drop_others_at_the_cap() -> None:
    existing = [{"nodeName": f"n{i:02d}", "until": at(100 + i)} for i in range(16)]
    after = binding.add_refusal(existing, "n00", NOW + datetime.timedelta(hours=1))
    assert len(after) == 16
    assert after[0] == {"nodeName": "n00", "until": "2024-05-01T13:00:00Z"}


# -- candidates and choice -------------------------------------------------------------------


def test_candidates_are_eligible_serving_fitting_and_not_refused() -> None:
    nodes = [
        node("fits", {A10_RES: 4}),
        node("exact", {A10_RES: 2}),
        node("small", {A10_RES: 1}),
        node("notready", {A10_RES: 8}, ready=False),
        node("cordoned", {A10_RES: 8}, cordoned=True),
        node("tainted", {A10_RES: 8}, taints=[{"key": "other", "effect": "NoSchedule"}]),
        node("tolerated", {A10_RES: 8}, taints=[GPU_TAINT]),
        node("refused", {A10_RES: 8}),
        node("expired", {A10_RES: 8}),
        node("other-resource", {L40S_RES: 8}),
        node("held", {A10_RES: 4}),
    ]
    bound = claim("b", 3, phase="Bound", node_name="held")
    ledger = ledger_of(nodes, [(bound, A10_RES)])
    c = claim(
        "c",
        2,
        refused=[
            {"nodeName": "refused", "until": at(60)},
            {"nodeName": "expired", "until": at(-60)},
        ],
    )
    assert binding.candidates(c, A10, nodes, ledger, NOW) == [
        ("exact", 2),
        ("expired", 8),
        ("fits", 4),
        ("tolerated", 8),
    ]


@pytest.mark.parametrize(
    ("cls", "nodes", "count", "expected"),
    [
        pytest.param(
            L40S,
            [node("v1", {L40S_RES: 4}), node("p1", {A10_RES: 4})],
            1,
            [("v1", 4)],
            id="vgpu-class-uses-its-resource",
        ),
        pytest.param(
            gpuclass(tolerations=[]),
            [node("t", {A10_RES: 4}, taints=[GPU_TAINT]), node("u", {A10_RES: 4})],
            1,
            [("u", 4)],
            id="untolerated-dedicated-taint",
        ),
        pytest.param(
            {"metadata": {"name": "dra"}, "spec": {"mode": "passthrough", "source": {"dra": {}}}},
            [node("u", {A10_RES: 4})],
            1,
            [],
            id="class-without-resource",
        ),
        pytest.param(A10, [node("u", {A10_RES: 4})], 0, [], id="count-zero-fits-nothing"),
        pytest.param(A10, [node("u", {A10_RES: 4})], 5, [], id="too-big"),
    ],
)
def test_candidates_cases(
    cls: Obj, nodes: list[Obj], count: int, expected: list[tuple[str, int]]
) -> None:
    ledger = ledger_of(nodes)
    cls_name = cls["metadata"]["name"]
    assert binding.candidates(claim("c", count, class_name=cls_name), cls, nodes, ledger, NOW) == (
        expected
    )


@pytest.mark.parametrize(
    ("cands", "policy", "expected"),
    [
        pytest.param([("a", 4), ("b", 2), ("c", 8)], "binpack", "b", id="binpack-least-free"),
        pytest.param([("a", 4), ("b", 2), ("c", 8)], "spread", "c", id="spread-most-free"),
        pytest.param([("b", 2), ("a", 2), ("c", 8)], "binpack", "a", id="binpack-tie-by-name"),
        pytest.param([("z", 8), ("y", 8), ("a", 1)], "spread", "y", id="spread-tie-by-name"),
        pytest.param([], "binpack", None, id="binpack-none"),
        pytest.param([], "spread", None, id="spread-none"),
    ],
)
def test_choose(cands: list[tuple[str, int]], policy: binding.Policy, expected: str | None) -> None:
    assert binding.choose(cands, policy) == expected
    assert binding.choose(reversed(cands), policy) == expected  # input order does not matter


def test_choose_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="binpack or spread"):
        binding.choose([("a", 1)], "random")  # type: ignore[arg-type]


# -- the queue -------------------------------------------------------------------------------


def test_pending_in_order_is_fifo_of_waiting_claims() -> None:
    claims = [
        claim("late", created=30),
        claim("bound", created=0, phase="Bound", node_name="n1"),
        claim("lost", created=20, phase="Lost", node_name="gone"),
        claim("new", created=10, phase=None),
        claim("b-same-second", created=5, namespace="tenant-b"),
        claim("a-same-second", created=5, namespace="tenant-b"),
        claim("z-same-second", created=5, namespace="tenant-a"),
        claim("leaving", created=1, deleting=True),
    ]
    assert [model_objects.key(c) for c in binding.pending_in_order(claims)] == [
        ("tenant-a", "z-same-second"),
        ("tenant-b", "a-same-second"),
        ("tenant-b", "b-same-second"),
        ("tenant-a", "new"),
        ("tenant-a", "lost"),
        ("tenant-a", "late"),
    ]


# -- plans -----------------------------------------------------------------------------------


def test_waiting_renders_reason_and_message() -> None:
    waiting = binding.Waiting(binding.WaitReason.QUEUED, "kept for an older claim")
    assert str(waiting) == "Queued: kept for an older claim"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            "binpack",
            [(key("c1"), "n2"), (key("c2"), "n2"), (key("c3"), "n4")],
            id="binpack",
        ),
        pytest.param(
            "spread",
            [(key("c1"), "n4"), (key("c2"), "n4"), (key("c3"), "n2")],
            id="spread",
        ),
    ],
)
def test_plan_places_by_policy_on_simulated_free(
    policy: binding.Policy, expected: list[tuple[Key, str]]
) -> None:
    nodes = [node("n2", {A10_RES: 2}), node("n4", {A10_RES: 4})]
    ledger = ledger_of(nodes)
    claims = [claim("c1", 1, created=0), claim("c2", 1, created=1), claim("c3", 2, created=2)]
    result = binding.plan(claims, A10, nodes, ledger, policy, NOW)
    assert result.bindings == expected
    assert result.waiting == {}
    assert result.nomination is None
    assert ledger.free("n2", A10_RES) == 2  # the ledger is only read
    assert ledger.free("n4", A10_RES) == 4


def test_plan_never_gives_the_last_units_twice() -> None:
    nodes = [node("n1", {A10_RES: 3})]
    ledger = ledger_of(nodes, [(claim("held", 1, phase="Bound", node_name="n1"), A10_RES)])
    claims = [claim("first", 1, created=0), claim("second", 2, created=1)]
    bindings, waiting, nomination = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    assert bindings == [(key("first"), "n1")]
    assert str(waiting[key("second")]) == (
        "NoCapacity: no eligible node has 2 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 1); waiting for 1 more unit on node n1, kept for this "
        "claim (younger claims of the class are not bound there)"
    )
    assert nomination == binding.Nomination(key("second"), "n1", need=2, missing=1)


def test_plan_no_capacity_message_names_the_most_free() -> None:
    nodes = [node("n1", {A10_RES: 8}), node("n2", {A10_RES: 8})]
    ledger = ledger_of(
        nodes,
        [
            (claim("h1", 6, phase="Bound", node_name="n1"), A10_RES),
            (claim("h2", 7, phase="Bound", node_name="n2"), A10_RES),
        ],
    )
    result = binding.plan([claim("big", 4)], A10, nodes, ledger, "binpack", NOW)
    assert str(result.waiting[key("big")]) == (
        "NoCapacity: no eligible node has 4 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 2); waiting for 2 more units on node n1, kept for this "
        "claim (younger claims of the class are not bound there)"
    )


def test_plan_skips_refused_nodes_and_says_so() -> None:
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 1})]
    ledger = ledger_of(nodes)
    refused = [{"nodeName": "n1", "until": at(600)}]
    result = binding.plan([claim("c", 2, refused=refused)], A10, nodes, ledger, "binpack", NOW)
    assert result.bindings == []
    assert str(result.waiting[key("c")]) == (
        "NoCapacity: no eligible node has 2 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 1); skipped until their refusal expires: n1"
    )
    assert result.nomination is None  # n2 can never hold 2: nothing to keep there
    later = NOW + datetime.timedelta(minutes=10)
    assert binding.plan(
        [claim("c", 2, refused=refused)], A10, nodes, ledger, "binpack", later
    ).bindings == [(key("c"), "n1")]


@pytest.mark.parametrize(
    ("cls", "nodes", "message"),
    [
        pytest.param(
            A10,
            [node("n1", {A10_RES: 4}, cordoned=True)],
            "NoCapacity: no eligible node serves nvidia.com/GA102GL_A10",
            id="no-eligible-node",
        ),
        pytest.param(
            A10,
            [node("n1", {L40S_RES: 4})],
            "NoCapacity: no eligible node serves nvidia.com/GA102GL_A10",
            id="resource-not-served",
        ),
        pytest.param(
            {"metadata": {"name": "a10"}, "spec": {"mode": "passthrough"}},
            [node("n1", {A10_RES: 4})],
            "NoCapacity: class a10 names no device-plugin resource",
            id="class-without-resource",
        ),
        pytest.param(
            A10,
            [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 2})],
            "NoCapacity: no eligible node has 6 units of nvidia.com/GA102GL_A10 even when "
            "empty (the most on one node: 4)",
            id="never-fits",
        ),
    ],
)
def test_plan_no_capacity_reasons(cls: Obj, nodes: list[Obj], message: str) -> None:
    result = binding.plan([claim("c", 6)], cls, nodes, ledger_of(nodes), "binpack", NOW)
    assert result.bindings == []
    assert str(result.waiting[key("c")]) == message
    assert result.nomination is None  # a claim that can never fit keeps nothing


def test_plan_invalid_count_waits() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    result = binding.plan([claim("c", 0)], A10, nodes, ledger_of(nodes), "binpack", NOW)
    assert result.bindings == []
    assert result.waiting[key("c")].reason is binding.WaitReason.INVALID_COUNT


def test_plan_considers_only_waiting_claims_of_its_class() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    held = claim("held", 1, phase="Bound", node_name="n1")
    ledger = ledger_of(nodes, [(held, A10_RES)])
    claims = [
        held,
        claim("other-class", 1, class_name="l40s-24q"),
        claim("leaving", 1, deleting=True),
        claim("mine", 3, created=5),
    ]
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    assert result.bindings == [(key("mine"), "n1")]
    assert result.waiting == {}


def test_classes_sharing_a_resource_see_each_others_holds() -> None:
    a10_ha = gpuclass("a10-ha", A10_RES)
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(
        nodes, [(claim("h", 3, class_name="a10-ha", phase="Bound", node_name="n1"), A10_RES)]
    )
    result = binding.plan([claim("c", 2)], A10, nodes, ledger, "binpack", NOW)
    assert result.bindings == []
    assert binding.plan(
        [claim("c", 1, class_name="a10-ha")], a10_ha, nodes, ledger, "spread", NOW
    ).bindings == [(key("c"), "n1")]


def test_plan_vgpu_class_binds_one_unit_per_claim() -> None:
    nodes = [node("v1", {L40S_RES: 2}), node("v2", {L40S_RES: 3}), node("p1", {A10_RES: 8})]
    ledger = ledger_of(nodes)
    claims = [claim(f"vm{i}", 1, class_name="l40s-24q", created=i) for i in range(6)]
    result = binding.plan(claims, L40S, nodes, ledger, "spread", NOW)
    assert result.bindings == [
        (key("vm0"), "v2"),
        (key("vm1"), "v1"),
        (key("vm2"), "v2"),
        (key("vm3"), "v1"),
        (key("vm4"), "v2"),
    ]
    assert str(result.waiting[key("vm5")]) == (
        "NoCapacity: no eligible node has 1 free unit of nvidia.com/L40S-24Q "
        "(most free on one node: 0); waiting for 1 more unit on node v1, kept for this "
        "claim (younger claims of the class are not bound there)"
    )


# -- FIFO with backfill ------------------------------------------------------------------------


def queue_with_big_head(smalls: int, need: int = 4) -> list[Obj]:
    return [claim("big", need, created=0)] + [
        claim(f"s{i}", 1, created=1 + i) for i in range(smalls)
    ]


KEPT_N1 = (
    "Queued: 1 free unit of nvidia.com/GA102GL_A10 is left only on node n1, kept for an "
    "older claim of class a10 that waits for room there (claims of a class are served in "
    "order of creation)"
)


def test_a_big_head_nominates_its_nearest_node_and_small_claims_bind_elsewhere() -> None:
    """The case backfill is for: an order that fits only on an empty node. It keeps the node nearest
    to fitting; every younger order binds on the other nodes, however many there are."""
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 4}), node("n3", {A10_RES: 4})]
    ledger = ledger_of(
        nodes,
        [
            (claim("h1", 1, phase="Bound", node_name="n1"), A10_RES),
            (claim("h2", 3, phase="Bound", node_name="n2"), A10_RES),
            (claim("h3", 2, phase="Bound", node_name="n3"), A10_RES),
        ],
    )
    result = binding.plan(queue_with_big_head(20), A10, nodes, ledger, "binpack", NOW)
    assert result.nomination == binding.Nomination(key("big"), "n1", need=4, missing=1)
    # n2 has 1 free, n3 has 2: three small orders bind, binpack first on the least free.
    assert result.bindings == [(key("s0"), "n2"), (key("s1"), "n3"), (key("s2"), "n3")]
    assert str(result.waiting[key("s3")]) == KEPT_N1
    assert set(result.waiting) == {key("big")} | {key(f"s{i}") for i in range(3, 20)}


def test_the_nominated_claim_binds_once_its_node_frees() -> None:
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 4})]
    on_n2 = (claim("h2", 2, phase="Bound", node_name="n2"), A10_RES)
    busy = ledger_of(nodes, [(claim("h1", 1, phase="Bound", node_name="n1"), A10_RES), on_n2])
    waiting = binding.plan(queue_with_big_head(6), A10, nodes, busy, "binpack", NOW)
    assert waiting.nomination == binding.Nomination(key("big"), "n1", need=4, missing=1)
    assert waiting.bindings == [(key("s0"), "n2"), (key("s1"), "n2")]
    # The hold on n1 goes: n1 has room for the head, which binds before any younger claim.
    freed = ledger_of(nodes, [on_n2])
    later = binding.plan(queue_with_big_head(6), A10, nodes, freed, "binpack", NOW)
    assert later.bindings[0] == (key("big"), "n1")
    assert later.nomination is not None and later.nomination.claim == key("s2")  # the next


def test_the_nearest_node_is_the_fewest_units_missing_then_the_smallest_name() -> None:
    nodes = [
        node("b", {A10_RES: 8}),
        node("a", {A10_RES: 8}),
        node("c", {A10_RES: 8}),
        node("small", {A10_RES: 3}),  # 3 free, but can never hold 6
    ]
    held = [
        (claim("hb", 4, phase="Bound", node_name="b"), A10_RES),  # 4 free: 2 missing
        (claim("ha", 4, phase="Bound", node_name="a"), A10_RES),  # 4 free: 2 missing
        (claim("hc", 7, phase="Bound", node_name="c"), A10_RES),  # 1 free: 5 missing
    ]
    for policy in (binding.BINPACK, binding.SPREAD):
        result = binding.plan([claim("big", 6)], A10, nodes, ledger_of(nodes, held), policy, NOW)
        assert result.nomination == binding.Nomination(key("big"), "a", need=6, missing=2)


def test_only_the_oldest_claim_that_fits_nowhere_nominates() -> None:
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 4})]
    ledger = ledger_of(
        nodes,
        [
            (claim("h1", 2, phase="Bound", node_name="n1"), A10_RES),
            (claim("h2", 3, phase="Bound", node_name="n2"), A10_RES),
        ],
    )
    claims = [claim("big", 4, created=0), claim("second-big", 3, created=1)]
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    assert result.nomination == binding.Nomination(key("big"), "n1", need=4, missing=2)
    # The second big order waits without a node of its own (n2 is not kept for it).
    assert str(result.waiting[key("second-big")]) == (
        "NoCapacity: no eligible node has 3 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 2)"
    )
    assert binding.plan(
        [*claims, claim("small", 1, created=2)], A10, nodes, ledger, "binpack", NOW
    ).bindings == [(key("small"), "n2")]


def test_a_claim_that_can_never_fit_nominates_nothing_and_the_next_one_does() -> None:
    nodes = [node("n1", {A10_RES: 2}), node("n2", {A10_RES: 2})]
    ledger = ledger_of(nodes, [(claim("h", 1, phase="Bound", node_name="n1"), A10_RES)])
    claims = [claim("huge", 8, created=0), claim("pair", 2, created=1), claim("one", 1, created=2)]
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    assert "even when empty" in str(result.waiting[key("huge")])
    # "pair" fits on n2 (2 free); "one" then fits on n1.
    assert result.bindings == [(key("pair"), "n2"), (key("one"), "n1")]
    assert result.nomination is None


def test_a_refused_node_is_never_nominated_and_an_ineligible_one_is_replaced() -> None:
    held = [
        (claim("h1", 1, phase="Bound", node_name="n1"), A10_RES),
        (claim("h2", 2, phase="Bound", node_name="n2"), A10_RES),
    ]
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 4})]
    refused = [{"nodeName": "n1", "until": at(600)}]
    big = claim("big", 4, refused=refused)
    result = binding.plan([big], A10, nodes, ledger_of(nodes, held), "binpack", NOW)
    assert result.nomination == binding.Nomination(key("big"), "n2", need=4, missing=2)
    # The nominated n2 is cordoned: the next pass nominates n1 (its refusal has expired).
    cordoned = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 4}, cordoned=True)]
    later = NOW + datetime.timedelta(minutes=11)
    again = binding.plan([big], A10, cordoned, ledger_of(cordoned, held), "binpack", later)
    assert again.nomination == binding.Nomination(key("big"), "n1", need=4, missing=1)


def test_a_younger_claim_refused_elsewhere_is_queued_behind_the_kept_units() -> None:
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 2})]
    ledger = ledger_of(nodes, [(claim("h1", 2, phase="Bound", node_name="n1"), A10_RES)])
    refused = [{"nodeName": "n2", "until": at(600)}]
    claims = [claim("big", 4, created=0), claim("small", 1, created=1, refused=refused)]
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    assert result.nomination == binding.Nomination(key("big"), "n1", need=4, missing=2)
    assert str(result.waiting[key("small")]) == (
        "Queued: 1 free unit of nvidia.com/GA102GL_A10 is left only on node n1, kept for "
        "an older claim of class a10 that waits for room there (claims of a class are served "
        "in order of creation)"
    )


def test_waiting_messages_never_name_another_claim() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(nodes, [(claim("h1", 3, phase="Bound", node_name="n1"), A10_RES)])
    claims = [
        claim("other-tenants-big", 4, namespace="tenant-b", created=0),
        claim("mine", 1, created=1),
    ]
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    message = str(result.waiting[key("mine")])
    assert "tenant-b" not in message and "other-tenants-big" not in message
    assert message.startswith("Queued: ")


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    nodes = [node(f"n{i}", {A10_RES: 1 + i % 3}) for i in range(5)]
    claims = [claim(f"c{i}", 1 + i % 2, created=i % 3) for i in range(8)]
    ledger = ledger_of(nodes)
    forward = binding.plan(claims, A10, nodes, ledger, "binpack", NOW)
    backward = binding.plan(claims[::-1], A10, nodes[::-1], ledger, "binpack", NOW)
    assert forward == backward


# -- properties: a plan never over-allocates and keeps the nominated units -------------------

node_specs = st.lists(
    st.tuples(
        st.integers(0, 8),  # allocatable
        st.integers(0, 8),  # held by a bound claim
        st.booleans(),  # eligible
    ),
    min_size=0,
    max_size=6,
)
claim_specs = st.lists(
    st.tuples(
        st.integers(1, 6),  # count
        st.integers(0, 5),  # created (seconds)
        st.sets(st.integers(0, 5), max_size=3),  # refused node indexes
    ),
    min_size=0,
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(node_specs, claim_specs, st.sampled_from(["binpack", "spread"]))
def test_a_plan_is_fifo_with_backfill_around_the_nominated_node(
    nspecs: list[tuple[int, int, bool]],
    cspecs: list[tuple[int, int, set[int]]],
    policy: binding.Policy,
) -> None:
    """Replayed in the order of creation on the test's own figures: no claim is bound beyond
    a node's free units, onto a node it may not use, or — younger than the nominating claim —
    onto the nominated node; no claim waits while a node it may use fits it; the nominating
    claim is the oldest waiting one that can fit somewhere, and its node is the one with the
    fewest units missing (ties by name)."""
    nodes = [
        node(f"n{i}", {A10_RES: alloc} if alloc else {}, ready=eligible)
        for i, (alloc, _, eligible) in enumerate(nspecs)
    ]
    held = [
        (claim(f"held{i}", h, phase="Bound", node_name=f"n{i}"), A10_RES)
        for i, (_, h, _) in enumerate(nspecs)
        if h
    ]
    ledger = ledger_of(nodes, held)
    claims = [
        claim(
            f"order-{i:02d}",
            count,
            created=created,
            refused=[{"nodeName": f"n{r}", "until": at(60)} for r in sorted(refused)],
        )
        for i, (count, created, refused) in enumerate(cspecs)
    ]
    result = binding.plan(claims, A10, nodes, ledger, policy, NOW)

    free = {
        f"n{i}": max(0, alloc - h)
        for i, (alloc, h, eligible) in enumerate(nspecs)
        if eligible and alloc
    }
    allocatable = {f"n{i}": alloc for i, (alloc, _, _) in enumerate(nspecs)}
    fifo = sorted(
        ((created, f"order-{i:02d}", count, {f"n{r}" for r in refused}))
        for i, (count, created, refused) in enumerate(cspecs)
    )
    bound_at = dict(result.bindings)
    assert len(bound_at) == len(result.bindings), "a claim bound twice"
    nominated: binding.Nomination | None = None
    for _, name, need, refused in fifo:
        kept = {nominated.node} if nominated else set()
        if key(name) in bound_at:
            where = bound_at[key(name)]
            assert where in free, "bound to a node that does not serve the class"
            assert where not in refused, "bound to a refused node"
            assert where not in kept, "a younger claim took the units the nomination keeps"
            assert free[where] >= need, "over-allocated"
            free[where] -= need
            continue
        usable = [n for n in free if n not in refused | kept]
        assert all(free[n] < need for n in usable), f"{name} waits while a node fits it"
        reachable = [(need - free[n], n) for n in free if n not in refused]
        reachable = [(m, n) for m, n in reachable if allocatable[n] >= need]
        if nominated is None and reachable:
            missing, where = min(reachable)
            nominated = binding.Nomination(key(name), where, need, missing)
    assert result.nomination == nominated
    assert set(bound_at).isdisjoint(result.waiting)
    assert set(bound_at) | set(result.waiting) == {key(name) for _, name, _, _ in fifo}
    for waiting in result.waiting.values():
        assert "order-" not in waiting.message, "a waiting message names a claim"


@settings(max_examples=300, deadline=None)
@given(
    allocatables=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    holds=st.lists(st.lists(st.integers(1, 4), max_size=4), min_size=5, max_size=5),
    need=st.integers(1, 8),
    arrivals=st.lists(st.lists(st.integers(1, 4), max_size=4), min_size=9, max_size=9),
    policy=st.sampled_from(["binpack", "spread"]),
)
def test_the_oldest_claim_binds_once_its_nominated_nodes_units_free(
    allocatables: list[int],
    holds: list[list[int]],
    need: int,
    arrivals: list[list[int]],
    policy: binding.Policy,
) -> None:
    """A simulation: a big order waits, small orders keep arriving and binding wherever
    they fit, and after every pass one hold on the node the big order nominated is released.
    Younger claims never take the units that free there, so the units it misses only go
    down: it is bound within ``need`` releases, however many small orders arrive."""
    need = min(need, max(allocatables))  # one that can fit somewhere (others never nominate)
    nodes = [node(f"n{i}", {A10_RES: a}) for i, a in enumerate(allocatables)]
    held: dict[str, tuple[str, int]] = {}  # hold name -> (node, count)
    for i, a in enumerate(allocatables):
        room = a
        for j, count in enumerate(holds[i]):
            if count <= room:
                held[f"h{i}-{j}"] = (f"n{i}", count)
                room -= count
    pending = [claim("big", need, created=0)]
    for round_ in range(need + 1):
        ledger = ledger_of(
            nodes,
            [(claim(h, c, phase="Bound", node_name=n), A10_RES) for h, (n, c) in held.items()],
        )
        result = binding.plan(pending, A10, nodes, ledger, policy, NOW)
        by_key = {model_objects.key(c): c for c in pending}
        for claim_key_, where in result.bindings:
            held[claim_key_[1]] = (where, by_key[claim_key_]["spec"]["count"])
        bound = {k for k, _ in result.bindings}
        pending = [c for c in pending if model_objects.key(c) not in bound]
        if key("big") in bound:
            return
        nomination = result.nomination
        assert nomination is not None and nomination.claim == key("big")
        assert nomination.missing <= need - round_, "the units it misses went up"
        on_node = sorted(h for h, (n, _) in held.items() if n == nomination.node)
        assert on_node, "a node short of units holds nothing to release"
        del held[on_node[0]]
        pending += [
            claim(f"s{round_}-{j}", count, created=1 + round_)
            for j, count in enumerate(arrivals[round_])
        ]
    raise AssertionError(f"the big order of {need} was not bound after {need} releases")


@given(
    frees=st.dictionaries(
        st.sampled_from([f"n{i}" for i in range(12)]), st.integers(0, 8), max_size=12
    ),
    orders=st.lists(
        st.tuples(
            st.integers(1, 9),
            st.frozensets(st.sampled_from([f"n{i}" for i in range(12)]), max_size=3),
        ),
        max_size=20,
    ),
    policy=st.sampled_from([binding.BINPACK, binding.SPREAD]),
)
def test_the_plans_free_index_chooses_what_choose_over_fitting_nodes_does(
    frees: dict[str, int], orders: list[tuple[int, frozenset[str]]], policy: binding.Policy
) -> None:
    index = binding._FreeIndex(dict(frees))
    for need, refused in orders:
        expected = binding.choose(binding._fitting(need, frees, set(refused)), policy)
        assert index.choose(need, set(refused), policy) == expected
        if expected is not None:
            frees[expected] -= need
            index.take(expected, need)
        assert index.frees == frees
