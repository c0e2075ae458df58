"""The chaos suite's DRA checks (``chaos.allocations``, ``chaos.protobuf`` and the DRA part
of ``chaos.oracle``) on hand-made objects and hand-encoded values: each catches the broken
history or snapshot it is there to catch, and passes the sound one beside it."""

from __future__ import annotations

import datetime
from typing import Any

from chaos import allocations, oracle, protobuf, store
from chaos import history as historymod

from gpuoperator import names

Obj = dict[str, Any]
DRIVER = "gpu.example.com"
DC = "gpus.example.com"
RES = oracle.DRA_PREFIX + DC
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


# ---- a protobuf encoder of the test's own (the decoder under test is chaos.protobuf) ------


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, value: bytes | str | int | bool) -> bytes:
    if isinstance(value, bool | int):
        return _varint(number << 3) + _varint(int(value))
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _encoded_claim(*, deleting: bool, devices: list[tuple[str, str, str]], node: str) -> bytes:
    meta = (
        _field(1, "hold-a")
        + _field(3, "tenant")
        + _field(5, "uid-1")
        + _field(6, "42")  # resourceVersion: read past
        + _field(13, _field(1, "GPUClaim") + _field(3, "hold-a") + _field(4, "cu") + _field(6, 1))
    )
    if deleting:
        meta += _field(9, _field(1, 1_700_000_000))
    results = b"".join(
        _field(1, _field(1, "gpu") + _field(2, d) + _field(3, p) + _field(4, v) + _field(5, 0))
        for d, p, v in devices
    )
    requirement = _field(1, "metadata.name") + _field(2, "In") + _field(3, node)
    selector = _field(1, _field(2, requirement))
    allocation = _field(1, results) + _field(3, selector) + _field(5, _field(1, 1))
    status = _field(1, allocation) if devices else b""
    spec = _field(1, _field(1, _field(1, "gpu")))
    claim = _field(1, meta) + _field(2, spec) + _field(3, status)
    unknown = _field(1, _field(1, "resource.k8s.io/v1") + _field(2, "ResourceClaim")) + _field(
        2, claim
    )
    return b"k8s\x00" + unknown


def test_a_stored_resource_claim_is_read_from_its_protobuf_encoding() -> None:
    value = _encoded_claim(
        deleting=True, devices=[(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-3")], node="n1"
    )
    obj = protobuf.resource_claim(value)
    meta = obj["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"]) == ("hold-a", "tenant", "uid-1")
    assert "deletionTimestamp" in meta
    assert meta["ownerReferences"] == [
        {"kind": "GPUClaim", "name": "hold-a", "uid": "cu", "controller": True}
    ]
    assert allocations.devices_of(obj) == ((DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-3"))
    assert allocations.node_of(obj["status"]["allocation"]) == "n1"


def test_an_unallocated_claim_has_no_allocation_and_json_is_read_as_json() -> None:
    obj = protobuf.resource_claim(_encoded_claim(deleting=False, devices=[], node="n1"))
    assert obj["status"] == {} and "deletionTimestamp" not in obj["metadata"]
    bare = b"k8s\x00" + _field(2, _field(1, _field(1, "x")))
    assert protobuf.resource_claim(bare) == {
        "metadata": {"name": "x", "namespace": "", "uid": "", "ownerReferences": []},
        "status": {},
    }
    assert protobuf.resource_claim(b'{"metadata": {"name": "j"}}') == {"metadata": {"name": "j"}}


def test_a_truncated_value_is_refused_not_misread() -> None:
    value = _encoded_claim(deleting=False, devices=[(DRIVER, "n1", "gpu-0")], node="n1")
    for broken in (value[:-3], b"not k8s"):
        try:
            protobuf.resource_claim(broken)
        except ValueError:
            continue
        raise AssertionError(f"{broken[-8:]!r} was read")


# ---- the record: no device in two allocations at any revision ----------------------------


def rc(
    name: str,
    devices: list[str],
    node: str = "n1",
    *,
    admin: bool = False,
    owner_uid: str = "",
    hold: bool = True,
    ns: str = "t",
) -> Obj:
    meta: Obj = {"name": name, "namespace": ns, "uid": f"rc-{name}"}
    if owner_uid:
        meta["ownerReferences"] = [
            {"kind": "GPUClaim", "name": name, "uid": owner_uid, "controller": True}
        ]
    if hold:
        meta["labels"] = {names.DRA_HOLD_LABEL: "true"}
    status: Obj = {}
    if devices:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": d}
                    | ({"adminAccess": True} if admin else {})
                    for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    return {"metadata": meta, "status": status}


def _event(rev: int, key: str, obj: Obj | None) -> store.Event:
    return store.Event(rev, allocations.PREFIX + key, obj, float(rev))


def test_a_device_in_two_allocations_at_one_revision_is_flagged() -> None:
    record = historymod.ClaimHistory()
    record.on_events([_event(1, "t/a", rc("a", ["gpu-0"]))])
    record.on_events([_event(2, "t/b", rc("b", ["gpu-1"]))])
    assert record.allocations.twice == []
    record.on_events([_event(3, "u/c", rc("c", ["gpu-1", "gpu-2"], ns="u"))])
    assert record.allocations.twice == [f"revision 3: {DRIVER}/n1/gpu-1 allocated in t/b, u/c"]


def test_a_device_freed_then_taken_or_moved_in_one_revision_is_not_flagged() -> None:
    record = historymod.ClaimHistory()
    record.on_events([_event(1, "t/a", rc("a", ["gpu-0"]))])
    record.on_events([_event(2, "t/a", None)])  # collected with its claim
    record.on_events([_event(3, "t/b", rc("b", ["gpu-0"]))])
    # One revision: b deallocated and c allocated the same device (a transaction).
    record.on_events([_event(4, "t/b", rc("b", [])), _event(4, "t/c", rc("c", ["gpu-0"]))])
    # Admin access takes no device.
    record.on_events([_event(5, "t/d", rc("d", ["gpu-0"], admin=True))])
    assert record.allocations.twice == []
    assert record.allocations.held() == {(DRIVER, "n1", "gpu-0"): {"t/c"}}
    assert record.allocations.transitions("t/b") == ["3:rc-b@n1[gpu-0]", "4:rc-b@-[]"]


def test_the_record_routes_resource_claims_and_gpu_claims_and_decodes_both() -> None:
    assert historymod.ClaimHistory.wanted(allocations.PREFIX + "t/a")
    assert historymod.ClaimHistory.wanted(historymod.CLAIMS_PREFIX + "t/a")
    assert not historymod.ClaimHistory.wanted("/registry/pods/t/a")
    value = _encoded_claim(deleting=False, devices=[(DRIVER, "n1", "gpu-0")], node="n1")
    record = historymod.ClaimHistory()
    decoded = record.decode(allocations.PREFIX + "t/hold-a", value)
    assert allocations.devices_of(decoded) == ((DRIVER, "n1", "gpu-0"),)
    assert record.decode(allocations.PREFIX + "t/bad", value[:-3]) == {
        "metadata": {},
        "status": {},
    }
    assert record.allocations.unreadable[0].startswith(allocations.PREFIX + "t/bad: protobuf")
    record.on_events(
        [
            _event(7, "t/a", rc("a", ["gpu-0"])),
            _event(7, "t/b", rc("b", ["gpu-0"])),
            store.Event(7, historymod.CLAIMS_PREFIX + "t/a", None, 7.0),
        ]
    )
    assert len(record.allocations.twice) == 1
    assert list(record.versions) == ["t/a"]


# ---- snapshots -----------------------------------------------------------------------------


def node(name: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"allocatable": {}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def slice_of(node_name: str, n: int, generation: int = 1, tainted: tuple[int, ...] = ()) -> Obj:
    return {
        "metadata": {"name": f"{node_name}-slice-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}"}
                | ({"taints": [{"key": "k", "effect": "NoSchedule"}]} if i in tainted else {})
                for i in range(n)
            ],
        },
    }


def device_class(expression: str = f'device.driver == "{DRIVER}"') -> Obj:
    return {"metadata": {"name": DC}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def dra_class() -> Obj:
    return {"metadata": {"name": "d"}, "spec": {"source": {"dra": {"deviceClassName": DC}}}}


def claim(name: str, count: int, phase: str = "", node_name: str = "", **status: Any) -> Obj:
    st: Obj = {**status}
    if phase:
        st["phase"] = phase
        ok = "True" if phase == "Bound" else "False"
        st["conditions"] = [{"type": "Bound", "status": ok, "reason": "R", "message": "m"}]
    if node_name:
        st["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": "t",
            "uid": f"u-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"className": "d", "count": count},
        "status": st,
    }


def bound(name: str, node_name: str, devices: list[str]) -> tuple[Obj, Obj]:
    """A Bound DRA claim and its hold, as the contract has them."""
    named = [{"driver": DRIVER, "pool": node_name, "device": d} for d in devices]
    c = claim(name, len(devices), "Bound", node_name, devices=named, resourceClaimName=name)
    return c, rc(name, devices, node_name, owner_uid=f"u-{name}")


def snap(claims: list[Obj], held: list[Obj], slices: list[Obj] | None = None) -> oracle.Snapshot:
    return oracle.Snapshot(
        "1",
        claims,
        [],
        [node("n1"), node("n2")],
        [dra_class()],
        [],
        held,
        slices if slices is not None else [slice_of("n1", 4), slice_of("n2", 2)],
        [device_class()],
    )


def test_a_sound_dra_snapshot_passes_every_check() -> None:
    a, ha = bound("a", "n1", ["gpu-0", "gpu-1"])
    b, hb = bound("b", "n2", ["gpu-0"])
    s = snap([a, b], [ha, hb])
    assert oracle.overallocations(s) == []
    assert oracle.dra_mismatches(s) == []
    assert oracle.stuck_claims(s, NOW) == []
    assert oracle.capacity(s) == {("n1", RES): 4, ("n2", RES): 2}
    assert oracle.free_units(s) == {("n1", RES): 2, ("n2", RES): 1}


def test_a_device_in_two_allocations_or_named_twice_or_off_its_node_is_over_allocation() -> None:
    a, ha = bound("a", "n1", ["gpu-0"])
    pods_claim = rc("pod-claim", ["gpu-0"], hold=False)
    assert oracle.overallocations(snap([a], [ha, pods_claim])) == [
        f"{DRIVER}/n1/gpu-0 allocated in t/a, t/pod-claim"
    ]
    b, hb = bound("b", "n1", ["gpu-0"])
    assert f"{DRIVER}/n1/gpu-0 named by Bound claims t/a, t/b" in oracle.overallocations(
        snap([a, b], [ha, hb])
    )
    elsewhere = rc("x", ["gpu-1"], "n1", hold=False)
    elsewhere["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] = ["n2"]
    assert oracle.overallocations(snap([], [elsewhere])) == [
        f"t/x: {DRIVER}/n1/gpu-1 is on n1, allocated on n2"
    ]


def test_bound_dra_claims_beyond_a_nodes_devices_are_over_allocation_when_judged() -> None:
    claims = [claim(f"c{i}", 1, "Bound", "n2") for i in range(3)]  # n2 publishes 2
    assert oracle.overallocations(snap(claims, [])) == [f"n2 {RES}: 3 used of 2"]
    s = snap(claims, [])
    s.device_classes = [device_class('device.attributes["x"].model == "A10"')]
    assert oracle.overallocations(s) == []  # a selector the oracle does not read: not judged
    assert oracle.driver_of(device_class(f'device.driver == "{DRIVER}" && true')) == ""


def test_a_waiting_dra_claim_is_stuck_only_where_devices_are_free() -> None:
    waiting = claim("w", 2, "Pending")
    assert oracle.stuck_claims(snap([waiting], []), NOW) == [
        "t/w: fits on ['n1', 'n2'] and waits (R: m)"
    ]
    # A pod's ResourceClaim takes two of n1's, taints take the rest; n2 is gone.
    pods = rc("pod-claim", ["gpu-0", "gpu-1"], hold=False)
    slices = [slice_of("n1", 4, tainted=(2, 3))]
    assert oracle.stuck_claims(snap([waiting], [pods], slices), NOW) == []
    # Only the pool's newest generation counts.
    slices = [slice_of("n1", 1, generation=1), slice_of("n1", 4, generation=2)]
    assert oracle.free_units(snap([waiting], [], slices)) == {("n1", RES): 4}


def test_a_bound_dra_claim_whose_hold_disagrees_with_it_is_flagged() -> None:
    a, ha = bound("a", "n1", ["gpu-0", "gpu-1"])
    assert oracle.dra_mismatches(snap([a], [])) == [
        "t/a: Bound, its ResourceClaim t/a does not exist"
    ]
    other = rc("a", ["gpu-0", "gpu-1"], owner_uid="someone-else")
    assert oracle.dra_mismatches(snap([a], [other])) == [
        "t/a: Bound, its ResourceClaim t/a is not controlled by it"
    ]
    short = rc("a", ["gpu-0"], owner_uid="u-a")
    assert oracle.dra_mismatches(snap([a], [short])) == [
        f"t/a: count 2, names {[(DRIVER, 'n1', 'gpu-0'), (DRIVER, 'n1', 'gpu-1')]}, "
        f"allocated {[(DRIVER, 'n1', 'gpu-0')]}"
    ]
    moved = rc("a", ["gpu-0", "gpu-1"], "n2", owner_uid="u-a")
    assert "t/a: Bound on n1, allocated on n2" in oracle.dra_mismatches(snap([a], [moved]))
    assert ha["metadata"]["ownerReferences"][0]["uid"] == "u-a"


def test_a_waiting_claim_naming_devices_and_a_hold_without_its_claim_are_flagged() -> None:
    named = [{"driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    waiting = claim("w", 1, "Pending", devices=named)
    leaked = rc("gone", ["gpu-3"], owner_uid="u-gone")
    assert oracle.dra_mismatches(snap([waiting], [leaked])) == [
        f"t/w: Pending and names devices {[(DRIVER, 'n1', 'gpu-0')]}",
        "t/gone: a hold allocated with no Bound claim holding it",
    ]
    # A tenant's own ResourceClaim (no hold label) is hers, allocated or not.
    assert oracle.dra_mismatches(snap([], [rc("mine", ["gpu-3"], hold=False)])) == []


def test_the_record_counts_dra_holds_against_the_devices_registered_for_a_node() -> None:
    record = historymod.ClaimHistory()
    record.classes["d"] = RES
    record.capacity[("n2", RES)] = 2
    for rev, name in enumerate(["c0", "c1", "c2"], start=1):
        obj = claim(name, 1, "Bound", "n2")
        record.on_events([store.Event(rev, historymod.CLAIMS_PREFIX + f"t/{name}", obj, 0.0)])
    assert record.overholds == [f"revision 3: n2 {RES}: 3 units held of 2 (t/c0=1, t/c1=1, t/c2=1)"]
