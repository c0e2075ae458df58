"""Claim protection (``controllers.claim_protection``).

Over the fake API server and the product's caches, wired by its own ``register``: a
claim that is not being deleted and already carries the finalizer is not written; one being
deleted without it is left alone; a release removes only this finalizer, written from the API
server's copy (the cache keeps a slim one) and only while that copy is the one the cache
showed, so a stale cache writes nothing until it sees the newer version; the VMI is
read from the API server only when the cache shows no live user; a hold told once is told
again after the claim's deletion was cancelled.

The VM-facing cases, in a world of VMs (``harness.vm_controllers``): a claim serving a VMI
not yet gone keeps its finalizer (also when only the cache lags behind the VMI), and loses
it once the VMI and its pods are gone; a held deletion is told once per state."""

from __future__ import annotations

import pytest

from controllers import claim_protection
from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.runtime.controlling import Result
from harness import objects
from harness import vm_controllers as vm
from harness.objects import NS
from harness.offline import OfflineCluster

Obj = objects.Obj
FINALIZER = names.CLAIM_PROTECTION_FINALIZER
ATTACHED = {"vmi": "vm1", "uid": "uid-vm1"}


class World(OfflineCluster):
    def __init__(self) -> None:
        super().__init__()
        claim_protection.register(self.manager, self.caches, self.recorder)
        self.reconciler = self.manager.reconcilers[claim_protection.NAME]

    def reconcile(self, name: str = "hold") -> Result | None:
        return self.reconciler.reconcile((NS, name))

    def stored(self, name: str = "hold") -> Obj:
        stored = self.api.stored(GPUClaim, name, NS)
        assert stored is not None
        return stored

    def reads(self) -> list[tuple[str, str]]:
        return [(kind, name) for verb, kind, name, _ in self.api.calls if verb == "get"]


@pytest.fixture
def world() -> World:
    return World()


def test_a_protected_claim_that_is_not_deleted_is_not_written(world: World) -> None:
    world.put(world.caches.claims, objects.claim(finalizers=[FINALIZER]))
    assert world.reconcile() is None
    assert world.api.calls == []


def test_a_deleted_claim_without_the_finalizer_is_left_alone(world: World) -> None:
    world.put(
        world.caches.claims,
        objects.claim(deleting=True, finalizers=["example.com/other"], attached=ATTACHED),
    )
    assert world.reconcile() is None
    assert world.api.calls == [] and world.recorder.events == []


def test_a_claim_gone_from_the_cache_writes_nothing(world: World) -> None:
    assert world.reconcile("gone") is None
    assert world.api.calls == []


def test_a_release_removes_only_this_finalizer(world: World) -> None:
    world.put(
        world.caches.claims,
        objects.claim(
            deleting=True, finalizers=["example.com/before", FINALIZER, "example.com/after"]
        ),
    )

    assert world.reconcile() is None

    assert [verb for verb, *_ in world.api.writes()] == ["replace"]
    assert world.stored()["metadata"]["finalizers"] == ["example.com/before", "example.com/after"]
    assert world.recorder.events == []


def test_a_release_on_a_stale_cache_writes_nothing_until_the_newer_version_is_seen(
    world: World,
) -> None:
    world.put(world.caches.claims, objects.claim(deleting=True, finalizers=[FINALIZER]))
    world.api.add(GPUClaim, world.stored())  # someone else wrote it since: a newer version

    assert world.reconcile() is None
    assert world.api.writes() == []
    assert world.stored()["metadata"]["finalizers"] == [FINALIZER]

    world.deliver(world.caches.claims, world.stored())  # the watch brings the newer version
    assert world.reconcile() is None
    assert world.stored()["metadata"]["finalizers"] == []


def test_a_write_from_the_api_servers_copy_keeps_what_the_cache_does_not(world: World) -> None:
    """The cache keeps none of a tenant's labels, annotations, other finalizers or owners
    (``model.slimming``); the finalizer writes must not drop them from the claim."""
    tenant_meta = {
        "labels": {"team": "blue"},
        "annotations": {"note": "x" * 10_000},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"}
        ],
    }
    claim = objects.claim(finalizers=["example.com/keep"])
    claim["metadata"].update(tenant_meta)
    world.put(world.caches.claims, claim)
    cached = world.caches.claims.store.get((NS, "hold"))
    assert cached is not None and "annotations" not in cached["metadata"]

    assert world.reconcile() is None  # adds the finalizer
    stored = world.stored()
    assert stored["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]

    stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.put(world.caches.claims, stored)
    assert world.reconcile() is None  # releases it
    meta = world.stored()["metadata"]
    assert meta["finalizers"] == ["example.com/keep"]
    assert {k: meta[k] for k in tenant_meta} == tenant_meta


def test_a_live_user_in_the_cache_is_not_read_again(world: World) -> None:
    world.put(world.caches.vmis, objects.vmi(refs=[{"claim": "hold"}]))
    world.put(
        world.caches.claims,
        objects.claim(deleting=True, finalizers=[FINALIZER], attached=ATTACHED),
    )

    assert world.reconcile() is None

    assert world.reads() == [] and world.api.writes() == []
    [event] = world.recorder.events
    assert (event["type"], event["reason"], event["kind"]) == ("Normal", "DeletionHeld", "GPUClaim")
    assert "still exists" in event["message"]


def test_a_user_the_cache_does_not_show_is_read_from_the_api_server_before_release(
    world: World,
) -> None:
    world.put(
        world.caches.claims,
        objects.claim(deleting=True, finalizers=[FINALIZER], attached=ATTACHED),
    )

    assert world.reconcile() is None

    assert world.reads() == [("VirtualMachineInstance", "vm1"), ("GPUClaim", "hold")]
    assert world.stored()["metadata"]["finalizers"] == []


def test_a_hold_is_told_again_after_the_deletion_was_cancelled(world: World) -> None:
    world.put(world.caches.vmis, objects.vmi(refs=[{"claim": "hold"}]))
    held = objects.claim(deleting=True, finalizers=[FINALIZER], attached=ATTACHED)
    world.put(world.caches.claims, held)
    world.reconcile()
    world.put(world.caches.claims, objects.claim(finalizers=[FINALIZER], attached=ATTACHED))
    world.reconcile()  # no longer being deleted: forgotten

    world.put(world.caches.claims, held)
    world.reconcile()

    assert world.recorder.reasons() == ["DeletionHeld", "DeletionHeld"]


def test_claim_protection_is_woken_by_claims_the_vmis_they_serve_and_those_vmis_pods(
    world: World,
) -> None:
    """The pods too: a VMI deleted in the foreground may see no write once its pods are
    gone (KubeVirt need not write the status of a VMI being deleted, and the garbage
    collector may have marked its template claim before), so the end of a pod must wake
    the claims, or the claim, the VMI and the collector wait for each other."""
    world.put(world.caches.claims, objects.claim("hold", attached=ATTACHED))
    world.put(world.caches.claims, objects.claim("other", attached={"vmi": "vm2"}))
    world.put(world.caches.claims, vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID))
    [(claims, by_claim), (vmis, by_vmi), (pods, by_pod)] = world.manager.sources[
        claim_protection.NAME
    ]
    assert (claims, vmis, pods) == (world.caches.claims, world.caches.vmis, world.caches.pods)
    assert list(by_claim(objects.claim("x"))) == [(NS, "x")]
    assert list(by_vmi(objects.vmi("vm1"))) == [(NS, "hold"), (NS, "vm1-gpu-1")]
    assert list(by_pod(vm.launcher_pod(gated=False))) == [(NS, "hold"), (NS, "vm1-gpu-1")]
    assert list(by_pod(objects.pod("plain", node_name="gpu-1"))) == []


# -- in a world of VMs ------------------------------------------------------------------------


@pytest.fixture
def vm_world() -> vm.World:
    return vm.World()


def deleting(obj: Obj) -> Obj:
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    return obj


def _finalizer_writes(vm_world: vm.World) -> list[list[str]]:
    return [
        c[3]["metadata"].get("finalizers", [])
        for c in vm_world.api.calls
        if c[0] == "replace" and c[1] == "GPUClaim"
    ]


@pytest.mark.parametrize(
    ("obj", "user"),
    [
        pytest.param(
            vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID, phase="Bound", node="n1"),
            vm.vmi(),
            id="a-template-claim-of-a-running-vmi",
        ),
        pytest.param(
            vm.claim(
                "hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}, phase="Bound", node="n1"
            ),
            vm.vmi(deleting=True),
            id="a-held-claim-of-a-vmi-being-deleted",
        ),
        pytest.param(
            vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID, phase="Bound", node="n1"),
            vm.vmi(deleting=True),
            id="a-template-claim-of-a-vmi-being-deleted",
        ),
        pytest.param(
            vm.claim("hold-a", attached={"vmi": "vm1"}, phase="Bound", node="n1"),
            vm.vmi(),
            id="a-held-claim-with-an-unconfirmed-attachment",
        ),
    ],
)
def test_a_deleted_claim_keeps_its_finalizer_while_its_vmi_is_not_gone(
    vm_world: vm.World, obj: Obj, user: Obj
) -> None:
    vm_world.put_vmi(user)
    vm_world.put_claim(deleting(obj))

    assert vm_world.protection().reconcile((NS, obj["metadata"]["name"])) is None

    assert vm_world.api.writes() == []
    assert vm_world.recorder.reasons() == ["DeletionHeld"]
    assert "vm1" in vm_world.recorder.events[0]["message"]


def test_a_held_deletion_is_reported_once_per_state(vm_world: vm.World) -> None:
    vm_world.put_vmi(vm.vmi())
    vm_world.put_claim(deleting(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID})))
    protection = vm_world.protection()

    protection.reconcile((NS, "hold-a"))
    protection.reconcile((NS, "hold-a"))
    assert vm_world.recorder.reasons() == ["DeletionHeld"]

    vm_world.put_vmi(vm.vmi(deleting=True))  # the VM starts its shutdown: news
    protection.reconcile((NS, "hold-a"))
    assert vm_world.recorder.reasons() == ["DeletionHeld", "DeletionHeld"]
    assert "is being deleted" in vm_world.recorder.events[-1]["message"]


def test_a_deleted_claim_is_held_when_only_the_cache_lags_behind_its_vmi(
    vm_world: vm.World,
) -> None:
    vm_world.api.add(VirtualMachineInstance, vm.vmi())  # exists, not cached yet
    vm_world.put_claim(deleting(vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID})))

    vm_world.protection().reconcile((NS, "hold-a"))
    assert vm_world.api.writes() == []


@pytest.mark.parametrize(
    ("obj", "user"),
    [
        pytest.param(vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID), None, id="template-owner-gone"),
        pytest.param(
            vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID),
            vm.vmi(uid="uid-new"),
            id="template-owner-replaced",
        ),
        pytest.param(
            vm.claim("hold-a", attached={"vmi": "vm1", "uid": vm.VMI_UID}),
            None,
            id="attached-vmi-gone",
        ),
        pytest.param(vm.claim("hold-a"), vm.vmi(), id="no-user"),
    ],
)
def test_a_deleted_claim_is_released_once_its_vmi_is_gone(
    vm_world: vm.World, obj: Obj, user: Obj | None
) -> None:
    if user is not None:
        vm_world.put_vmi(user)
    vm_world.put_claim(deleting(obj))

    vm_world.protection().reconcile((NS, obj["metadata"]["name"]))

    assert _finalizer_writes(vm_world) == [[]]


def test_a_vmi_deleted_in_the_foreground_releases_its_template_claims_once_its_pods_are_gone(
    vm_world: vm.World,
) -> None:
    """The garbage collector waits for the claim (blockOwnerDeletion): waiting for the VMI
    in turn would deadlock; once no pod of the VMI is left, nothing holds the GPU."""
    foreground = vm.vmi(deleting=True)
    foreground["metadata"]["finalizers"] = ["foregroundDeletion"]
    vm_world.put_vmi(foreground)
    vm_world.put_claim(deleting(vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID)))
    pod = vm_world.put_pod(vm.launcher_pod(gated=False))

    vm_world.protection().reconcile((NS, "vm1-gpu-1"))
    assert vm_world.api.writes() == []

    vm_world.caches.pods.store.remove((NS, pod["metadata"]["name"]))
    vm_world.protection().reconcile((NS, "vm1-gpu-1"))
    assert _finalizer_writes(vm_world) == [[]]


def test_a_new_claim_gets_the_protection_finalizer(vm_world: vm.World) -> None:
    fresh = vm.claim("hold-a")
    fresh["metadata"]["finalizers"] = []
    vm_world.put_claim(fresh)

    vm_world.protection().reconcile((NS, "hold-a"))
    assert _finalizer_writes(vm_world) == [[names.CLAIM_PROTECTION_FINALIZER]]


def test_vmis_map_to_the_claims_they_own_or_are_attached_to(vm_world: vm.World) -> None:
    vm_world.put_claim(vm.claim("vm1-gpu-1", owner_uid=vm.VMI_UID))
    vm_world.put_claim(vm.claim("hold-a", attached={"vmi": "vm1"}))
    vm_world.put_claim(vm.claim("hold-b", attached={"vmi": "vm2"}))
    vm_world.put_claim(vm.claim("hold-c"))

    assert claim_protection.claims_of_vmi(vm_world.caches, vm.vmi()) == [
        (NS, "hold-a"),
        (NS, "vm1-gpu-1"),
    ]
