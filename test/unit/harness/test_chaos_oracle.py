"""The chaos suite's own checks (``chaos.oracle``, ``chaos.history``) on hand-made objects:
they must catch what they are there to catch, and excuse only what docs/design.md allows."""

from __future__ import annotations

import datetime
from typing import Any

from chaos import history as historymod
from chaos import oracle, store

Obj = dict[str, Any]
RES = "example.com/gpu"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def node(name: str, units: int, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "allocatable": {RES: str(units)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def cls(name: str = "a") -> Obj:
    return {"metadata": {"name": name}, "spec": {"source": {"devicePlugin": {"resourceName": RES}}}}


def claim(
    name: str,
    count: int,
    phase: str = "",
    node_name: str = "",
    reason: str = "",
    created: str = "2026-01-01T00:00:00Z",
    **status: Any,
) -> Obj:
    st: Obj = {**status}
    if phase:
        st["phase"] = phase
    if node_name:
        st["nodeName"] = node_name
    if reason:
        ok = "True" if phase == "Bound" else "False"
        st["conditions"] = [{"type": "Bound", "status": ok, "reason": reason, "message": "m"}]
    return {
        "metadata": {
            "name": name,
            "namespace": "t",
            "uid": f"u-{name}",
            "creationTimestamp": created,
        },
        "spec": {"className": "a", "count": count},
        "status": st,
    }


def pod(name: str, node_name: str, units: int, **meta: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "t", **meta},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {RES: str(units)}}}],
        },
        "status": {"phase": "Running"},
    }


def snap(
    claims: list[Obj], pods: list[Obj] | None = None, nodes: list[Obj] | None = None
) -> oracle.Snapshot:
    return oracle.Snapshot("1", claims, pods or [], nodes or [node("n1", 4)], [cls()], [])


def test_pod_units_follow_the_schedulers_rule() -> None:
    p = pod("p", "n1", 1)
    p["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {RES: "1"}}},
        {"name": "init", "resources": {"requests": {RES: "3"}}},
    ]
    p["spec"]["overhead"] = {RES: "1"}
    # max(1 regular + 1 sidecar, 3 init + 1 sidecar started before it) + 1 overhead
    assert oracle.pod_units(p) == {RES: 5}
    done = pod("q", "n1", 2)
    done["status"]["phase"] = "Succeeded"
    assert oracle.pod_units(done) == {}


def test_a_launcher_pod_is_covered_by_its_vmis_claims_and_only_by_them() -> None:
    vmi = {"kind": "VirtualMachineInstance", "name": "vm", "uid": "v1", "controller": True}
    launcher = pod("l", "n1", 3, labels={"kubevirt.io": "virt-launcher"}, ownerReferences=[vmi])
    held = claim("h", 2, "Bound", "n1", "Bound", attachment={"vmi": "vm", "uid": "v1"})
    # Two units accounted by the claim, the third counts like any pod's: 2 + 1 = 3.
    assert oracle.used_units(snap([held], [launcher])) == {("n1", RES): 3}
    labelled = pod("x", "n1", 3, labels={"kubevirt.io": "virt-launcher"})
    assert oracle.used_units(snap([held], [labelled])) == {("n1", RES): 5}
    assert oracle.overallocations(snap([held], [labelled])) == [f"n1 {RES}: 5 used of 4"]


def test_a_waiting_claim_that_fits_is_stuck_unless_it_queues_behind_one_that_does_not() -> None:
    fits = claim("small", 1, "Pending", reason="NoCapacity", created="2026-01-01T00:00:02Z")
    assert oracle.stuck_claims(snap([fits]), NOW) == [
        "t/small: fits on ['n1'] and waits (NoCapacity: m)"
    ]
    big = claim("big", 3, "Pending", reason="NoCapacity", created="2026-01-01T00:00:01Z")
    holder = claim("h", 2, "Bound", "n1", "Bound")
    queued = claim("small", 1, "Pending", reason="Queued", created="2026-01-01T00:00:02Z")
    assert oracle.stuck_claims(snap([holder, big, queued]), NOW) == []
    bare = claim("bare", 1, created="2026-01-01T00:00:03Z")
    assert any("no reason" in s for s in oracle.stuck_claims(snap([holder, big, bare]), NOW))


def test_behind_a_claim_that_fits_nowhere_only_its_nominated_node_is_kept() -> None:
    """Backfill: the big claim keeps the node nearest to fitting it (n1, 1 unit missing);
    a younger claim that fits on another node and waits is stuck."""
    holder = claim("h", 1, "Bound", "n1", "Bound")
    other = claim("o", 3, "Bound", "n2", "Bound")
    big = claim("big", 4, "Pending", reason="NoCapacity", created="2026-01-01T00:00:01Z")
    small = claim("small", 1, "Pending", reason="Queued", created="2026-01-01T00:00:02Z")
    nodes = [node("n1", 4), node("n2", 4)]
    s = oracle.Snapshot("1", [holder, other, big, small], [], nodes, [cls()], [])
    assert oracle.stuck_claims(s, NOW) == ["t/small: fits on ['n2'] and waits (Queued: m)"]
    full = claim("o", 4, "Bound", "n2", "Bound")
    s = oracle.Snapshot("1", [holder, full, big, small], [], nodes, [cls()], [])
    assert oracle.stuck_claims(s, NOW) == []  # it fits only into the kept n1
    # A claim that could never fit keeps nothing: behind it, fitting and waiting is stuck.
    huge = claim("big", 9, "Pending", reason="NoCapacity", created="2026-01-01T00:00:01Z")
    s = oracle.Snapshot("1", [holder, full, huge, small], [], nodes, [cls()], [])
    assert oracle.stuck_claims(s, NOW) == ["t/small: fits on ['n1'] and waits (Queued: m)"]


def test_a_refused_node_does_not_count_as_fitting_and_lost_or_vanished_holds_are_stuck() -> None:
    refused = claim(
        "r",
        1,
        "Pending",
        reason="RefusedByNode",
        refusedNodes=[{"nodeName": "n1", "until": "2026-01-01T01:00:00Z"}],
    )
    assert oracle.stuck_claims(snap([refused]), NOW) == []
    assert oracle.stuck_claims(snap([claim("l", 1, "Lost", "n1")]), NOW) == ["t/l: still Lost"]
    gone = claim("g", 1, "Bound", "n9", "Bound")
    assert oracle.stuck_claims(snap([gone]), NOW) == ["t/g: Bound to node n9, which is gone"]


def test_budgets_count_the_claims_bound_or_ordered_before() -> None:
    first = claim("a", 2, "Pending", created="2026-01-01T00:00:01Z")
    second = claim("b", 2, "Pending", created="2026-01-01T00:00:02Z")
    quota = {
        "metadata": {"namespace": "t"},
        "spec": {"hard": {"gpuclass.cozystack.io/devices": "3"}},
    }
    s = oracle.Snapshot("1", [first, second], [], [node("n1", 4)], [cls()], [quota])
    assert oracle.budget_holds(first, s)
    assert not oracle.budget_holds(second, s)


def test_bound_claims_over_a_budget_are_caught_per_key_and_deleting_ones_are_charged() -> None:
    quota = {
        "metadata": {"namespace": "t", "name": "gpus"},
        "spec": {
            "hard": {"gpuclass.cozystack.io/devices": "4", "a.gpuclass.cozystack.io/devices": "2"}
        },
    }
    within = [claim("a", 2, "Bound", "n1"), claim("b", 1, "Pending")]
    s = oracle.Snapshot("1", within, [], [node("n1", 4)], [cls()], [quota])
    assert oracle.overbudgets(s) == []
    leaving = claim("c", 1, "Bound", "n1")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:05Z"
    s = oracle.Snapshot("1", [*within, leaving], [], [node("n1", 4)], [cls()], [quota])
    assert oracle.overbudgets(s) == ["t/gpus a.gpuclass.cozystack.io/devices: 3 bound of 2"]

    over = [*within, claim("d", 1, "Bound", "n1")]
    s = oracle.Snapshot("1", over, [], [node("n1", 4)], [cls()], [quota])
    assert oracle.overbudgets(s) == ["t/gpus a.gpuclass.cozystack.io/devices: 3 bound of 2"]


def _feed(record: historymod.ClaimHistory, rev: int, obj: Obj | None, key: str = "t/c") -> None:
    record.on_events([store.Event(rev, historymod.CLAIMS_PREFIX + key, obj, float(rev))])


def test_a_hold_that_changes_node_without_lost_is_caught_and_one_through_lost_is_not() -> None:
    record = historymod.ClaimHistory()
    record.classes["a"] = RES
    record.capacity[("n1", RES)] = 1
    _feed(record, 1, claim("c", 1, "Bound", "n1", "Bound"))
    _feed(record, 2, claim("c", 1, "Bound", "n2", "Bound"))
    _feed(record, 3, claim("c", 1, "Lost", "n2", "NodeLost"))
    _feed(record, 4, claim("c", 1, "Pending", reason="NodeLost"))
    _feed(record, 5, claim("c", 1, "Bound", "n1", "Bound"))
    changes = record.node_changes()
    assert changes["unexplained"] == ["t/c: n1 -> n2 at revision 2"]
    assert changes["lost"] == ["t/c: n2 -> n1 at revision 5"]
    _feed(record, 6, claim("d", 1, "Bound", "n1", "Bound"), key="t/d")
    assert record.overholds == [f"revision 6: n1 {RES}: 2 units held of 1 (t/c=1, t/d=1)"]


def test_a_refused_claim_that_keeps_naming_its_node_moves_through_the_refusal() -> None:
    record = historymod.ClaimHistory()
    _feed(record, 1, claim("c", 1, "Bound", "n1", "Bound"))
    _feed(record, 2, claim("c", 1, "Pending", "n1", "RefusedByNode"))
    _feed(record, 3, claim("c", 1, "Bound", "n2", "Bound"))
    changes = record.node_changes()
    assert changes["refused"] == ["t/c: n1 -> n2 at revision 3"]
    assert changes["unexplained"] == []


def _of_class(obj: Obj, class_name: str) -> Obj:
    obj["spec"]["className"] = class_name
    return obj


def test_only_a_preemptible_classs_hold_may_be_taken_back_and_no_hold_ends_unexplained() -> None:
    record = historymod.ClaimHistory()
    record.preemptible.add("spot")
    # A spot hold taken back, then bound again elsewhere: a release and a node change
    # through the take-back, neither a violation.
    _feed(record, 1, _of_class(claim("s", 2, "Bound", "n1", "Bound"), "spot"), key="t/s")
    _feed(record, 2, _of_class(claim("s", 2, "Pending", "n1", "Preempted"), "spot"), key="t/s")
    _feed(record, 3, _of_class(claim("s", 2, "Bound", "n2", "Bound"), "spot"), key="t/s")
    # A guaranteed hold taken back: the violation this check exists for.
    _feed(record, 4, claim("g", 1, "Bound", "n1", "Bound"), key="t/g")
    _feed(record, 5, claim("g", 1, "Pending", "n1", "Preempted"), key="t/g")
    # Holds ended by the node's loss, a refusal, and the tenant's deletion: not violations.
    _feed(record, 6, claim("l", 1, "Bound", "n1", "Bound"), key="t/l")
    _feed(record, 7, claim("l", 1, "Lost", "n1", "NodeLost"), key="t/l")
    _feed(record, 8, claim("r", 1, "Bound", "n1", "Bound"), key="t/r")
    _feed(record, 9, claim("r", 1, "Pending", "n1", "RefusedByNode"), key="t/r")
    leaving = claim("d", 1, "Pending", "n1", "Bound")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:05Z"
    _feed(record, 10, claim("d", 1, "Bound", "n1", "Bound"), key="t/d")
    _feed(record, 11, leaving, key="t/d")
    _feed(record, 12, None, key="t/d")
    # A hold that just ends, for no reason the contract knows.
    _feed(record, 13, claim("x", 1, "Bound", "n1", "Bound"), key="t/x")
    _feed(record, 14, claim("x", 1, "Pending", reason="Waiting"), key="t/x")

    ended = record.releases()
    assert ended["preempted"] == ["t/s (spot): n1 -> Pending (Preempted) at revision 2"]
    assert ended["guaranteed"] == ["t/g (a): n1 -> Pending (Preempted) at revision 5"]
    assert ended["lost"] == ["t/l (a): n1 -> Lost (NodeLost) at revision 7"]
    assert ended["refused"] == ["t/r (a): n1 -> Pending (RefusedByNode) at revision 9"]
    assert ended["unexplained"] == ["t/x (a): n1 -> Pending (Waiting) at revision 14"]
    changes = record.node_changes()
    assert changes["preempted"] == ["t/s: n1 -> n2 at revision 3"]
    assert changes["unexplained"] == []


def test_a_transient_hold_counts_on_its_target_node_and_the_move_with_the_vm_is_explained() -> None:
    record = historymod.ClaimHistory()
    record.classes["a"] = RES
    record.capacity[("n1", RES)] = 1
    record.capacity[("n2", RES)] = 1
    _feed(record, 1, claim("c", 1, "Bound", "n1", "Bound"))
    migrating = claim("c", 1, "Bound", "n1", "Bound", migration={"uid": "m", "targetNode": "n2"})
    _feed(record, 2, migrating)
    assert record.overholds == []
    # The target node's unit is held for the migration: another hold there is one too many.
    _feed(record, 3, claim("d", 1, "Bound", "n2", "Bound"), key="t/d")
    assert record.overholds == [f"revision 3: n2 {RES}: 2 units held of 1 (t/c=1, t/d=1)"]
    _feed(record, 4, None, key="t/d")
    # The claim moves with its VM: its source unit is free, and the move is explained.
    _feed(record, 5, claim("c", 1, "Bound", "n2", "Migrated"))
    _feed(record, 6, claim("e", 1, "Bound", "n1", "Bound"), key="t/e")
    assert len(record.overholds) == 1
    changes = record.node_changes()
    assert changes["migrated"] == ["t/c: n1 -> n2 at revision 5"]
    assert changes["unexplained"] == []


def test_a_refusal_naming_a_class_that_exists_is_no_decision() -> None:
    message = (
        'admission webhook "orders" denied the request: spec.className: class a does not exist'
    )
    assert oracle.refusal_kind(message) == "unknown class"
    assert not oracle.decided(message, existing=["a"])
