"""Binding follows DESIGN.md §5 "Binding": a waiting claim goes to an eligible node with
enough free units that has not refused it lately, chosen by binpack or spread with ties broken
by name; claims of a class wait FIFO with bounded bypass; one plan never places more on a node
than it has free; refusedNodes expire and keep at most 16 entries."""

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


@pytest.mark.parametrize(
    ("counts", "limit", "expected"),
    [
        pytest.param({}, 8, False, id="never-bypassed"),
        pytest.param({key("big"): 7}, 8, False, id="below-limit"),
        pytest.param({key("big"): 8}, 8, True, id="at-limit"),
        pytest.param({key("big"): 9}, 8, True, id="above-limit"),
        pytest.param({}, 0, True, id="strict-fifo"),
    ],
)
def test_head_of_line_blocks(counts: dict[Key, int], limit: int, expected: bool) -> None:
    assert binding.head_of_line_blocks(counts, key("big"), limit) is expected


def test_default_max_bypass_is_8() -> None:
    assert binding.DEFAULT_MAX_BYPASS == 8
    assert binding.head_of_line_blocks({key("big"): 8}, key("big"))
    assert not binding.head_of_line_blocks({key("big"): 7}, key("big"))


# -- plans -----------------------------------------------------------------------------------


def test_waiting_renders_reason_and_message() -> None:
    waiting = binding.Waiting(binding.WaitReason.QUEUED, "waiting behind older claim a/b")
    assert str(waiting) == "Queued: waiting behind older claim a/b"


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
    result = binding.plan(claims, A10, nodes, ledger, policy, NOW, {})
    assert result.bindings == expected
    assert result.waiting == {}
    assert result.bypass_counts == {}
    assert ledger.free("n2", A10_RES) == 2  # the ledger is only read
    assert ledger.free("n4", A10_RES) == 4


def test_plan_never_gives_the_last_units_twice() -> None:
    nodes = [node("n1", {A10_RES: 3})]
    ledger = ledger_of(nodes, [(claim("held", 1, phase="Bound", node_name="n1"), A10_RES)])
    claims = [claim("first", 1, created=0), claim("second", 2, created=1)]
    bindings, counts, waiting = binding.plan(claims, A10, nodes, ledger, "binpack", NOW, {})
    assert bindings == [(key("first"), "n1")]
    assert str(waiting[key("second")]) == (
        "NoCapacity: no eligible node has 2 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 1)"
    )
    assert counts == {key("second"): 0}


def test_plan_no_capacity_message_names_the_most_free() -> None:
    nodes = [node("n1", {A10_RES: 8}), node("n2", {A10_RES: 8})]
    ledger = ledger_of(
        nodes,
        [
            (claim("h1", 6, phase="Bound", node_name="n1"), A10_RES),
            (claim("h2", 7, phase="Bound", node_name="n2"), A10_RES),
        ],
    )
    result = binding.plan([claim("big", 4)], A10, nodes, ledger, "binpack", NOW, {})
    assert str(result.waiting[key("big")]) == (
        "NoCapacity: no eligible node has 4 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 2)"
    )


def test_plan_skips_refused_nodes_and_says_so() -> None:
    nodes = [node("n1", {A10_RES: 4}), node("n2", {A10_RES: 1})]
    ledger = ledger_of(nodes)
    refused = [{"nodeName": "n1", "until": at(600)}]
    result = binding.plan([claim("c", 2, refused=refused)], A10, nodes, ledger, "binpack", NOW, {})
    assert result.bindings == []
    assert str(result.waiting[key("c")]) == (
        "NoCapacity: no eligible node has 2 free units of nvidia.com/GA102GL_A10 "
        "(most free on one node: 1); skipped until their refusal expires: n1"
    )
    later = NOW + datetime.timedelta(minutes=10)
    assert binding.plan(
        [claim("c", 2, refused=refused)], A10, nodes, ledger, "binpack", later, {}
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
    result = binding.plan([claim("c", 6)], cls, nodes, ledger_of(nodes), "binpack", NOW, {})
    assert result.bindings == []
    assert str(result.waiting[key("c")]) == message
    assert result.bypass_counts == {}  # nothing that can never fit is counted


def test_plan_invalid_count_waits() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    result = binding.plan([claim("c", 0)], A10, nodes, ledger_of(nodes), "binpack", NOW, {})
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
    result = binding.plan(claims, A10, nodes, ledger, "binpack", NOW, {})
    assert result.bindings == [(key("mine"), "n1")]
    assert result.waiting == {}


def test_classes_sharing_a_resource_see_each_others_holds() -> None:
    a10_ha = gpuclass("a10-ha", A10_RES)
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(
        nodes, [(claim("h", 3, class_name="a10-ha", phase="Bound", node_name="n1"), A10_RES)]
    )
    result = binding.plan([claim("c", 2)], A10, nodes, ledger, "binpack", NOW, {})
    assert result.bindings == []
    assert binding.plan(
        [claim("c", 1, class_name="a10-ha")], a10_ha, nodes, ledger, "spread", NOW, {}
    ).bindings == [(key("c"), "n1")]


def test_plan_vgpu_class_binds_one_unit_per_claim() -> None:
    nodes = [node("v1", {L40S_RES: 2}), node("v2", {L40S_RES: 3}), node("p1", {A10_RES: 8})]
    ledger = ledger_of(nodes)
    claims = [claim(f"vm{i}", 1, class_name="l40s-24q", created=i) for i in range(6)]
    result = binding.plan(claims, L40S, nodes, ledger, "spread", NOW, {})
    assert result.bindings == [
        (key("vm0"), "v2"),
        (key("vm1"), "v1"),
        (key("vm2"), "v2"),
        (key("vm3"), "v1"),
        (key("vm4"), "v2"),
    ]
    assert str(result.waiting[key("vm5")]) == (
        "NoCapacity: no eligible node has 1 free unit of nvidia.com/L40S-24Q "
        "(most free on one node: 0)"
    )


# -- FIFO with bounded bypass ------------------------------------------------------------------


def queue_with_big_head(smalls: int) -> list[Obj]:
    return [claim("big", 4, created=0)] + [claim(f"s{i}", 1, created=1 + i) for i in range(smalls)]


def test_small_claims_bypass_a_big_head_and_count() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(nodes, [(claim("held", 2, phase="Bound", node_name="n1"), A10_RES)])
    result = binding.plan(queue_with_big_head(3), A10, nodes, ledger, "binpack", NOW, {})
    assert result.bindings == [(key("s0"), "n1"), (key("s1"), "n1")]
    assert result.bypass_counts == {key("big"): 2, key("s2"): 0}
    assert str(result.waiting[key("big")]).startswith("NoCapacity: no eligible node has 4 free")


def test_head_blocks_once_bypassed_max_times() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(nodes, [(claim("held", 1, phase="Bound", node_name="n1"), A10_RES)])
    result = binding.plan(
        queue_with_big_head(4), A10, nodes, ledger, "binpack", NOW, {key("big"): 7}
    )
    # One more bypass reaches the limit; everything behind the head then queues.
    assert result.bindings == [(key("s0"), "n1")]
    assert result.bypass_counts[key("big")] == 8
    for name in ("s1", "s2", "s3"):
        assert str(result.waiting[key(name)]) == ("Queued: waiting behind older claim tenant-a/big")


def test_blocked_head_gets_the_capacity_that_frees() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    counts = {key("big"): 8}
    busy = ledger_of(nodes, [(claim("held", 1, phase="Bound", node_name="n1"), A10_RES)])
    first = binding.plan(queue_with_big_head(2), A10, nodes, busy, "binpack", NOW, counts)
    assert first.bindings == []
    assert first.bypass_counts == {key("big"): 8}
    assert set(first.waiting) == {key("big"), key("s0"), key("s1")}
    freed = ledger_of(nodes)
    second = binding.plan(
        queue_with_big_head(2), A10, nodes, freed, "binpack", NOW, first.bypass_counts
    )
    assert second.bindings == [(key("big"), "n1")]
    assert second.bypass_counts == {key("s0"): 0, key("s1"): 0}


def test_max_bypass_zero_is_strict_fifo() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    ledger = ledger_of(nodes, [(claim("held", 2, phase="Bound", node_name="n1"), A10_RES)])
    result = binding.plan(
        queue_with_big_head(2), A10, nodes, ledger, "binpack", NOW, {}, max_bypass=0
    )
    assert result.bindings == []
    assert result.waiting[key("s0")].reason is binding.WaitReason.QUEUED


def test_a_claim_that_never_fits_does_not_block() -> None:
    nodes = [node("n1", {A10_RES: 2})]
    result = binding.plan(
        queue_with_big_head(2), A10, nodes, ledger_of(nodes), "binpack", NOW, {key("big"): 50}
    )
    assert result.bindings == [(key("s0"), "n1"), (key("s1"), "n1")]
    assert key("big") not in result.bypass_counts
    assert "even when empty" in str(result.waiting[key("big")])


def test_bypass_counts_of_bound_or_gone_claims_are_dropped() -> None:
    nodes = [node("n1", {A10_RES: 4})]
    counts = {key("big"): 3, key("gone"): 5}
    result = binding.plan([claim("big", 4)], A10, nodes, ledger_of(nodes), "binpack", NOW, counts)
    assert result.bindings == [(key("big"), "n1")]
    assert result.bypass_counts == {}


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    nodes = [node(f"n{i}", {A10_RES: 1 + i % 3}) for i in range(5)]
    claims = [claim(f"c{i}", 1 + i % 2, created=i % 3) for i in range(8)]
    ledger = ledger_of(nodes)
    forward = binding.plan(claims, A10, nodes, ledger, "binpack", NOW, {})
    backward = binding.plan(claims[::-1], A10, nodes[::-1], ledger, "binpack", NOW, {})
    assert forward == backward


# -- property: a plan never over-allocates ----------------------------------------------------

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


@settings(max_examples=300, deadline=None)
@given(
    node_specs,
    claim_specs,
    st.sampled_from(["binpack", "spread"]),
    st.integers(0, 3),
    st.dictionaries(st.sampled_from([f"c{i}" for i in range(12)]), st.integers(0, 4)),
)
def test_plan_never_over_allocates(
    nspecs: list[tuple[int, int, bool]],
    cspecs: list[tuple[int, int, set[int]]],
    policy: binding.Policy,
    max_bypass: int,
    previous: dict[str, int],
) -> None:
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
            f"c{i}",
            count,
            created=created,
            refused=[{"nodeName": f"n{r}", "until": at(60)} for r in sorted(refused)],
        )
        for i, (count, created, refused) in enumerate(cspecs)
    ]
    by_key = {model_objects.key(c): c for c in claims}
    counts = {key(name): n for name, n in previous.items()}
    result = binding.plan(claims, A10, nodes, ledger, policy, NOW, counts, max_bypass=max_bypass)

    placed: dict[str, int] = {}
    for claim_key_, node_name in result.bindings:
        c = by_key[claim_key_]
        placed[node_name] = placed.get(node_name, 0) + c["spec"]["count"]
        index = int(node_name[1:])
        assert nspecs[index][2], "bound to an ineligible node"
        assert node_name not in binding.unexpired_refusals(c, NOW), "bound to a refused node"
    for node_name, units in placed.items():
        assert units <= ledger.free(node_name, A10_RES)
    # Every waiting claim is either bound or told why it waits, never both.
    bound_keys = [k for k, _ in result.bindings]
    assert len(bound_keys) == len(set(bound_keys))
    assert set(bound_keys).isdisjoint(result.waiting)
    assert set(bound_keys) | set(result.waiting) == set(by_key)
    assert set(result.bypass_counts) <= set(result.waiting)
    if max_bypass == 0:
        # Strict FIFO: the bindings are a prefix of the queue, leaving out the claims that
        # cannot fit on any eligible node even when it is empty (they never block).
        largest = max((alloc for alloc, _, eligible in nspecs if eligible), default=0)
        queue = [
            model_objects.key(c)
            for c in binding.pending_in_order(claims)
            if c["spec"]["count"] <= largest
        ]
        assert bound_keys == queue[: len(bound_keys)]


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
