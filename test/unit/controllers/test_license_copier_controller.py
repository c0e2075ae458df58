"""License copier over the fake API server and the product's caches, wired by its own
``register`` (its two Secret informers included): a licensed vGPU class's source Secret is
copied into each namespace with a claim of the class that is not being deleted, with the
generated ``gridd.conf``; nothing is written while the copies are up to date; a changed source
is rewritten in place, an immutable copy made again; copies no longer needed are deleted by
uid; a Secret of the copy's name the copier did not make is left alone with a Warning and a
later look; one namespace's refusal holds up no other; with gpuForVMs off nothing is made."""

from __future__ import annotations

import base64
from typing import Any

import pykube
import pytest

from controllers import license_copier
from gpuoperator import names
from gpuoperator.runtime import errors
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.informing import Informer
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import OfflineCluster

Obj = objects.Obj
OPERATOR_NS = "gpu-operator"
COPY = "gpu-license-l40s"
TOKEN = base64.b64encode(b"token-bytes").decode()


class World(OfflineCluster):
    def __init__(self, *, gpu_for_vms: bool = True) -> None:
        super().__init__()
        settings = Settings.model_validate({"gpuForVMs": gpu_for_vms})
        license_copier.register(
            self.manager.as_manager(), self.caches, self.recorder.recorder, settings, OPERATOR_NS
        )
        self.reconciler = self.manager.reconcilers[license_copier.NAME]
        self.copies: Informer = self.manager.informers[license_copier.COPIES_INFORMER]
        self.sources: Informer = self.manager.informers[license_copier.SOURCES_INFORMER]

    def reconcile(self, name: str = "l40s") -> Result | None:
        return self.reconciler.reconcile(("", name))

    def copy_in(self, namespace: str) -> Obj | None:
        return self.api.stored(pykube.Secret, COPY, namespace)

    def writes(self) -> list[tuple[str, str]]:
        """(verb, namespace) of every Secret create and replace."""
        return [
            (verb, payload["metadata"]["namespace"])
            for verb, kind, _, payload in self.api.writes()
            if kind == "Secret" and verb in ("create", "replace")
        ]

    def deleted(self) -> list[str]:
        return [name for verb, _, name, _ in self.api.writes() if verb == "delete"]


def licensed_class(feature_type: int = 4, **spec: Any) -> Obj:
    return objects.gpuclass(
        "l40s",
        mode="vgpu",
        resource="nvidia.com/NVIDIA_L40S-24Q",
        profile="NVIDIA L40S-24Q",
        license={"secretName": "nvidia-license", "featureType": feature_type},
        **spec,
    )


def source(data: dict[str, str] | None = None) -> Obj:
    return objects.secret(
        "nvidia-license", OPERATOR_NS, data=data or {"client_configuration_token.tok": TOKEN}
    )


def a_copy(namespace: str, *, uid: str | None = None, **extra: object) -> Obj:
    secret = objects.secret(
        COPY, namespace, labels={names.LICENSE_OF_LABEL: "l40s"}, data={"x": "eA=="}, uid=uid
    )
    secret.update(extra)
    return secret


def claim(name: str, namespace: str, *, deleting: bool = False) -> Obj:
    return objects.claim(name, namespace=namespace, class_name="l40s", deleting=deleting)


@pytest.fixture
def world() -> World:
    w = World()
    w.put(w.caches.classes, licensed_class())
    w.put(w.sources, source())
    return w


def gridd_conf(secret: Obj) -> str:
    return base64.b64decode(secret["data"]["gridd.conf"]).decode()


def test_each_namespace_with_a_claim_of_the_class_gets_one_copy(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.caches.claims, claim("b", "t1"))
    world.put(world.caches.claims, claim("c", "t2"))
    world.put(world.caches.claims, claim("going", "t3", deleting=True))
    world.put(world.caches.claims, objects.claim("other-class", namespace="t4"))

    assert world.reconcile() is None

    assert world.writes() == [("create", "t1"), ("create", "t2")]
    made = world.copy_in("t1")
    assert made is not None
    assert made["type"] == "Opaque"
    assert made["metadata"]["labels"] == {names.LICENSE_OF_LABEL: "l40s"}
    assert made["data"]["client_configuration_token.tok"] == TOKEN
    assert "FeatureType=4\n" in gridd_conf(made)
    assert world.recorder.reasons("l40s") == ["LicenseCopied", "LicenseCopied"]
    assert {e["kind"] for e in world.recorder.events} == {names.GPU_CLASS}
    assert "t1/gpu-license-l40s created" in world.recorder.events[0]["message"]


def test_up_to_date_copies_are_not_written(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.reconcile()
    made = world.copy_in("t1")
    assert made is not None
    world.deliver(world.copies, made)
    written = len(world.api.writes())

    assert world.reconcile() is None
    assert len(world.api.writes()) == written
    assert world.recorder.reasons() == ["LicenseCopied"]


def test_a_changed_source_is_rewritten_in_place(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.reconcile()
    made = world.copy_in("t1")
    assert made is not None
    world.deliver(world.copies, made)
    new_token = base64.b64encode(b"renewed").decode()
    world.put(world.sources, source({"client_configuration_token.tok": new_token}))

    assert world.reconcile() is None

    assert world.writes()[-1] == ("replace", "t1")
    rewritten = world.copy_in("t1")
    assert rewritten is not None
    assert rewritten["data"]["client_configuration_token.tok"] == new_token
    assert rewritten["metadata"]["uid"] == made["metadata"]["uid"]
    assert world.recorder.reasons() == ["LicenseCopied", "LicenseCopied"]
    assert "updated" in world.recorder.events[-1]["message"]


def test_an_immutable_copy_is_deleted_to_be_made_again(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1", immutable=True))

    assert world.reconcile() is None

    assert world.deleted() == [COPY]
    assert world.recorder.events == []  # its delete event brings the class back to make it


def test_a_copy_no_claim_needs_is_deleted_by_uid(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.caches.claims, claim("going", "t2", deleting=True))
    world.put(world.copies, a_copy("t1"))
    stale = world.put(world.copies, a_copy("t2"))

    world.reconcile()

    deletes = [c for c in world.api.writes() if c[0] == "delete"]
    assert deletes == [("delete", "Secret", COPY, {"uid": stale["metadata"]["uid"]})]
    assert world.copy_in("t1") is not None
    [removed] = [e for e in world.recorder.events if e["reason"] == "LicenseCopyRemoved"]
    assert "no claim of the class is left in the namespace" in removed["message"]


def test_a_secret_that_only_carries_the_label_is_not_a_copy(world: World) -> None:
    lookalike = objects.secret("other", "t2", labels={names.LICENSE_OF_LABEL: "l40s"})
    world.put(world.copies, lookalike)
    assert world.reconcile() is None
    assert world.api.writes() == []


def test_a_missing_source_is_warned_and_its_copies_removed(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1"))
    world.sources.store.remove((OPERATOR_NS, "nvidia-license"))

    assert world.reconcile() is None

    assert world.deleted() == [COPY]
    assert world.recorder.reasons() == ["LicenseSourceMissing", "LicenseCopyRemoved"]
    warning = world.recorder.events[0]
    assert warning["type"] == "Warning"
    assert f"{OPERATOR_NS}/nvidia-license" in warning["message"]
    assert "the license source Secret is gone" in world.recorder.events[1]["message"]


def test_the_copies_of_a_class_gone_are_deleted_without_an_event(world: World) -> None:
    world.caches.classes.store.remove(("", "l40s"))
    world.put(world.copies, a_copy("t1"))

    assert world.reconcile() is None
    assert world.deleted() == [COPY] and world.recorder.events == []


def test_the_copies_of_a_class_no_longer_licensed_are_deleted(world: World) -> None:
    world.put(world.caches.classes, objects.gpuclass("l40s", mode="vgpu"))
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1"))

    world.reconcile()

    assert world.deleted() == [COPY]
    assert "no longer has spec.license" in world.recorder.events[-1]["message"]


def test_a_foreign_secret_of_the_copys_name_is_left_alone_and_looked_at_later(
    world: World,
) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    foreign = world.api.add(pykube.Secret, objects.secret(COPY, "t1", data={"mine": "eA=="}))

    result = world.reconcile()

    assert result is not None and result.requeue_after == 60.0
    assert world.writes() == [("create", "t1")]  # refused: AlreadyExists
    assert world.copy_in("t1") == foreign
    [event] = world.recorder.events
    assert (event["type"], event["reason"]) == ("Warning", "LicenseCopyConflict")
    assert f"label it {names.LICENSE_OF_LABEL}=l40s" in event["message"]


def test_a_copy_made_but_not_cached_yet_is_looked_at_again_soon(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.api.add(pykube.Secret, a_copy("t1"))

    result = world.reconcile()

    assert result is not None and result.requeue_after == license_copier.CACHE_LAG_RECHECK
    assert world.recorder.events == []


def test_one_namespaces_refusal_holds_up_no_other(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.caches.claims, claim("b", "t2"))
    quota = errors.ForbiddenError(403, "Forbidden", "exceeded quota: secrets")
    world.api.refuse[("create", "t1")] = quota

    with pytest.raises(errors.ForbiddenError):
        world.reconcile()

    assert world.copy_in("t1") is None and world.copy_in("t2") is not None
    assert world.recorder.reasons() == ["LicenseCopyFailed", "LicenseCopied"]
    assert "t1/gpu-license-l40s not written: 403 Forbidden" in world.recorder.events[0]["message"]


def test_a_namespace_being_terminated_is_skipped_quietly(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.api.refuse[("create", "t1")] = errors.from_status(
        403,
        {
            "reason": "Forbidden",
            "message": "unable to create new content in namespace t1 because it is being "
            "terminated",
            "details": {"causes": [{"type": "NamespaceTerminating"}]},
        },
    )

    assert world.reconcile() is None
    assert world.recorder.events == []


def test_with_gpu_for_vms_off_nothing_is_made_but_stale_copies_go() -> None:
    world = World(gpu_for_vms=False)
    world.put(world.caches.classes, licensed_class())
    world.put(world.sources, source())
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t2"))

    assert world.reconcile() is None

    assert world.deleted() == [COPY]
    assert world.copy_in("t1") is None
    assert world.recorder.reasons() == ["LicenseCopyRemoved"]
