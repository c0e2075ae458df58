"""Usage records over the fake API server and the product's caches, wired by its own
``register``: a Bound claim gets one Workload ``gpuclaim-<claim>`` owned by it, with its
class's devices key and count; nothing more while it is up to date, rewritten when the count
changes; removed (uid precondition) once the claim is not Bound or gone; a record of another
claim of the same name is left for garbage collection; a name taken behind the cache is
looked at again."""

from __future__ import annotations

import pytest
import structlog

from controllers import usage_records
from gpuoperator import names
from gpuoperator.kinds import Workload
from gpuoperator.runtime import errors
from gpuoperator.runtime.controlling import Result
from harness import objects
from harness.objects import NS
from harness.offline import OfflineCluster

Obj = objects.Obj
RECORD = "gpuclaim-hold"


class World(OfflineCluster):
    def __init__(self) -> None:
        super().__init__()
        usage_records.register(self.manager, self.caches)
        self.reconciler = self.manager.reconcilers[usage_records.NAME]

    def reconcile(self, name: str = "hold") -> Result | None:
        return self.reconciler.reconcile((NS, name))

    def record(self) -> Obj | None:
        return self.api.stored(Workload, RECORD, NS)

    def verbs(self) -> list[str]:
        return [verb for verb, _, _, _ in self.api.writes()]


@pytest.fixture
def world() -> World:
    return World()


def record_of(claim_uid: str, count: int = 2) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.WORKLOAD,
        "metadata": {
            "name": RECORD,
            "namespace": NS,
            "ownerReferences": [objects.owner("hold", claim_uid, kind=names.GPU_CLAIM)],
        },
        "status": {
            "kind": names.GPU_CLAIM,
            "type": "gpu",
            "resources": {"a10.gpuclass.cozystack.io/devices": count},
            "operational": True,
        },
    }


def test_a_bound_claim_gets_one_record_owned_by_it(world: World) -> None:
    world.put(world.caches.claims, objects.claim(count=2, phase="Bound", node="n1", uid="c-1"))

    with structlog.testing.capture_logs() as logs:
        assert world.reconcile() is None

    assert world.verbs() == ["create"]
    stored = world.record()
    assert stored is not None
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": names.API_VERSION,
            "kind": "GPUClaim",
            "name": "hold",
            "uid": "c-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert stored["status"] == {
        "kind": "GPUClaim",
        "type": "gpu",
        "resources": {"a10.gpuclass.cozystack.io/devices": 2},
        "operational": True,
    }
    assert [e["reason"] for e in logs if e["event"] == "usage record created"] == ["Bound"]


def test_an_up_to_date_record_is_not_written(world: World) -> None:
    world.put(world.caches.claims, objects.claim(count=2, phase="Bound", node="n1", uid="c-1"))
    world.put(world.caches.workloads, record_of("c-1"))

    assert world.reconcile() is None
    assert world.api.writes() == []


def test_a_record_whose_count_changed_is_rewritten(world: World) -> None:
    world.put(world.caches.claims, objects.claim(count=3, phase="Bound", node="n1", uid="c-1"))
    world.put(world.caches.workloads, record_of("c-1", count=2))

    assert world.reconcile() is None

    assert world.verbs() == ["replace"]
    stored = world.record()
    assert stored is not None
    assert stored["status"]["resources"] == {"a10.gpuclass.cozystack.io/devices": 3}


@pytest.mark.parametrize("phase", ["Pending", "Lost", None])
def test_a_claim_that_is_not_bound_has_its_record_removed(world: World, phase: str | None) -> None:
    world.put(world.caches.claims, objects.claim(phase=phase, uid="c-1"))
    record = world.put(world.caches.workloads, record_of("c-1"))

    assert world.reconcile() is None

    assert world.api.writes() == [
        ("delete", "Workload", RECORD, {"uid": record["metadata"]["uid"]})
    ]


def test_the_record_of_a_claim_that_is_gone_is_removed(world: World) -> None:
    world.put(world.caches.workloads, record_of("c-1"))
    assert world.reconcile() is None
    assert world.verbs() == ["delete"] and world.record() is None


def test_a_claim_not_bound_without_a_record_writes_nothing(world: World) -> None:
    world.put(world.caches.claims, objects.claim(phase="Pending"))
    assert world.reconcile() is None
    assert world.api.writes() == []


def test_a_record_of_another_claim_of_that_name_is_left_to_garbage_collection(
    world: World,
) -> None:
    world.put(world.caches.claims, objects.claim(count=2, phase="Bound", node="n1", uid="c-2"))
    world.put(world.caches.workloads, record_of("c-1"))

    result = world.reconcile()

    assert result is not None and result.requeue_after == 2.0
    assert world.api.writes() == []


def test_a_record_not_bound_of_another_claim_is_not_removed(world: World) -> None:
    world.put(world.caches.claims, objects.claim(phase="Pending", uid="c-2"))
    world.put(world.caches.workloads, record_of("c-1"))
    assert world.reconcile() is None
    assert world.api.writes() == []


def test_a_record_that_exists_behind_the_cache_is_looked_at_again(world: World) -> None:
    world.put(world.caches.claims, objects.claim(phase="Bound", node="n1", uid="c-1"))
    world.api.add(Workload, record_of("c-1"))  # not delivered to the cache yet

    result = world.reconcile()

    assert result is not None and result.requeue_after == 1.0
    assert world.verbs() == ["create"]


def test_records_map_back_to_their_claims(world: World) -> None:
    [(claims, by_claim), (workloads, by_record)] = world.manager.sources[usage_records.NAME]
    assert (claims, workloads) == (world.caches.claims, world.caches.workloads)
    assert list(by_claim(objects.claim("x"))) == [(NS, "x")]
    assert list(by_record(record_of("c-1"))) == [(NS, "hold")]
    assert list(by_record({"metadata": {"name": "billing", "namespace": NS}})) == []


def test_a_record_refused_because_its_namespace_is_being_deleted_is_given_up_quietly(
    world: World,
) -> None:
    world.put(world.caches.claims, objects.claim(count=2, phase="Bound", node="n1", uid="c-1"))
    world.api.refuse[("create", NS)] = errors.from_status(
        403,
        {
            "reason": "Forbidden",
            "message": f"workloads.cozystack.io {RECORD!r} is forbidden: unable to create new "
            f"content in namespace {NS} because it is being terminated",
            "details": {"causes": [{"type": "NamespaceTerminating"}]},
        },
    )

    with structlog.testing.capture_logs() as logs:
        assert world.reconcile() is None

    assert world.record() is None
    assert [(line["event"], line["reason"], line["log_level"]) for line in logs] == [
        ("usage record not created", "NamespaceTerminating", "info")
    ]


def test_a_403_of_rbac_is_still_an_error() -> None:
    refused = errors.from_status(403, {"reason": "Forbidden", "message": "cannot create"})
    assert type(refused) is errors.ForbiddenError
