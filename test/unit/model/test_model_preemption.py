"""What a guaranteed order takes back from preemptible holds: only spot holds, idle before
running, newest first, never more than it needs, on the node that stops the fewest VMs.

The oracle of the property tests is plain arithmetic over the rules of docs/design.md §5
"Preemptible classes": sums over subsets, not the module's own ordering code."""

from __future__ import annotations

import datetime
import functools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import capacity, preemption
from gpuoperator.model.preemption import SpotHold

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def hold(name: str, count: int, *, running: bool = False, minute: int = 0) -> SpotHold:
    return SpotHold(("t", name), count, running, EPOCH + datetime.timedelta(minutes=minute))


def names(found: preemption.TakeBack | None) -> list[str]:
    assert found is not None
    return [h.key[1] for h in found.holds]


def test_nothing_is_taken_when_nothing_is_short() -> None:
    found = preemption.take_back("n1", 0, [hold("a", 2)])
    assert found == preemption.TakeBack("n1", 0, ())
    assert found.units == 0 and found.running == 0


def test_idle_holds_go_before_running_vms_newest_first() -> None:
    holds = [
        hold("old-idle", 1, minute=1),
        hold("new-idle", 1, minute=5),
        hold("new-vm", 1, running=True, minute=9),
    ]
    assert names(preemption.take_back("n1", 1, holds)) == ["new-idle"]
    assert names(preemption.take_back("n1", 2, holds)) == ["new-idle", "old-idle"]
    assert names(preemption.take_back("n1", 3, holds)) == ["new-idle", "old-idle", "new-vm"]


def test_the_newest_running_vm_is_stopped_first() -> None:
    holds = [hold("old-vm", 2, running=True, minute=1), hold("new-vm", 2, running=True, minute=7)]
    found = preemption.take_back("n1", 2, holds)
    assert names(found) == ["new-vm"]
    assert found is not None and found.running == 1


def test_a_hold_not_needed_after_a_bigger_one_is_given_back() -> None:
    # Taken in order: the 1-unit hold, then the 4-unit one; the 4 alone cover 3.
    holds = [hold("small-new", 1, minute=9), hold("big-old", 4, minute=1)]
    assert names(preemption.take_back("n1", 3, holds)) == ["big-old"]


def test_a_running_vm_not_needed_is_never_stopped() -> None:
    holds = [
        hold("vm", 1, running=True, minute=9),
        hold("idle-a", 1, minute=1),
        hold("idle-b", 2, minute=2),
    ]
    found = preemption.take_back("n1", 3, holds)
    assert names(found) == ["idle-b", "idle-a"]
    assert found is not None and found.running == 0


def test_not_enough_spot_units_takes_nothing() -> None:
    assert preemption.take_back("n1", 5, [hold("a", 2), hold("b", 2, running=True)]) is None
    assert preemption.take_back("n1", 1, []) is None


def test_the_node_that_stops_fewest_vms_then_takes_fewest_units_is_chosen() -> None:
    nodes = [
        ("n1", 0, [hold("vm", 2, running=True)]),
        ("n2", 1, [hold("idle-big", 3)]),
        ("n3", 1, [hold("idle-small", 1)]),
        ("n4", 0, [hold("idle-a", 1), hold("idle-b", 1, minute=1)]),
    ]
    found = preemption.choose(2, nodes)
    assert found is not None
    assert (found.node, names(found)) == ("n3", ["idle-small"])


def test_ties_keep_the_placement_policys_order() -> None:
    nodes = [("n2", 0, [hold("x", 1)]), ("n1", 0, [hold("y", 1)])]
    found = preemption.choose(1, nodes)
    assert found is not None and found.node == "n2"


def test_a_node_where_the_order_fits_as_is_is_not_a_take_back() -> None:
    nodes = [("fits", 4, [hold("a", 4)]), ("short", 0, [hold("b", 2)])]
    found = preemption.choose(2, nodes)
    assert found is not None and found.node == "short"
    assert preemption.choose(2, [("fits", 2, [hold("a", 2)])]) is None


def test_reclaimable_counts_every_spot_unit() -> None:
    assert preemption.reclaimable([hold("a", 2), hold("b", 3, running=True)]) == 5
    assert preemption.reclaimable([]) == 0


holds_strategy = st.lists(
    st.builds(
        SpotHold,
        key=st.tuples(st.just("t"), st.text("abcdefgh", min_size=1, max_size=3)),
        count=st.integers(min_value=1, max_value=8),
        running=st.booleans(),
        since=st.integers(min_value=0, max_value=50).map(
            lambda m: EPOCH + datetime.timedelta(minutes=m)
        ),
    ),
    max_size=7,
    unique_by=lambda h: h.key,
)


@settings(max_examples=300, deadline=None)
@given(holds=holds_strategy, short=st.integers(min_value=1, max_value=30))
def test_the_take_back_covers_the_shortfall_and_is_minimal(
    holds: list[SpotHold], short: int
) -> None:
    found = preemption.take_back("n1", short, holds)
    total = sum(h.count for h in holds)
    if total < short:
        assert found is None
        return
    assert found is not None
    chosen = list(found.holds)
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(holds)
    units = sum(h.count for h in chosen)
    assert units >= short
    # Minimal: leaving any one chosen hold out no longer covers the shortfall.
    for h in chosen:
        assert units - h.count < short
    # Idle before running: a running VM is stopped only when all idle holds together are
    # not enough.
    idle = sum(h.count for h in holds if not h.running)
    if idle >= short:
        assert not any(h.running for h in chosen)
    # Never more running VMs than the fewest any covering set of the newest running VMs
    # needs after every idle unit: the running VMs stopped are no more than the count of
    # running VMs (newest first) whose units are needed on top of all idle units.
    running = sorted((h for h in holds if h.running), key=lambda h: (-h.since.timestamp(), h.key))
    needed_running = next(
        (k for k in range(len(running) + 1) if idle + sum(h.count for h in running[:k]) >= short),
        len(running),
    )
    assert sum(1 for h in chosen if h.running) <= needed_running


def reprieved(short: int, holds: list[SpotHold]) -> set[SpotHold]:
    """The oracle's take-back, stated the other way round (as kube-scheduler's default
    preemption reprieves victims): start from every spot hold and give back, most valued
    first (running before idle, oldest first), each one the rest can spare."""
    taken = set(holds)
    # Ties between equals: the one whose key sorts last is valued first.
    by_key = sorted(holds, key=lambda h: h.key, reverse=True)
    valued = sorted(by_key, key=lambda h: (not h.running, h.since))
    for h in valued:
        if sum(x.count for x in taken) - h.count >= short:
            taken.discard(h)
    return taken


@settings(max_examples=300, deadline=None)
@given(holds=holds_strategy, short=st.integers(min_value=1, max_value=30))
def test_the_take_back_is_every_spot_hold_less_those_it_can_spare(
    holds: list[SpotHold], short: int
) -> None:
    found = preemption.take_back("n1", short, holds)
    if sum(h.count for h in holds) < short:
        assert found is None
        return
    assert found is not None
    assert set(found.holds) == reprieved(short, holds)


@settings(max_examples=200, deadline=None)
@given(
    layout=st.lists(
        st.tuples(st.integers(min_value=0, max_value=6), holds_strategy), min_size=1, max_size=4
    ),
    need=st.integers(min_value=1, max_value=12),
)
def test_the_chosen_node_stops_fewest_vms_then_takes_fewest_units(
    layout: list[tuple[int, list[SpotHold]]], need: int
) -> None:
    nodes = [(f"n{i}", free, holds) for i, (free, holds) in enumerate(layout)]
    found = preemption.choose(need, nodes)
    ranks = []
    for position, (_name, free, holds) in enumerate(nodes):
        short = need - free
        if short <= 0 or free + sum(h.count for h in holds) < need:
            continue
        taken = reprieved(short, holds)
        ranks.append((sum(1 for h in taken if h.running), sum(h.count for h in taken), position))
    if not ranks:
        assert found is None
        return
    assert found is not None
    running, units, position = min(ranks)
    assert (found.node, found.running, found.units) == (nodes[position][0], running, units)


def claim(
    name: str, cls: str, *, bound: str, vmi: str = "", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "t", "creationTimestamp": bound}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T05:00:00Z"
    status: dict[str, Any] = {"phase": "Bound", "nodeName": "n1", "boundTime": bound}
    if vmi:
        status["attachment"] = {"vmi": vmi, "uid": "u-" + vmi}
    return {"metadata": meta, "spec": {"className": cls, "count": 2}, "status": status}


def test_spot_holds_are_the_preemptible_claims_on_the_node_with_their_vms() -> None:
    claims = [
        claim("spot-idle", "a10-spot", bound="2026-01-01T01:00:00Z"),
        claim("spot-vm", "a10-spot", bound="2026-01-01T00:00:00Z", vmi="vm"),
        claim("guaranteed", "a10", bound="2026-01-01T02:00:00Z"),
        claim("spot-going", "a10-spot", bound="2026-01-01T03:00:00Z", deleting=True),
        {
            **claim("elsewhere", "a10-spot", bound="2026-01-01T00:00:00Z"),
            "status": {"phase": "Bound", "nodeName": "n2"},
        },
    ]
    vmis = {
        ("t", "vm"): {
            "metadata": {
                "name": "vm",
                "namespace": "t",
                "uid": "u-vm",
                "creationTimestamp": "2026-01-01T04:00:00Z",
            },
            "status": {"phase": "Running"},
        }
    }
    found = preemption.spot_holds("n1", claims, vmis, ["a10-spot"])
    at = datetime.datetime.fromisoformat
    assert found == [
        SpotHold(("t", "spot-vm"), 2, True, at("2026-01-01T04:00:00+00:00")),
        SpotHold(("t", "spot-idle"), 2, False, at("2026-01-01T01:00:00+00:00")),
    ]
    assert preemption.spot_holds("n1", claims, vmis, []) == []


# -- on objects: classes, nodes, the capacity ledger ------------------------------------------

RES = "example.com/gpu"


def _gpuclass(name: str, *, preemptible: bool = False, resource: str = RES) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "passthrough",
        "source": {"devicePlugin": {"resourceName": resource}},
    }
    if preemptible:
        spec["preemptible"] = True
    return {"metadata": {"name": name}, "spec": spec}


def _node(name: str, units: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "allocatable": {RES: str(units)},
            "capacity": {RES: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _bound(
    name: str, cls: str, count: int, node: str, second: int, vmi: str = ""
) -> dict[str, Any]:
    found = claim(name, cls, bound=f"2026-01-01T00:00:{second:02d}Z", vmi=vmi)
    found["spec"]["count"] = count
    found["status"]["nodeName"] = node
    return found


def test_only_a_guaranteed_class_takes_back_and_only_from_spot_classes_on_its_resource() -> None:
    classes = [
        _gpuclass("a10"),
        _gpuclass("a10-spot", preemptible=True),
        _gpuclass("a10-cheap", preemptible=True),
        _gpuclass("l40-spot", preemptible=True, resource="example.com/other"),
    ]
    assert preemption.spot_classes(classes[0], classes) == ["a10-cheap", "a10-spot"]
    assert preemption.spot_classes(classes[1], classes) == []


def _world() -> tuple[list[dict[str, Any]], capacity.Ledger, list[dict[str, Any]]]:
    nodes = [_node("n1", 4), _node("n2", 2)]
    spot = [
        _bound("idle-n1", "a10-spot", 2, "n1", 1),
        _bound("vm-n1", "a10-spot", 2, "n1", 2, vmi="vm"),
        _bound("idle-n2", "a10-spot", 1, "n2", 3),
    ]
    ledger = capacity.Ledger()
    for n in nodes:
        ledger.set_node(n)
    for c in spot:
        ledger.set_claim(c, RES)
    return nodes, ledger, spot


def test_a_take_back_is_chosen_among_serving_nodes_from_idle_holds_only() -> None:
    nodes, ledger, spot = _world()
    order: dict[str, Any] = {
        "metadata": {"name": "o", "namespace": "t"},
        "spec": {"className": "a10", "count": 2},
    }
    found = preemption.take_back_for(
        order, _gpuclass("a10"), ["a10-spot"], nodes, ledger, spot, {}, "binpack", EPOCH
    )
    # n2 has 1 free and a 1-unit idle hold: taking it back stops no VM and takes 1 unit.
    assert found is not None
    assert (found.node, names(found)) == ("n2", ["idle-n2"])
    # Refused n2: n1, where only the idle hold may go (the VM's is never a candidate).
    order["status"] = {"refusedNodes": [{"nodeName": "n2", "until": "2026-01-01T01:00:00Z"}]}
    found = preemption.take_back_for(
        order, _gpuclass("a10"), ["a10-spot"], nodes, ledger, spot, {}, "binpack", EPOCH
    )
    assert found is not None and (found.node, names(found)) == ("n1", ["idle-n1"])
    # 4 units: n1 would need the running VM's units too: nothing is taken.
    order["spec"]["count"] = 4
    assert (
        preemption.take_back_for(
            order, _gpuclass("a10"), ["a10-spot"], nodes, ledger, spot, {}, "binpack", EPOCH
        )
        is None
    )


def test_room_counts_free_and_every_spot_unit_per_node() -> None:
    nodes, ledger, spot = _world()
    # n1: 0 free + 2 idle + 2 under a running VM; n2: 1 free + 1 idle.
    assert preemption.room(_gpuclass("a10"), ["a10-spot"], nodes, ledger, spot) == (5, 4)


def test_with_running_vms_allowed_the_running_hold_is_taken_when_idle_ones_fall_short() -> None:
    nodes, ledger, spot = _world()
    order: dict[str, Any] = {
        "metadata": {"name": "o", "namespace": "t"},
        "spec": {"className": "a10", "count": 4},
    }
    take = functools.partial(
        preemption.take_back_for,
        order,
        _gpuclass("a10"),
        ["a10-spot"],
        nodes,
        ledger,
        spot,
        {},
        "binpack",
        EPOCH,
    )
    assert take() is None
    found = take(running=True)
    assert found is not None
    assert (found.node, sorted(names(found)), found.running) == ("n1", ["idle-n1", "vm-n1"], 1)


def test_a_notice_is_due_its_grace_after_it_was_given() -> None:
    given = {
        "status": {
            "conditions": [
                {
                    "type": preemption.CONDITION,
                    "status": "True",
                    "reason": preemption.STOP_SCHEDULED,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    assert preemption.notice(given) is not None
    assert preemption.stop_at(given, 120) == EPOCH + datetime.timedelta(minutes=2)
    withdrawn = {
        "status": {"conditions": [{**given["status"]["conditions"][0], "status": "False"}]}
    }
    assert preemption.notice(withdrawn) is None and preemption.stop_at(withdrawn, 120) is None
    assert preemption.stop_at({}, 120) is None
