"""A pod's GPU use is counted as kube-scheduler counts it (docs/design.md §5 "Capacity"):
max(regular containers + sidecars, each init container's peak) + overhead; terminated pods
use nothing; only ownership (never a label) names the VMI whose claims may account a pod."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import pods, quantities
from harness import objects

Obj = dict[str, Any]
G = "nvidia.com/gpu"
H = "example.com/other"


def c(requests: dict[str, Any] | None = None, *, sidecar: bool = False) -> Obj:
    out: Obj = {"name": "c"}
    if requests is not None:
        out["resources"] = {"requests": requests}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(
    containers: list[Obj] | None = None,
    init: list[Obj] | None = None,
    overhead: dict[str, Any] | None = None,
    *,
    phase: str | None = "Running",
    labels: dict[str, str] | None = None,
) -> Obj:
    spec: Obj = {}
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = overhead
    return objects.pod(
        "p",
        namespace="ns",
        node_name="n1",
        containers=containers or [],
        phase=phase,
        labels=labels or None,
        **spec,
    )


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        pytest.param("2", 2, id="plain"),
        pytest.param("0", 0, id="zero"),
        pytest.param(3, 3, id="int"),
        pytest.param(0, 0, id="int-zero"),
        pytest.param("+4", 4, id="plus-sign"),
        pytest.param(" 2 ", 2, id="surrounding-space"),
        pytest.param("1k", 1000, id="decimal-suffix"),
        pytest.param("2Ki", 2048, id="binary-suffix"),
        pytest.param("2000m", 2, id="milli-whole"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1E3", 1000, id="exponent-upper"),
        pytest.param("2.0", 2, id="whole-decimal"),
        pytest.param("1.5", 0, id="fraction-invalid"),
        pytest.param("500m", 0, id="milli-fraction-invalid"),
        pytest.param("1e-1", 0, id="negative-exponent-fraction"),
        pytest.param("-1", 0, id="negative-invalid"),
        pytest.param(-1, 0, id="negative-int-invalid"),
        pytest.param("1e400", 0, id="huge-exponent-invalid"),
        pytest.param("10E", 0, id="exa-beyond-int64-invalid"),
        pytest.param(2**63, 0, id="int-beyond-int64-invalid"),
        pytest.param("two", 0, id="garbage"),
        pytest.param("", 0, id="empty"),
        pytest.param("2 Gi", 0, id="inner-space"),
        pytest.param(True, 0, id="bool"),
        pytest.param(None, 0, id="none"),
        pytest.param(2.0, 0, id="float-is-no-quantity"),
    ],
)
def test_parse_count(quantity: Any, expected: int) -> None:
    assert quantities.parse_count(quantity) == expected


@pytest.mark.parametrize(
    ("pod_", "expected"),
    [
        pytest.param(pod([c({G: "1"})]), {G: 1}, id="one-container"),
        pytest.param(pod([c({G: "1"}), c({G: "2"}), c()]), {G: 3}, id="containers-add"),
        pytest.param(pod([c({G: "1", H: "2"})]), {G: 1, H: 2}, id="several-resources"),
        pytest.param(pod([c({G: "0"})]), {}, id="zero-left-out"),
        pytest.param(pod([c({"cpu": "2", "memory": "1Gi"})]), {}, id="native-ignored"),
        pytest.param(pod([c({G: "1.5"})]), {}, id="fraction-counts-zero"),
        pytest.param(
            pod([c({G: "1"})], init=[c({G: "4"})]), {G: 4}, id="init-larger-than-containers"
        ),
        pytest.param(
            pod([c({G: "3"})], init=[c({G: "2"}), c({G: "1"})]),
            {G: 3},
            id="init-containers-run-one-at-a-time",
        ),
        pytest.param(
            pod([c({G: "1"})], init=[c({G: "2"}, sidecar=True)]),
            {G: 3},
            id="sidecar-adds-to-containers",
        ),
        pytest.param(
            pod([c({G: "1"})], init=[c({G: "2"}, sidecar=True), c({G: "2"})]),
            {G: 4},
            id="init-after-sidecar-runs-beside-it",
        ),
        pytest.param(
            pod([c({G: "1"})], init=[c({G: "2"}), c({G: "2"}, sidecar=True)]),
            {G: 3},
            id="init-before-sidecar-runs-alone",
        ),
        pytest.param(
            pod(
                [c({G: "1"})],
                init=[
                    c({G: "1"}, sidecar=True),
                    c({G: "5"}),
                    c({G: "2"}, sidecar=True),
                    c({G: "4"}),
                ],
            ),
            {G: 7},
            id="peak-is-max-of-each-init-plus-sidecars-before-it",
        ),
        pytest.param(
            pod(
                [c({G: "4"})],
                init=[c({G: "1"}, sidecar=True), c({G: "3"}), c({G: "1"}, sidecar=True)],
            ),
            {G: 6},
            id="steady-state-wins",
        ),
        pytest.param(
            pod([c({G: "1"})], init=[c({H: "2"})]),
            {G: 1, H: 2},
            id="max-is-per-resource",
        ),
        pytest.param(pod([c({G: "1"})], overhead={G: "1"}), {G: 2}, id="overhead-added"),
        pytest.param(
            pod([c({G: "1"})], init=[c({G: "3"})], overhead={G: "1", "cpu": "1"}),
            {G: 4},
            id="overhead-added-after-max",
        ),
        pytest.param(
            pod([{"name": "c", "resources": {"limits": {G: "2"}}}]),
            {G: 2},
            id="limit-only-is-request",
        ),
        pytest.param(
            pod([{"name": "c", "resources": {"limits": {G: "2"}, "requests": {G: "2"}}}]),
            {G: 2},
            id="limit-and-request-not-doubled",
        ),
        pytest.param({"metadata": {}}, {}, id="no-spec"),
    ],
)
def test_requests_follow_the_scheduler(pod_: Obj, expected: dict[str, int]) -> None:
    assert pods.requests(pod_) == expected
    assert pods.pod_usage(pod_) == expected


@pytest.mark.parametrize(
    ("phase", "terminated"),
    [
        pytest.param("Succeeded", True, id="succeeded"),
        pytest.param("Failed", True, id="failed"),
        pytest.param("Running", False, id="running"),
        pytest.param("Pending", False, id="pending"),
        pytest.param("Unknown", False, id="unknown"),
        pytest.param(None, False, id="no-phase"),
    ],
)
def test_terminated_pods_use_nothing(phase: str | None, terminated: bool) -> None:
    p = pod([c({G: "2"})], phase=phase)
    assert pods.is_terminated(p) is terminated
    assert pods.pod_usage(p) == ({} if terminated else {G: 2})
    assert pods.requests(p) == {G: 2}


VMI_OWNER = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "name": "vm",
    "uid": "u1",
    "controller": True,
}
LAUNCHER = {"kubevirt.io": "virt-launcher", "gpu.cozystack.io/claims": "true"}


@pytest.mark.parametrize(
    ("labels", "owners", "vmi"),
    [
        pytest.param(LAUNCHER, [VMI_OWNER], ("ns", "u1"), id="launcher-controlled-by-its-vmi"),
        pytest.param(
            {"kubevirt.io": "virt-launcher"}, [VMI_OWNER], ("ns", "u1"), id="claims-label-no-part"
        ),
        pytest.param({"gpu.cozystack.io/claims": "true"}, None, None, id="claims-label-alone"),
        pytest.param(LAUNCHER, None, None, id="launcher-label-without-owner"),
        pytest.param(
            {"gpu.cozystack.io/claims": "true"}, [VMI_OWNER], None, id="no-launcher-label"
        ),
        pytest.param(
            {**LAUNCHER, "kubevirt.io/migrationJobUID": "m-1"},
            [VMI_OWNER],
            ("ns", "u1"),
            id="a-migration-target-is-its-vmis-pod-too",
        ),
        pytest.param(
            LAUNCHER, [{**VMI_OWNER, "controller": False}], None, id="owner-not-controller"
        ),
        pytest.param(LAUNCHER, [{**VMI_OWNER, "kind": "ReplicaSet"}], None, id="owner-not-a-vmi"),
        pytest.param(
            LAUNCHER, [{**VMI_OWNER, "apiVersion": "example.com/v1"}], None, id="vmi-of-another-api"
        ),
        pytest.param(LAUNCHER, [{**VMI_OWNER, "uid": ""}], None, id="owner-without-uid"),
    ],
)
def test_only_a_launcher_pod_controlled_by_a_vmi_names_a_vmi_to_account_it(
    labels: dict[str, str], owners: list[Obj] | None, vmi: tuple[str, str] | None
) -> None:
    p = pod([c({G: "2"})], labels=labels)
    if owners is not None:
        p["metadata"]["ownerReferences"] = owners
    assert pods.launcher_vmi(p) == vmi


def test_a_pods_usage_does_not_depend_on_its_labels() -> None:
    plain = pod([c({G: "2"})])
    labelled = pod([c({G: "2"})], labels=LAUNCHER)
    labelled["metadata"]["ownerReferences"] = [VMI_OWNER]
    assert pods.pod_usage(plain) == pods.pod_usage(labelled) == {G: 2}


def test_a_pod_being_deleted_still_uses_its_units() -> None:
    p = pod([c({G: "2"})])
    p["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert pods.pod_usage(p) == {G: 2}


@pytest.mark.parametrize(
    ("pod_", "expected"),
    [
        pytest.param(pod(), "n1", id="bound"),
        pytest.param({"spec": {"containers": []}}, "", id="unscheduled"),
    ],
)
def test_node_name(pod_: Obj, expected: str) -> None:
    assert pods.node_name(pod_) == expected


# -- properties ----------------------------------------------------------------------------

containers_st = st.lists(
    st.builds(
        lambda g, h, sidecar: c({G: str(g), H: str(h)}, sidecar=sidecar),
        st.integers(0, 4),
        st.integers(0, 4),
        st.booleans(),
    ),
    max_size=4,
)


def timeline_peak(p: Obj, resource: str) -> int:
    """A reference written as a timeline: the units in use at every step of the pod's life
    (each init container running beside the sidecars already started, then the steady
    state), the largest of them, plus overhead."""
    spec = p["spec"]

    def units(container: Obj) -> int:
        return int(container.get("resources", {}).get("requests", {}).get(resource, "0"))

    steps: list[int] = []
    running_sidecars = 0
    for container in spec.get("initContainers", []):
        if container.get("restartPolicy") == "Always":
            running_sidecars += units(container)
            steps.append(running_sidecars)
        else:
            steps.append(running_sidecars + units(container))
    steps.append(running_sidecars + sum(units(x) for x in spec["containers"]))
    return max(steps) + int(spec.get("overhead", {}).get(resource, "0"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(lambda g: c({G: str(g)}), st.integers(0, 4)),
        max_size=3,
    ),
    containers_st,
    st.integers(0, 2),
)
def test_usage_is_the_peak_of_the_pods_timeline(
    containers: list[Obj], init: list[Obj], overhead: int
) -> None:
    p = pod(containers, init=init, overhead={G: str(overhead)})
    usage = pods.pod_usage(p)
    for resource in (G, H):
        assert usage.get(resource, 0) == timeline_peak(p, resource)


@pytest.mark.parametrize(
    ("labels", "job"),
    [
        pytest.param({**LAUNCHER, "kubevirt.io/migrationJobUID": "m-1"}, "m-1", id="target-pod"),
        pytest.param(LAUNCHER, "", id="launcher-pod"),
        pytest.param({}, "", id="no-labels"),
    ],
)
def test_a_migration_target_pod_names_its_migration(labels: dict[str, str], job: str) -> None:
    assert pods.migration_job(pod([c({G: "1"})], labels=labels)) == job
