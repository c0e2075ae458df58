"""The e2e over-allocation oracle does docs/design.md §5's arithmetic on its own: these cases
pin it down with figures worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from harness import ledger, objects

Obj = dict[str, Any]
R = "example.com/gpu"
CLASSES = {"a": {"spec": {"source": {"devicePlugin": {"resourceName": R}}}}}
OWNER = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "name": "vm",
    "uid": "u1",
    "controller": True,
}


def claim(
    count: int,
    *,
    attached: str = "",
    owned: bool = False,
    node: str = "n1",
    migration: tuple[str, str] | None = None,
) -> Obj:
    obj = objects.claim(
        "c",
        namespace="ns",
        class_name="a",
        count=count,
        phase="Bound",
        node=node,
        attached={"vmi": "vm", "uid": attached} if attached else None,
        owners=[OWNER] if owned else None,
    )
    if migration is not None:
        obj["status"]["migration"] = {"uid": migration[0], "targetNode": migration[1]}
    return obj


def pod(
    units: int, *, launcher: bool = False, labels: dict[str, str] | None = None, **spec: Any
) -> Obj:
    labels = dict(labels or {})
    if launcher:
        labels["kubevirt.io"] = "virt-launcher"
    return objects.pod(
        "p",
        namespace="ns",
        node_name="n1",
        limits={R: str(units)},
        labels=labels,
        owners=[OWNER] if launcher else None,
        **spec,
    )


@pytest.mark.parametrize(
    ("claims", "pods", "used"),
    [
        pytest.param(
            [claim(2)],
            [pod(2, labels={"gpu.cozystack.io/claims": "true"})],
            4,
            id="a-labelled-plain-pod-counts",
        ),
        pytest.param(
            [claim(2, attached="u1")],
            [pod(2, launcher=True)],
            2,
            id="a-launcher-is-accounted-by-its-vmis-held-claim",
        ),
        pytest.param(
            [claim(2, owned=True)],
            [pod(2, launcher=True)],
            2,
            id="a-launcher-is-accounted-by-its-vmis-template-claim",
        ),
        pytest.param(
            [claim(2, attached="u1")],
            [pod(3, launcher=True)],
            3,
            id="what-the-claims-do-not-hold-counts",
        ),
        pytest.param(
            [claim(2, attached="u1", node="n2")],
            [pod(2, launcher=True)],
            2,
            id="a-claim-elsewhere-accounts-nothing-here",
        ),
        pytest.param(
            [claim(2, attached="u1", node="n2")],
            [pod(2, launcher=True, labels={"kubevirt.io/migrationJobUID": "m"})],
            2,
            id="a-migration-target-without-a-transient-hold-counts",
        ),
        pytest.param(
            [claim(2, attached="u1", node="n2", migration=("m", "n1"))],
            [pod(2, launcher=True, labels={"kubevirt.io/migrationJobUID": "m"})],
            2,
            id="a-transient-hold-counts-and-accounts-its-target-pod",
        ),
        pytest.param(
            [claim(2, attached="u1", node="n2", migration=("other", "n1"))],
            [pod(2, launcher=True, labels={"kubevirt.io/migrationJobUID": "m"})],
            4,
            id="a-transient-hold-of-another-migration-accounts-nothing",
        ),
        pytest.param(
            [claim(2, attached="u1", node="n2", migration=("m", "n1"))],
            [pod(2, launcher=True)],
            4,
            id="a-transient-hold-accounts-no-pod-but-its-migrations-target",
        ),
        pytest.param(
            [claim(2, attached="u1")],
            [pod(2, launcher=True, labels={"kubevirt.io/migrationJobUID": "m"})],
            2,
            id="a-migrated-target-pod-is-accounted-by-the-claim-on-its-node",
        ),
        pytest.param(
            [],
            [pod(1, initContainers=[{"name": "i", "resources": {"requests": {R: "3"}}}])],
            3,
            id="an-init-container-peak",
        ),
        pytest.param(
            [],
            [
                pod(
                    1,
                    initContainers=[
                        {
                            "name": "s",
                            "restartPolicy": "Always",
                            "resources": {"requests": {R: "2"}},
                        }
                    ],
                )
            ],
            3,
            id="a-sidecar-adds",
        ),
        pytest.param([], [pod(1, overhead={R: "1"})], 2, id="overhead-adds"),
        pytest.param([], [{**pod(2), "status": {"phase": "Succeeded"}}], 0, id="finished-pods"),
    ],
)
def test_the_oracle_counts_holds_and_the_pods_no_claim_accounts_for(
    claims: list[Obj], pods: list[Obj], used: int
) -> None:
    figures = ledger.used_units(claims, CLASSES, pods)
    assert figures.get(("n1", R), 0) == used


@pytest.mark.parametrize(("quantity", "units"), [("2", 2), (3, 3), ("1k", 1000), ("2Ki", 2048)])
def test_quantities(quantity: Any, units: int) -> None:
    assert ledger.units(quantity) == units
