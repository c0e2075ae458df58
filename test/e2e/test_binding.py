"""The binder on the real control plane: placement policies, racing orders against a budget
or capacity, release and rebinding, lost nodes, usage records, claim protection. Every test
ends with the over-allocation check."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass, VirtualMachineInstance, Workload
from harness import claims
from harness.claims import claim_status, create_claim
from harness.edit_tenant import edit_tenant
from harness.fleet import Fleet
from harness.kube import Obj, mutate, replace
from harness.operator import Deployed, OperatorProcess, Start
from harness.waiting import wait_for

pytestmark = pytest.mark.operator_process  # it starts its own replicas

CONVERGE = 20.0


def bound_node(api: pykube.HTTPClient, ns: str, name: str) -> str:
    return claims.bound_node(api, ns, name, timeout=CONVERGE)


def bound_condition(s: Obj) -> Obj:
    found: Obj = next((c for c in s.get("conditions", []) if c["type"] == "Bound"), {})
    return found


@pytest.mark.parametrize(("policy", "expected"), [("binpack", "small"), ("spread", "large")])
def test_placement_policy_picks_the_least_or_the_most_free_node(
    api: pykube.HTTPClient,
    fleet: Fleet,
    namespace: str,
    start_operator: Start,
    policy: str,
    expected: str,
) -> None:
    start_operator(f"--placement-policy={policy}")
    cls = fleet.gpu_class()
    nodes = {"small": fleet.node(4), "large": fleet.node(8)}
    create_claim(api, namespace, "one", cls, 2)
    assert bound_node(api, namespace, "one") == nodes[expected]


@pytest.mark.parametrize("limit", ["budget", "capacity"])
def test_twenty_racing_orders_against_room_for_ten_bind_exactly_ten(
    api: pykube.HTTPClient,
    fleet: Fleet,
    namespace: str,
    start_operator: Start,
    limit: str,
) -> None:
    start_operator()
    cls = fleet.gpu_class()
    if limit == "budget":
        fleet.node(8)
        fleet.node(8)
        pykube.ResourceQuota(
            api,
            {
                "metadata": {"name": "gpus", "namespace": namespace},
                "spec": {"hard": {names.quota_key(cls): "10"}},
            },
        ).create()
    else:
        fleet.node(6)
        fleet.node(4)
    barrier = threading.Barrier(20)
    errors: list[BaseException] = []

    def create(i: int) -> None:
        local = pykube.HTTPClient(api.config)
        barrier.wait()
        try:
            create_claim(local, namespace, f"order-{i:02d}", cls, 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    def phases() -> dict[str, int]:
        out: dict[str, int] = {}
        for c in GPUClaim.objects(api, namespace=namespace):
            reason = bound_condition(c.obj.get("status") or {}).get("reason", "none")
            out[reason] = out.get(reason, 0) + 1
        return out

    want = "BudgetExceeded" if limit == "budget" else "NoCapacity"
    seen = wait_for(
        "10 bound and 10 waiting with a reason",
        phases,
        until=lambda p: p.get("Bound") == 10 and p.get(want, 0) + p.get("Queued", 0) == 10,
        timeout=CONVERGE,
    )
    assert seen.get(want, 0) >= 1
    bound = [
        c
        for c in GPUClaim.objects(api, namespace=namespace)
        if (c.obj.get("status") or {}).get("phase") == "Bound"
    ]
    assert len(bound) == 10


def test_releasing_a_claim_lets_a_waiting_one_bind(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    start_operator()
    cls = fleet.gpu_class()
    node = fleet.node(4)
    first = create_claim(api, namespace, "first", cls, 3)
    assert bound_node(api, namespace, "first") == node
    create_claim(api, namespace, "second", cls, 2)
    waiting = wait_for(
        "second to wait for capacity",
        lambda: claim_status(api, namespace, "second"),
        until=lambda s: bound_condition(s).get("reason") == "NoCapacity",
        timeout=CONVERGE,
    )
    assert waiting["phase"] == "Pending"
    assert "no eligible node has 2 free units" in bound_condition(waiting)["message"]
    first.delete()
    assert bound_node(api, namespace, "second") == node


def test_a_deleted_node_makes_its_claims_lost_then_bound_elsewhere(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    start_operator()
    cls = fleet.gpu_class()
    doomed = fleet.node(4)
    create_claim(api, namespace, "hold", cls, 2)
    assert bound_node(api, namespace, "hold") == doomed
    spare = fleet.node(8)
    gone = fleet.nodes.pop(0)
    gone.delete()
    wait_for(
        "the claim to be bound on the spare node",
        lambda: claim_status(api, namespace, "hold"),
        until=lambda s: s.get("phase") == "Bound" and s.get("nodeName") == spare,
        timeout=CONVERGE,
    )
    wait_for(
        "a NodeLost event",
        lambda: len(
            pykube.Event.objects(api, namespace=namespace).filter(
                field_selector={"involvedObject.name": "hold", "reason": "NodeLost"}
            )
        ),
        until=lambda n: n >= 1,
        timeout=CONVERGE,
    )


def test_deleting_a_cordoned_node_makes_its_claims_lost_then_pending_until_room_appears(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    """The node serves nothing any more when it goes (cordoned first), so no class figure
    changes: the deletion alone must wake the binder. With no room elsewhere the claim
    waits as Pending, the reason on its condition and the node it lost in ``status.lostNode``;
    it binds once a node appears."""
    start_operator()
    cls = fleet.gpu_class()
    doomed = fleet.node(4)
    create_claim(api, namespace, "hold", cls, 2)
    assert bound_node(api, namespace, "hold") == doomed
    node = fleet.nodes.pop(0)
    # The node lifecycle controller and kwok write the node too: retry on their 409s.
    mutate(node, lambda n: n["spec"].update(unschedulable=True))
    wait_for(
        "the class to count the cordoned node out",
        lambda: GPUClass.objects(api).get(name=cls).obj.get("status") or {},
        until=lambda s: s.get("nodes") == 0,
        timeout=CONVERGE,
    )
    node.delete()
    waiting = wait_for(
        "the claim to wait as Pending",
        lambda: claim_status(api, namespace, "hold"),
        until=lambda s: s.get("phase") == "Pending",
        timeout=CONVERGE,
    )
    assert "nodeName" not in waiting
    condition = bound_condition(waiting)
    assert condition["reason"] == "NoCapacity", condition
    assert f"{doomed} is gone" in condition["message"]
    assert waiting.get("lostNode") == doomed, waiting  # the schema keeps the field
    reasons = [
        e.obj["reason"]
        for e in pykube.Event.objects(api, namespace=namespace).filter(
            field_selector={"involvedObject.name": "hold"}
        )
    ]
    assert "NodeLost" in reasons
    spare = fleet.node(4)
    assert bound_node(api, namespace, "hold") == spare
    assert "lostNode" not in claim_status(api, namespace, "hold")  # bound again: none lost


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_leader_stopped_mid_load_hands_over_without_over_allocating(
    api: pykube.HTTPClient,
    deployed: Deployed,
    fleet: Fleet,
    namespace: str,
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    """Two replicas on one Lease; the leader is stopped (SIGTERM, as a rolling update does)
    or killed (SIGKILL) once it has bound some of a first wave of orders, and a second wave
    races in during the handover. The next leader binds exactly what fits (the
    over-allocation check runs after the test); a stopped leader released the Lease only
    after its controllers had stopped."""
    deployed.release_lease(api)
    replicas = [
        OperatorProcess(deployed, f"handover-{i}", tmp_path, "--metrics-address=") for i in range(2)
    ]
    try:
        for r in replicas:
            r.wait_ready()
        leader = wait_for(
            "a leader",
            lambda: next((r for r in replicas if '"became leader"' in r.log_text()), None),
            timeout=CONVERGE,
        )
        assert leader is not None
        cls = fleet.gpu_class()
        nodes = [fleet.node(4), fleet.node(4)]
        errors: list[BaseException] = []

        def create(i: int) -> None:
            try:
                create_claim(
                    pykube.HTTPClient(api.config), namespace, f"order-{i:02d}", cls, 1 + i % 2
                )
            except BaseException as exc:
                errors.append(exc)

        def wave(numbers: range) -> list[threading.Thread]:
            threads = [threading.Thread(target=create, args=(i,)) for i in numbers]
            for t in threads:
                t.start()
            return threads

        def bound_units() -> int:
            return sum(
                c.obj["spec"]["count"]
                for c in GPUClaim.objects(api, namespace=namespace)
                if (c.obj.get("status") or {}).get("phase") == "Bound"
            )

        first = wave(range(5))
        wait_for("the leader to bind some", bound_units, until=lambda n: n >= 1)
        leader.signal(sig)
        second = wave(range(5, 10))
        for t in first + second:
            t.join()
        assert errors == []
        code = leader.wait_exit(20)
        if sig == signal.SIGTERM:
            assert code == 0
            log = leader.log_text()
            assert '"released lease"' in log, log[-3000:]
            assert log.rindex('"controller stopped"') < log.index('"released lease"'), (
                "the Lease was released before the controllers stopped"
            )

        # 15 units ordered (five of 1, five of 2) on two 4-unit nodes: 8 fit at most. The
        # new leader binds until the oldest waiting claim fits nowhere; the units it waits
        # for on the node it nominates (fewest missing, ties by name) stay free for it, and
        # no younger claim that fits elsewhere is left waiting.
        def settled() -> bool:
            claims = sorted(
                GPUClaim.objects(api, namespace=namespace),
                key=lambda c: (c.obj["metadata"]["creationTimestamp"], c.name),
            )
            free = dict.fromkeys(nodes, 4)
            waiting = []
            for c in claims:
                status = c.obj.get("status") or {}
                if status.get("phase") == "Bound":
                    free[status["nodeName"]] -= c.obj["spec"]["count"]
                else:
                    waiting.append(c.obj["spec"]["count"])
            assert all(f >= 0 for f in free.values()), free
            if not waiting:
                return True
            head, rest = waiting[0], waiting[1:]
            if max(free.values()) >= head:
                return False  # the oldest fits: it is bound next
            nominated = min(nodes, key=lambda n: (head - free[n], n))
            elsewhere = max((f for n, f in free.items() if n != nominated), default=0)
            return all(count > elsewhere for count in rest)

        wait_for(
            "the new leader to bind what fits",
            settled,
            timeout=CONVERGE + 17,  # a killed leader's Lease expires first
        )
        assert 7 <= bound_units() <= 8
    finally:
        for r in replicas:
            r.stop()
        deployed.release_lease(api)


def test_a_usage_record_appears_on_bind_and_goes_with_the_claim(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    start_operator()
    cls = fleet.gpu_class()
    fleet.node(4)
    hold = create_claim(api, namespace, "hold", cls, 3)
    bound_node(api, namespace, "hold")
    record = wait_for(
        "the usage record",
        lambda: Workload.objects(api, namespace=namespace).get_or_none(name="gpuclaim-hold"),
        timeout=CONVERGE,
    )
    assert record.obj["status"] == {
        "kind": "GPUClaim",
        "type": "gpu",
        "operational": True,
        "resources": {names.quota_key(cls): 3},
    }
    owner = record.obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "GPUClaim",
        "hold",
        hold.obj["metadata"]["uid"],
        True,
    )
    hold.delete()
    wait_for(
        "the record to be garbage-collected",
        lambda: Workload.objects(api, namespace=namespace).get_or_none(name="gpuclaim-hold"),
        until=lambda r: r is None,
        timeout=CONVERGE,
    )


def test_a_claim_attached_to_a_live_vm_is_kept_until_the_vm_is_gone(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    start_operator()
    cls = fleet.gpu_class()
    fleet.node(4)
    hold = create_claim(api, namespace, "hold", cls, 1)
    bound_node(api, namespace, "hold")
    vmi = VirtualMachineInstance(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm-1", "namespace": namespace},
            "spec": {"domain": {"devices": {}}},
        },
    )
    vmi.create()
    hold.reload()
    hold.obj["status"]["attachment"] = {"vmi": "vm-1", "uid": vmi.obj["metadata"]["uid"]}
    replace(hold, subresource="status")
    wait_for(
        "the protection finalizer",
        lambda: (
            GPUClaim.objects(api, namespace=namespace)
            .get(name="hold")
            .obj["metadata"]
            .get("finalizers", [])
        ),
        until=lambda f: names.CLAIM_PROTECTION_FINALIZER in f,
        timeout=CONVERGE,
    )
    hold.delete()
    held = wait_for(
        "deletion held",
        lambda: pykube.Event.objects(api, namespace=namespace).filter(
            field_selector={"involvedObject.name": "hold", "reason": "DeletionHeld"}
        ),
        until=lambda evs: len(list(evs)) >= 1,
        timeout=CONVERGE,
    )
    assert "vm-1" in next(iter(held)).obj["message"]
    still = GPUClaim.objects(api, namespace=namespace).get(name="hold")
    assert still.obj["metadata"].get("deletionTimestamp")
    assert still.obj["status"]["phase"] == "Bound", "a held claim keeps its units"
    vmi.delete()
    wait_for(
        "the claim to go",
        lambda: GPUClaim.objects(api, namespace=namespace).get_or_none(name="hold"),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )


def test_an_order_is_protected_at_admission_and_its_first_write_by_the_operator_is_the_binding(
    api: pykube.HTTPClient, fleet: Fleet, namespace: str, start_operator: Start
) -> None:
    """The shipped MutatingAdmissionPolicy sets the claim-protection finalizer inside the
    create, so the operator never updates the claim itself on the way to Bound: its only
    write is the status (docs/design.md §2 GPUClaim: the finalizer is set at admission,
    "sparing a write per claim")."""
    start_operator()
    cls = fleet.gpu_class()
    fleet.node(4)
    created = create_claim(api, namespace, "protected", cls, 1)
    assert names.CLAIM_PROTECTION_FINALIZER in created.obj["metadata"].get("finalizers", [])
    bound_node(api, namespace, "protected")
    stored = GPUClaim.objects(api, namespace=namespace).get(name="protected").obj["metadata"]
    # An update of the claim itself (the finalizer added by a controller) would own
    # metadata.finalizers in managedFields; a mutation at admission owns nothing.
    owners = [e for e in stored.get("managedFields", []) if "f:metadata" in e.get("fieldsV1", {})]
    assert not owners, owners
    assert {e.get("subresource", "") for e in stored.get("managedFields", [])} == {"", "status"}
    assert stored["finalizers"] == [names.CLAIM_PROTECTION_FINALIZER]


def test_a_big_order_does_not_block_younger_small_orders_and_binds_once_its_node_frees(
    api: pykube.HTTPClient,
    fleet: Fleet,
    namespace: str,
    kubeconfig: Path,
    start_operator: Start,
) -> None:
    """Tenant A (``edit`` in her namespace) orders 4 units that fit only on the empty 4-unit
    node, where she already holds 1. Tenant B then orders ten single units: nine bind on the
    three 3-unit nodes — more than the eight bypasses that used to stop the class while
    units sat free — and none on the node A's order nominated; the tenth waits, told that
    the room left is kept for an older claim, without naming it. A releases her hold and the
    big order binds there."""
    start_operator()
    cls = fleet.gpu_class()
    a = edit_tenant(api, kubeconfig, namespace)
    big_node = fleet.node(4)
    create_claim(a.api, namespace, "hold", cls, 1)
    assert bound_node(api, namespace, "hold") == big_node
    small_nodes = {fleet.node(3) for _ in range(3)}
    create_claim(a.api, namespace, "big", cls, 4)
    nominated = wait_for(
        "the big order to nominate its node",
        lambda: bound_condition(claim_status(api, namespace, "big")),
        until=lambda c: c.get("reason") == "NoCapacity" and "more unit" in c.get("message", ""),
        timeout=CONVERGE,
    )
    assert f"waiting for 1 more unit on node {big_node}" in nominated["message"], nominated

    # Tenant B's namespace sorts after A's, so a tie in creation seconds still puts her
    # orders behind A's big one.
    other = f"u-{namespace}"[:63]
    labels = {"gpuoperator.test/e2e": "true"}
    pykube.Namespace(api, {"metadata": {"name": other, "labels": labels}}).create()
    try:
        b = edit_tenant(api, kubeconfig, other)
        for i in range(10):
            create_claim(b.api, other, f"small-{i}", cls, 1)

        def placed() -> dict[str, str]:
            return {
                c.name: (c.obj.get("status") or {}).get("nodeName", "")
                for c in GPUClaim.objects(api, namespace=other)
            }

        where = wait_for(
            "nine small orders bound",
            placed,
            until=lambda p: sum(1 for n in p.values() if n) == 9,
            timeout=CONVERGE,
        )
        assert set(where.values()) - {""} == small_nodes, where
        waiting = next(name for name, node in where.items() if not node)
        condition = wait_for(
            "the tenth to say why it waits",
            lambda: bound_condition(claim_status(api, other, waiting)),
            until=lambda c: c.get("reason") == "Queued",
            timeout=CONVERGE,
        )
        assert f"left only on node {big_node}, kept for an older claim" in condition["message"]
        assert namespace not in condition["message"] and "big" not in condition["message"]
        assert claim_status(api, namespace, "big").get("phase") == "Pending"

        GPUClaim.objects(a.api, namespace=namespace).get(name="hold").delete()
        assert bound_node(api, namespace, "big") == big_node
    finally:
        pykube.Namespace.objects(api).get(name=other).delete()
