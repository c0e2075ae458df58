"""Migration target pods (``model.migration_targets``, docs/design.md §5 "Live migration"):
which targets are gated, and the node a gated target is pinned to: the one every claim's
transient hold of the target's own migration names, never the source."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import migration_targets, references
from harness import objects

Obj = dict[str, Any]
MIG = "mig-1"
VGPU = objects.gpuclass("l40s", mode="vgpu", resource="nvidia.com/L40S-24Q")
DRA = objects.gpuclass("a10-dra", source={"dra": {"deviceClassName": "a10.example.com"}})


def target(uid: str = MIG) -> Obj:
    labels = {
        "kubevirt.io": "virt-launcher",
        "gpu.cozystack.io/claims": "true",
        "kubevirt.io/migrationJobUID": uid,
    }
    return {"metadata": {"name": "virt-launcher-vm1-tgt", "namespace": "t", "labels": labels}}


def claim(name: str, node: str = "n1", hold: Obj | None = None) -> Obj:
    status: Obj = {"phase": "Bound", "nodeName": node}
    if hold is not None:
        status["migration"] = hold
    return {"metadata": {"name": name, "namespace": "t"}, "status": status}


def held(node: str, uid: str = MIG) -> Obj:
    return {"uid": uid, "targetNode": node}


# -- which targets are gated ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "classes", "expected"),
    [
        pytest.param('[{"claim":"v"}]', {"l40s": VGPU}, True, id="vgpu-claim"),
        pytest.param('[{"claim":"d"}]', {"a10-dra": DRA}, False, id="dra-claim"),
        pytest.param(
            '[{"claimTemplate":{"className":"a10-dra","count":1}}]',
            {"a10-dra": DRA},
            False,
            id="dra-template",
        ),
        pytest.param(
            '[{"claim":"d"},{"claim":"v"}]', {"l40s": VGPU, "a10-dra": DRA}, True, id="mixed"
        ),
        pytest.param('[{"claim":"v"}]', {"l40s": None}, True, id="class-unknown"),
        pytest.param('[{"claim":"ghost"}]', {}, True, id="claim-unknown"),
    ],
)
def test_which_targets_are_gated(annotation: str, classes: Obj, expected: bool) -> None:
    refs = references.parse(annotation)
    claims = {
        "v": objects.claim("v", class_name="l40s"),
        "d": objects.claim("d", class_name="a10-dra"),
    }
    assert migration_targets.gated(refs, claims, classes) is expected


def test_a_target_without_references_is_not_gated() -> None:
    assert migration_targets.gated([], {}, {}) is False


# -- where a gated target goes ----------------------------------------------------------------


def test_a_target_goes_to_the_node_of_its_migrations_transient_holds() -> None:
    claims = [claim("a", hold=held("n2")), claim("b", hold=held("n2"))]
    assert migration_targets.target_node(target(), claims, "n1") == ("n2", "")


@pytest.mark.parametrize(
    ("claims", "words"),
    [
        pytest.param([claim("a"), claim("b", hold=held("n2"))], "claim a has no transient hold"),
        pytest.param(
            [claim("a", hold=held("n2", uid="mig-0"))],
            "transient hold is of migration mig-0, not of this target's migration mig-1",
        ),
        pytest.param(
            [claim("a", hold=held("n2")), claim("b", hold=held("n3"))],
            "different nodes (n2: a; n3: b)",
        ),
        pytest.param([claim("a", hold=held("n1"))], "never pinned to the source"),
        pytest.param(
            [claim("a", node="n3", hold=held("n3"))], "never pinned to the source", id="claims-node"
        ),
        pytest.param([], "no claim"),
    ],
)
def test_a_target_waits_until_every_claim_holds_one_other_node_for_it(
    claims: list[Obj], words: str
) -> None:
    node, why = migration_targets.target_node(target(), claims, "n1")
    assert node is None
    assert words in why


def test_a_target_without_a_migration_uid_waits() -> None:
    node, why = migration_targets.target_node(target(uid=""), [claim("a", hold=held("n2"))], "n1")
    assert node is None
    assert "kubevirt.io/migrationJobUID" in why
