"""The ledger's free units follow docs/design.md §5 "Capacity": allocatable minus bound claims'
holds minus other pods' use, clamped at 0 with the overrun reported; updates touch only the
nodes involved and say which; class figures sum over eligible nodes that serve the resource."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import capacity, eligibility
from gpuoperator.model import objects as model_objects
from harness import objects

Obj = dict[str, Any]
Key = tuple[str, str]
REPO = Path(__file__).resolve().parents[3]
A = "nvidia.com/a10"
B = "nvidia.com/l40s"
KVM = "devices.kubevirt.io/kvm"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(
    name: str = "n1",
    allocatable: dict[str, int] | None = None,
    capacity_: dict[str, int] | None = None,
    *,
    ready: bool = True,
    cordoned: bool = False,
    taints: list[Obj] | None = None,
) -> Obj:
    allocatable = allocatable or {}
    return objects.node(
        name,
        allocatable,
        capacity=capacity_ or allocatable,
        ready=ready,
        cordoned=cordoned,
        taints=taints or None,
    )


def vmi_owner(uid: str) -> Obj:
    return objects.owner(f"vm-{uid}", uid)


def pod(
    name: str,
    node_name: str | None,
    usage: dict[str, int],
    *,
    phase: str = "Running",
    labelled: bool = False,
    vmi: str | None = None,
    launcher_label: bool = True,
    migration: bool | str = False,
    namespace: str = "ns",
) -> Obj:
    """A pod; ``labelled`` sets the claims label (anyone can), ``vmi`` makes it a launcher pod
    controlled by the VMI of that UID (``launcher_label``: with KubeVirt's label),
    ``migration`` the target pod of that migration UID (``True``: ``m-1``)."""
    labels: dict[str, str] = {}
    if labelled:
        labels["gpu.cozystack.io/claims"] = "true"
    if vmi is not None and launcher_label:
        labels["kubevirt.io"] = "virt-launcher"
    if migration:
        labels["kubevirt.io/migrationJobUID"] = "m-1" if migration is True else migration
    return objects.pod(
        name,
        namespace=namespace,
        node_name=node_name or None,
        requests={k: str(v) for k, v in usage.items()},
        phase=phase,
        labels=labels or None,
        owners=None if vmi is None else [vmi_owner(vmi)],
    )


def claim(
    name: str,
    node_name: str | None,
    count: int,
    *,
    phase: str = "Bound",
    deleting: bool = False,
    namespace: str = "ns",
    attached: str | None = None,
    owned_by: str | None = None,
    migration: tuple[str, str] | None = None,
) -> Obj:
    """A claim; ``attached`` records an attachment to the VMI of that UID (``""``: not
    confirmed yet, no UID), ``owned_by`` makes it the template claim of that VMI,
    ``migration`` its transient hold ``(migration UID, target node)``."""
    obj = objects.claim(
        name,
        namespace=namespace,
        count=count,
        phase=phase,
        node=node_name or None,
        attached=None
        if attached is None
        else {"vmi": f"vm-{attached or 'x'}", "uid": attached or None},
        owners=None if owned_by is None else [vmi_owner(owned_by)],
        deleting=deleting,
    )
    if migration is not None:
        obj["status"]["migration"] = {"uid": migration[0], "targetNode": migration[1]}
    return obj


def gpu_class(name: str, resource: str, tolerations: list[Obj] | None = None) -> Obj:
    return objects.gpuclass(name, resource=resource, tolerations=tolerations or None)


# -- per-node figures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocatable", "holds", "uses", "free", "allocated", "overrun", "overcommitting"),
    [
        pytest.param(4, [], [], 4, 0, 0, [], id="empty-node"),
        pytest.param(4, [2], [], 2, 2, 0, [], id="claim-holds"),
        pytest.param(4, [], [1], 3, 1, 0, [], id="pod-uses"),
        pytest.param(4, [2, 1], [1], 0, 4, 0, [], id="exactly-full"),
        pytest.param(4, [3], [2], 0, 5, 1, [("ns", "p0")], id="pod-overruns-holds"),
        pytest.param(
            2, [2], [1, 1], 0, 4, 2, [("ns", "p0"), ("ns", "p1")], id="several-pods-named"
        ),
        pytest.param(0, [], [1], 0, 1, 1, [("ns", "p0")], id="no-allocatable"),
        pytest.param(2, [3], [], 0, 3, 1, [], id="holds-alone-overrun-name-no-pods"),
    ],
)
def test_free_is_allocatable_minus_holds_minus_pods_clamped(
    allocatable: int,
    holds: list[int],
    uses: list[int],
    free: int,
    allocated: int,
    overrun: int,
    overcommitting: list[Key],
) -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: allocatable}))
    for i, count in enumerate(holds):
        ledger.set_claim(claim(f"c{i}", "n1", count), A)
    for i, units in enumerate(uses):
        ledger.set_pod(pod(f"p{i}", "n1", {A: units}))
    assert ledger.free("n1", A) == free
    assert ledger.allocated("n1", A) == allocated
    assert ledger.overrun("n1", A) == overrun
    assert ledger.overcommitting_pods("n1", A) == overcommitting
    assert ledger.held("n1", A) == sum(holds)
    assert ledger.requested("n1", A) == sum(uses)


@pytest.mark.parametrize(
    ("obj", "counted"),
    [
        pytest.param(pod("p", "n1", {A: 1}), True, id="running-pod"),
        pytest.param(pod("p", "n1", {A: 1}, phase="Pending"), True, id="pending-bound-pod"),
        pytest.param(pod("p", "n1", {A: 1}, phase="Succeeded"), False, id="succeeded-pod"),
        pytest.param(pod("p", "n1", {A: 1}, phase="Failed"), False, id="failed-pod"),
        pytest.param(pod("p", None, {A: 1}, phase="Pending"), False, id="unscheduled-pod"),
        pytest.param(pod("p", "n1", {A: 1}, labelled=True), True, id="claims-label-covers-nothing"),
        pytest.param(pod("p", "n1", {A: 1}, vmi="u1"), True, id="launcher-without-claims"),
        pytest.param(pod("p", "n1", {B: 1}), False, id="other-resource"),
    ],
)
def test_which_pods_count(obj: Obj, counted: bool) -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 2}))
    ledger.set_pod(obj)
    assert ledger.free("n1", A) == (1 if counted else 2)


def test_a_plain_gpu_pod_with_the_claims_label_still_counts() -> None:
    """A tenant may set the claims label on any pod; it must not free the pod's units."""
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4}))
    ledger.set_claim(claim("hold", "n1", 2, attached="u1"), A)
    ledger.set_pod(pod("sneaky", "n1", {A: 2}, labelled=True))
    assert ledger.requested("n1", A) == 2
    assert ledger.free("n1", A) == 0
    ledger.set_pod(pod("sneaky", "n1", {A: 3}, labelled=True))
    assert ledger.overcommitting_pods("n1", A) == [("ns", "sneaky")]


@pytest.mark.parametrize(
    ("claims_", "pods_", "requested"),
    [
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            0,
            id="held-claim-covers-its-vmis-launcher",
        ),
        pytest.param(
            [claim("t", "n1", 2, owned_by="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            0,
            id="template-claim-covers-its-owners-launcher",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 3}, vmi="u1")],
            1,
            id="units-beyond-the-claims-count-like-any-pods",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u2")],
            2,
            id="another-vmis-claim-covers-nothing",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            2,
            id="a-claim-on-another-node-covers-nothing",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="")],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            2,
            id="an-unconfirmed-attachment-covers-nothing-yet",
        ),
        pytest.param(
            [claim("h", "n1", 2, phase="Pending", attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            2,
            id="an-unbound-claim-covers-nothing",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1", migration=True)],
            0,
            id="a-migrated-target-pod-is-covered-by-the-claim-now-on-its-node",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1", migration=True)],
            2,
            id="a-target-pod-without-a-transient-hold-is-an-ordinary-pod",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u1", migration="m-1")],
            0,
            id="the-transient-hold-covers-its-migrations-target-pod",
        ),
        pytest.param(
            [claim("t", "n2", 2, owned_by="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u1", migration="m-1")],
            0,
            id="a-template-claims-transient-hold-covers-too",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 3}, vmi="u1", migration="m-1")],
            1,
            id="target-units-beyond-the-transient-hold-like-any-pods",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-2", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u1", migration="m-1")],
            2,
            id="a-target-pod-of-another-migration-is-an-ordinary-pod",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u1")],
            2,
            id="a-transient-hold-covers-no-pod-but-its-migrations-targets",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u2", migration="m-1")],
            2,
            id="a-transient-hold-covers-no-other-vmis-target-pod",
        ),
        pytest.param(
            [claim("h", "n2", 2, attached="u1", migration=("m-1", "n3"))],
            [pod("l", "n1", {A: 2}, vmi="u1", migration="m-1")],
            2,
            id="a-target-pod-on-another-node-than-its-transient-hold",
        ),
        pytest.param(
            [claim("h", "n2", 2, phase="Pending", attached="u1", migration=("m-1", "n1"))],
            [pod("l", "n1", {A: 2}, vmi="u1", migration="m-1")],
            2,
            id="an-unbound-claims-transient-hold-holds-nothing",
        ),
        pytest.param(
            [
                claim("h", "n2", 2, attached="u1", migration=("m-1", "n1")),
                claim("g", "n1", 1, attached="u1"),
            ],
            [
                pod("l", "n1", {A: 1}, vmi="u1"),
                pod("t", "n1", {A: 3}, vmi="u1", migration="m-1"),
            ],
            1,
            id="a-claims-own-hold-covers-what-the-transient-hold-leaves-but-no-more",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1", launcher_label=False)],
            2,
            id="a-pod-without-the-launcher-label-is-ordinary",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1", namespace="other")],
            2,
            id="a-vmi-of-another-namespace-is-another-vmi",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2}, vmi="u1"), pod("twin", "n1", {A: 2}, vmi="u1")],
            2,
            id="two-pods-of-one-vmi-share-its-cover",
        ),
        pytest.param(
            [claim("h", "n1", 1, attached="u1"), claim("t", "n1", 2, owned_by="u1")],
            [pod("l", "n1", {A: 3}, vmi="u1")],
            0,
            id="the-vmis-claims-add-up",
        ),
        pytest.param(
            [claim("h", "n1", 2, attached="u1")],
            [pod("l", "n1", {A: 2, B: 1}, vmi="u1")],
            0,
            id="other-resources-are-counted-on-their-own",
        ),
    ],
)
def test_a_launcher_pod_is_covered_only_by_what_its_vmis_claims_hold_on_its_node(
    claims_: list[Obj], pods_: list[Obj], requested: int
) -> None:
    held = sum(
        c["spec"]["count"]
        * (
            (c["status"].get("nodeName") == "n1")
            + ((c["status"].get("migration") or {}).get("targetNode") == "n1")
        )
        for c in claims_
        if c["status"]["phase"] == "Bound"
    )
    other = sum(pod_units(p, B) for p in pods_)
    for claims_first in (True, False):
        ledger = capacity.Ledger()
        ledger.set_node(node("n1", {A: 8, B: 8}))
        if claims_first:
            for c in claims_:
                ledger.set_claim(c, A)
        for p in pods_:
            ledger.set_pod(p)
        if not claims_first:
            for c in claims_:
                ledger.set_claim(c, A)
        assert ledger.requested("n1", A) == requested
        assert ledger.allocated("n1", A) == held + requested
        assert ledger.requested("n1", B) == other


def test_confirming_an_attachment_stops_counting_the_launcher_pod_twice() -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4}))
    ledger.set_pod(pod("l", "n1", {A: 2}, vmi="u1"))
    ledger.set_claim(claim("h", "n1", 2, attached=""), A)
    assert ledger.free("n1", A) == 0
    assert ledger.set_claim(claim("h", "n1", 2, attached="u1"), A) == {"n1"}
    assert ledger.free("n1", A) == 2
    assert ledger.overcommitting_pods("n1", A) == []
    assert ledger.remove_claim(("ns", "h")) == {"n1"}
    assert ledger.requested("n1", A) == 2


@pytest.mark.parametrize(
    ("obj", "resource", "held"),
    [
        pytest.param(claim("c", "n1", 2), A, True, id="bound"),
        pytest.param(claim("c", "n1", 2, deleting=True), A, True, id="bound-being-deleted"),
        pytest.param(claim("c", None, 2, phase="Pending"), A, False, id="pending"),
        pytest.param(claim("c", "n1", 2, phase="Lost"), A, False, id="lost"),
        pytest.param(claim("c", None, 2), A, False, id="bound-without-node"),
        pytest.param(claim("c", "n1", 2), None, False, id="class-unknown"),
        pytest.param(claim("c", "n1", 2), "", False, id="class-without-resource"),
        pytest.param(claim("c", "n1", 2), B, False, id="other-resource"),
    ],
)
def test_which_claims_hold(obj: Obj, resource: str | None, held: bool) -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 3}))
    ledger.set_claim(obj, resource)
    assert ledger.free("n1", A) == (1 if held else 3)


def test_unknown_node_has_nothing_free() -> None:
    ledger = capacity.Ledger()
    assert ledger.free("nope", A) == 0
    assert ledger.allocatable("nope", A) == 0
    assert ledger.devices("nope") == []
    assert ledger.node_names() == []


def test_holds_outlive_their_nodes_object_and_come_back_with_it() -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4}))
    ledger.set_claim(claim("c", "n1", 1), A)
    ledger.set_pod(pod("p", "n1", {A: 1}))
    assert ledger.remove_node("n1") == {"n1"}
    assert ledger.node_names() == []
    assert ledger.free("n1", A) == 0
    assert ledger.allocated("n1", A) == 2
    ledger.set_node(node("n1", {A: 4}))
    assert ledger.free("n1", A) == 2
    assert ledger.node_names() == ["n1"]


def test_a_released_hold_is_counted_beside_the_claims_current_hold_until_dropped() -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4}))
    ledger.set_node(node("n2", {A: 4}))
    stored = claim("c", "n1", 2)
    # A move to n2 not confirmed yet: the stored hold on n1 stays counted beside it.
    assert ledger.set_claim(claim("c", "n2", 2), A) == {"n2"}
    assert ledger.keep_released(stored, A) == {"n1"}
    assert ledger.keep_released(stored, A) == set()
    assert (ledger.free("n1", A), ledger.free("n2", A)) == (2, 2)
    assert ledger.claim_keys() == frozenset({("ns", "c")})
    # Confirmed: only the new hold counts.
    assert ledger.drop_released(("ns", "c")) == {"n1"}
    assert ledger.drop_released(("ns", "c")) == set()
    assert (ledger.free("n1", A), ledger.free("n2", A)) == (4, 2)
    # A claim deleted while its release is unconfirmed holds nothing anywhere.
    ledger.keep_released(stored, A)
    assert ledger.remove_claim(("ns", "c")) == {"n1", "n2"}
    assert (ledger.free("n1", A), ledger.free("n2", A)) == (4, 4)


def test_devices_are_the_gpunode_status_entries() -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4, KVM: 1000, B: 0}, {A: 5, KVM: 1000}))
    ledger.set_claim(claim("c", "n1", 3), A)
    ledger.set_pod(pod("p", "n1", {A: 2}))
    ledger.set_claim(claim("d", "n1", 1), "vendor.io/absent")
    assert ledger.devices("n1") == [
        {"resourceName": KVM, "capacity": 1000, "allocatable": 1000, "allocated": 0, "free": 1000},
        {"resourceName": A, "capacity": 5, "allocatable": 4, "allocated": 5, "free": 0},
        {
            "resourceName": "vendor.io/absent",
            "capacity": 0,
            "allocatable": 0,
            "allocated": 1,
            "free": 0,
        },
    ]
    assert ledger.devices("n1", [A, B]) == [
        {"resourceName": A, "capacity": 5, "allocatable": 4, "allocated": 5, "free": 0},
    ]
    assert ledger.capacity("n1", A) == 5


# -- incremental updates report the nodes they touch ---------------------------------------


def test_each_update_reports_exactly_the_nodes_it_changed() -> None:
    ledger = capacity.Ledger()
    assert ledger.set_node(node("n1", {A: 4})) == {"n1"}
    assert ledger.set_node(node("n1", {A: 4})) == set()
    assert ledger.set_node(node("n1", {A: 4}, taints=[GPU_TAINT])) == set()
    assert ledger.set_node(node("n1", {A: 3})) == {"n1"}
    assert ledger.set_node(node("n2", {A: 4})) == {"n2"}

    assert ledger.set_pod(pod("p", "n1", {A: 1})) == {"n1"}
    assert ledger.set_pod(pod("p", "n1", {A: 1})) == set()
    assert ledger.set_pod(pod("p", "n1", {A: 2})) == {"n1"}
    assert ledger.set_pod(pod("p", "n2", {A: 2})) == {"n1", "n2"}
    assert ledger.set_pod(pod("p", "n2", {A: 2}, phase="Succeeded")) == {"n2"}
    assert ledger.set_pod(pod("p", "n2", {A: 2}, phase="Succeeded")) == set()
    assert ledger.set_pod(pod("q", "n1", {})) == set()
    assert ledger.remove_pod(("ns", "q")) == set()
    assert ledger.set_pod(pod("r", "n1", {A: 1})) == {"n1"}
    assert ledger.remove_pod(("ns", "r")) == {"n1"}
    assert ledger.pod_keys() == frozenset()

    assert ledger.set_claim(claim("c", None, 2, phase="Pending"), A) == set()
    assert ledger.set_claim(claim("c", "n1", 2), A) == {"n1"}
    assert ledger.set_claim(claim("c", "n1", 2, deleting=True), A) == set()
    assert ledger.set_claim(claim("c", "n1", 2, phase="Lost"), A) == {"n1"}
    assert ledger.set_claim(claim("c", "n2", 2), A) == {"n2"}
    assert ledger.set_claim(claim("c", "n1", 2), A) == {"n1", "n2"}
    assert ledger.claim_keys() == frozenset({("ns", "c")})
    assert ledger.remove_claim(("ns", "c")) == {"n1"}
    assert ledger.remove_claim(("ns", "c")) == set()

    assert ledger.remove_node("n2") == {"n2"}
    assert ledger.remove_node("n2") == set()
    assert ledger.remove_node("never") == set()


def test_keys_are_namespaced() -> None:
    ledger = capacity.Ledger()
    ledger.set_node(node("n1", {A: 4}))
    ledger.set_pod(pod("p", "n1", {A: 1}, namespace="a"))
    ledger.set_pod(pod("p", "n1", {A: 1}, namespace="b"))
    assert ledger.free("n1", A) == 2
    ledger.remove_pod(("a", "p"))
    assert ledger.free("n1", A) == 3


# -- class and node figures ----------------------------------------------------------------


def cluster() -> tuple[capacity.Ledger, list[Obj]]:
    nodes = [
        node("big", {A: 8}, taints=[GPU_TAINT]),
        node("small", {A: 2}, taints=[GPU_TAINT]),
        node("plain", {A: 3}),
        node("down", {A: 8}, ready=False),
        node("cordoned", {A: 8}, cordoned=True),
        node("full", {A: 1}),
        node("other", {B: 4}),
        node("zero", {A: 0}),
    ]
    ledger = capacity.Ledger()
    for n in nodes:
        ledger.set_node(n)
    ledger.set_claim(claim("c1", "big", 3), A)
    ledger.set_pod(pod("p1", "small", {A: 1}))
    ledger.set_pod(pod("p2", "full", {A: 2}))
    return ledger, nodes


TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(
            gpu_class("a10", A, TOLERATE_GPU),
            capacity.ClassFigures(free=5 + 1 + 3, max_free_per_node=5, nodes=4),
            id="tolerating-class-sees-gpu-nodes",
        ),
        pytest.param(
            gpu_class("a10-plain", A),
            capacity.ClassFigures(free=3, max_free_per_node=3, nodes=2),
            id="untolerating-class-sees-untainted-only",
        ),
        pytest.param(
            gpu_class("l40s", B, TOLERATE_GPU),
            capacity.ClassFigures(free=4, max_free_per_node=4, nodes=1),
            id="other-resource",
        ),
        pytest.param(
            gpu_class("ghost", "vendor.io/none"),
            capacity.ClassFigures(free=0, max_free_per_node=0, nodes=0),
            id="resource-nowhere",
        ),
        pytest.param(
            {"metadata": {"name": "dra"}, "spec": {"source": {"dra": {}}}},
            capacity.ClassFigures(free=0, max_free_per_node=0, nodes=0),
            id="no-device-plugin",
        ),
    ],
)
def test_class_figures(cls: Obj, expected: capacity.ClassFigures) -> None:
    ledger, nodes = cluster()
    figures = capacity.class_figures(ledger, cls, nodes)
    assert figures == expected
    assert figures.available is (expected.nodes > 0)


def test_an_overrun_eligible_node_counts_as_available_with_zero_free() -> None:
    ledger, nodes = cluster()
    figures = capacity.class_figures(ledger, gpu_class("a10-plain", A), nodes)
    assert ledger.overrun("full", A) == 1
    assert figures.nodes == 2
    assert figures.free == 3


@pytest.mark.parametrize(
    ("node_name", "expected"),
    [
        pytest.param("big", [{"name": "a10", "free": 5}], id="tainted"),
        pytest.param(
            "plain", [{"name": "a10", "free": 3}, {"name": "a10-plain", "free": 3}], id="sorted"
        ),
        pytest.param("down", [], id="not-ready"),
        pytest.param("cordoned", [], id="cordoned"),
        pytest.param("other", [{"name": "l40s", "free": 4}], id="other-resource"),
        pytest.param("zero", [], id="zero-allocatable"),
    ],
)
def test_node_class_free(node_name: str, expected: list[capacity.ClassFree]) -> None:
    ledger, nodes = cluster()
    classes = [
        gpu_class("a10-plain", A),
        gpu_class("l40s", B, TOLERATE_GPU),
        gpu_class("a10", A, TOLERATE_GPU),
    ]
    [the_node] = [n for n in nodes if n["metadata"]["name"] == node_name]
    assert capacity.node_class_free(ledger, the_node, classes) == expected


# -- properties ----------------------------------------------------------------------------

NODES = ["n1", "n2", "n3"]
RESOURCES = [A, B]
POD_KEYS = ["p1", "p2", "p3", "p4"]
CLAIM_KEYS = ["c1", "c2", "c3"]

usage_st = st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 3), max_size=2)
nodes_st = st.builds(
    lambda name, alloc, extra, ready, cordoned, tainted: node(
        name,
        alloc,
        {r: n + extra for r, n in alloc.items()},
        ready=ready,
        cordoned=cordoned,
        taints=[GPU_TAINT] if tainted else None,
    ),
    st.sampled_from(NODES),
    st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 6), max_size=2),
    st.integers(0, 1),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
VMI_UIDS = [None, "u1", "u2"]
pods_st = st.builds(
    lambda name, node_name, usage, phase, labelled, vmi, migration: pod(
        name, node_name, usage, phase=phase, labelled=labelled, vmi=vmi, migration=migration
    ),
    st.sampled_from(POD_KEYS),
    st.sampled_from([*NODES, None]),
    usage_st,
    st.sampled_from(["Running", "Pending", "Succeeded"]),
    st.booleans(),
    st.sampled_from(VMI_UIDS),
    st.sampled_from([False, "m-1", "m-2"]),
)
claims_st = st.tuples(
    st.builds(
        lambda name, node_name, count, phase, deleting, vmi, how, migration: claim(
            name,
            node_name,
            count,
            phase=phase,
            deleting=deleting,
            attached=(vmi if how == "attached" else "") if how != "owned" and vmi else None,
            owned_by=vmi if how == "owned" else None,
            migration=migration,
        ),
        st.sampled_from(CLAIM_KEYS),
        st.sampled_from([*NODES, None]),
        st.integers(1, 4),
        st.sampled_from(["Bound", "Pending", "Lost"]),
        st.booleans(),
        st.sampled_from(VMI_UIDS),
        st.sampled_from(["attached", "unconfirmed", "owned"]),
        st.sampled_from([None, ("m-1", "n1"), ("m-1", "n2"), ("m-2", "n3")]),
    ),
    st.sampled_from([*RESOURCES, None]),
)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("set_node"), nodes_st),
        st.tuples(st.just("remove_node"), st.sampled_from(NODES)),
        st.tuples(st.just("set_pod"), pods_st),
        st.tuples(st.just("remove_pod"), st.sampled_from(POD_KEYS)),
        st.tuples(st.just("set_claim"), claims_st),
        st.tuples(st.just("remove_claim"), st.sampled_from(CLAIM_KEYS)),
    ),
    max_size=30,
)


def pod_units(p: Obj, resource: str) -> int:
    """What a test pod (one container, requests only) uses, read directly: its request,
    nothing once it has terminated."""
    if p["status"].get("phase") in ("Succeeded", "Failed"):
        return 0
    return int(p["spec"]["containers"][0].get("resources", {}).get("requests", {}).get(resource, 0))


def pod_vmi_uid(p: Obj) -> str:
    """The VMI UID a pod's units may be covered by, read the test's own way: a pod with
    KubeVirt's launcher label (a migration target's too) and a controller reference to a
    VMI."""
    labels = p["metadata"].get("labels", {})
    if labels.get("kubevirt.io") != "virt-launcher":
        return ""
    owners = [o["uid"] for o in p["metadata"].get("ownerReferences", []) if o["controller"]]
    return owners[0] if owners else ""


def pod_job(p: Obj) -> str:
    """The migration a pod is the target of, read the test's own way."""
    return str(p["metadata"].get("labels", {}).get("kubevirt.io/migrationJobUID", ""))


def claim_user_uid(c: Obj) -> str:
    """The VMI UID a claim covers: its owner's, else its confirmed attachment's."""
    owners = [o["uid"] for o in c["metadata"].get("ownerReferences", []) if o["controller"]]
    if owners:
        return str(owners[0])
    return str((c["status"].get("attachment") or {}).get("uid") or "")


class Reference:
    """The figures recomputed from scratch from the current objects, the naive way."""

    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[Key, Obj] = {}
        self.claims: dict[Key, tuple[Obj, str | None]] = {}

    def apply(self, ledger: capacity.Ledger, op: str, arg: Any) -> set[str]:
        if op == "set_node":
            self.nodes[arg["metadata"]["name"]] = arg
            return ledger.set_node(arg)
        if op == "remove_node":
            self.nodes.pop(arg, None)
            return ledger.remove_node(arg)
        if op == "set_pod":
            self.pods[("ns", arg["metadata"]["name"])] = arg
            return ledger.set_pod(arg)
        if op == "remove_pod":
            self.pods.pop(("ns", arg), None)
            return ledger.remove_pod(("ns", arg))
        if op == "set_claim":
            obj, resource = arg
            self.claims[("ns", obj["metadata"]["name"])] = (obj, resource)
            return ledger.set_claim(obj, resource)
        assert op == "remove_claim"
        self.claims.pop(("ns", arg), None)
        return ledger.remove_claim(("ns", arg))

    def figures(self, node_name: str, resource: str) -> tuple[int, int, int, int, list[Key]]:
        """(capacity, allocatable, held, requested, pods using it) on the node."""
        status = self.nodes.get(node_name, {}).get("status", {})
        cap = int(status.get("capacity", {}).get(resource, 0))
        alloc = int(status.get("allocatable", {}).get(resource, 0))
        bound = [
            obj
            for obj, res in self.claims.values()
            if res == resource and obj["status"].get("phase") == "Bound"
        ]
        here = [obj for obj in bound if obj["status"].get("nodeName") == node_name]
        #: (migration UID, claim) of each transient hold whose target is this node
        targeting = [
            (obj["status"]["migration"]["uid"], obj)
            for obj in bound
            if obj["status"].get("nodeName")
            and (obj["status"].get("migration") or {}).get("targetNode") == node_name
        ]
        held = sum(obj["spec"]["count"] for obj in here) + sum(
            obj["spec"]["count"] for _, obj in targeting
        )
        using = {
            key: (pod_vmi_uid(p), pod_job(p), pod_units(p, resource))
            for key, p in self.pods.items()
            if p["spec"].get("nodeName") == node_name and pod_units(p, resource)
        }
        excess: dict[str, int] = {}
        for uid in {uid for uid, _, _ in using.values() if uid}:
            # What the VMI's holds on this node can cover of its pods there: its claims' own
            # holds any of them, a transient hold only its migration's target pods.
            own = sum(obj["spec"]["count"] for obj in here if claim_user_uid(obj) == uid)
            per_job: dict[str, int] = {}
            for job, obj in targeting:
                if claim_user_uid(obj) == uid:
                    per_job[job] = per_job.get(job, 0) + obj["spec"]["count"]
            total = sum(u for v, _, u in using.values() if v == uid)
            transient = sum(
                min(
                    per_job.get(job, 0),
                    sum(u for v, j, u in using.values() if v == uid and j == job),
                )
                for job in {j for v, j, _ in using.values() if v == uid and j}
            )
            excess[uid] = total - min(total, own + transient)
        requested = sum(u for uid, _, u in using.values() if not uid) + sum(excess.values())
        users = sorted(key for key, (uid, _, _) in using.items() if not uid or excess[uid])
        return cap, alloc, held, requested, users

    def snapshot(self) -> dict[str, Any]:
        return {n: (n in self.nodes, [self.figures(n, r) for r in RESOURCES]) for n in NODES}


def assert_matches(ledger: capacity.Ledger, ref: Reference) -> None:
    assert ledger.node_names() == sorted(ref.nodes)
    for n in NODES:
        expected_devices: list[capacity.Device] = []
        for r in RESOURCES:
            cap, alloc, held, requested, users = ref.figures(n, r)
            assert ledger.capacity(n, r) == cap
            assert ledger.allocatable(n, r) == alloc
            assert ledger.held(n, r) == held
            assert ledger.requested(n, r) == requested
            assert ledger.allocated(n, r) == held + requested
            assert ledger.free(n, r) == max(0, alloc - held - requested)
            assert ledger.overrun(n, r) == max(0, held + requested - alloc)
            assert ledger.overcommitting_pods(n, r) == (users if held + requested > alloc else [])
            if cap or alloc or held or requested:
                expected_devices.append(
                    capacity.Device(
                        resourceName=r,
                        capacity=cap,
                        allocatable=alloc,
                        allocated=held + requested,
                        free=max(0, alloc - held - requested),
                    )
                )
        assert ledger.devices(n) == sorted(expected_devices, key=lambda d: d["resourceName"])


@settings(max_examples=200, deadline=None)
@given(ops_st)
def test_incremental_figures_equal_a_recomputation_and_report_every_touched_node(
    ops: list[tuple[str, Any]],
) -> None:
    ledger = capacity.Ledger()
    ref = Reference()
    for op, arg in ops:
        before = ref.snapshot()
        changed = ref.apply(ledger, op, arg)
        after = ref.snapshot()
        assert changed == {n for n in NODES if before[n] != after[n]}, op
        assert_matches(ledger, ref)


@settings(max_examples=150, deadline=None)
@given(
    ops_st,
    st.sampled_from(NODES),
    st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 3), min_size=1),
)
def test_adding_a_gpu_pod_never_increases_free(
    ops: list[tuple[str, Any]], node_name: str, usage: dict[str, int]
) -> None:
    ledger = capacity.Ledger()
    ref = Reference()
    for op, arg in ops:
        ref.apply(ledger, op, arg)
    before = {(n, r): ledger.free(n, r) for n in NODES for r in RESOURCES}
    ledger.set_pod(pod("new-gpu-pod", node_name, usage))
    for (n, r), free in before.items():
        assert ledger.free(n, r) <= free
    for r, units in usage.items():
        assert ledger.allocated(node_name, r) >= units


@settings(max_examples=150, deadline=None)
@given(ops_st, st.sampled_from(RESOURCES), st.booleans())
def test_class_free_is_the_sum_of_free_over_its_eligible_nodes(
    ops: list[tuple[str, Any]], resource: str, tolerates: bool
) -> None:
    ledger = capacity.Ledger()
    ref = Reference()
    for op, arg in ops:
        ref.apply(ledger, op, arg)
    cls = gpu_class("k", resource, TOLERATE_GPU if tolerates else None)
    nodes = list(ref.nodes.values())
    eligible = [
        n["metadata"]["name"]
        for n in nodes
        if eligibility.is_eligible(n, cls) and ledger.allocatable(n["metadata"]["name"], resource)
    ]
    frees = [ledger.free(n, resource) for n in eligible]
    figures = capacity.class_figures(ledger, cls, nodes)
    assert figures.free == sum(frees)
    assert figures.max_free_per_node == max(frees, default=0)
    assert figures.nodes == len(eligible)
    per_node = [e for n in nodes for e in capacity.node_class_free(ledger, n, [cls])]
    assert sum(e["free"] for e in per_node) == figures.free
    assert len(per_node) == figures.nodes


@settings(max_examples=150, deadline=None)
@given(
    st.lists(nodes_st, max_size=4),
    st.lists(pods_st, max_size=6),
    st.lists(claims_st, max_size=4),
)
def test_removing_everything_added_returns_to_the_start(
    nodes: list[Obj], added_pods: list[Obj], added_claims: list[tuple[Obj, str | None]]
) -> None:
    ledger = capacity.Ledger()
    for node_obj in nodes:
        ledger.set_node(node_obj)
    start = {n: ledger.devices(n) for n in NODES}
    for p in added_pods:
        ledger.set_pod(p)
    for c, resource in added_claims:
        ledger.set_claim(c, resource)
    for p in added_pods:
        ledger.remove_pod(model_objects.key(p))
    for c, _ in added_claims:
        ledger.remove_claim(model_objects.key(c))
    assert {n: ledger.devices(n) for n in NODES} == start
    for n in NODES:
        for r in RESOURCES:
            assert ledger.free(n, r) == ledger.allocatable(n, r)
            assert ledger.allocated(n, r) == 0
    assert ledger.pod_keys() == frozenset()
    assert ledger.claim_keys() == frozenset()
    for n in NODES:
        ledger.remove_node(n)
    assert ledger.node_names() == []
    assert all(ledger.devices(n) == [] for n in NODES)


def test_node_class_free_fits_the_gpunode_schema_however_many_classes_serve_the_node() -> None:
    crd = yaml.safe_load((REPO / "config" / "crd" / "cozystack.io_gpunodes.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"]["properties"]["classes"]["maxItems"] == (
        capacity.MAX_NODE_CLASSES
    )
    ledger = capacity.Ledger()
    the_node = node("n1", {A: 4})
    ledger.set_node(the_node)
    many = [gpu_class(f"c-{i:05d}", A) for i in range(capacity.MAX_NODE_CLASSES + 5)]
    entries = capacity.node_class_free(ledger, the_node, reversed(many))
    assert len(entries) == capacity.MAX_NODE_CLASSES
    assert entries[0]["name"] == "c-00000"
    assert entries[-1]["name"] == f"c-{capacity.MAX_NODE_CLASSES - 1:05d}"
