"""License copier over the fake API server and the product's caches, wired by its own
``register`` (its two Secret informers included): a licensed vGPU class's token is copied,
with the generated ``gridd.conf`` and nothing else of the source, into each vGPU-entitled
namespace holding a Bound claim of the class; nothing is written while the copies are up to
date; a changed source is rewritten in place, an immutable copy made again; copies no longer
needed are deleted by uid; a source outside the license namespace, unlabelled or without the
token key is refused with the class's ``LicenseReady`` condition and a Warning; a Secret of
the copy's name the copier did not make is left alone with a Warning and a later look; one
namespace's refusal holds up no other; with gpuForVMs off no copy is kept; the copies' cache
holds no Secret data."""

from __future__ import annotations

import base64
from typing import Any

import pykube
import pytest

from controllers import license_copier
from gpuoperator import names
from gpuoperator.kinds import GPUClass
from gpuoperator.model import conditions, licensing
from gpuoperator.runtime import errors
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.informing import Informer
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import OfflineCluster

Obj = objects.Obj
OPERATOR_NS = "gpu-operator"
LICENSE_NS = names.DEFAULT_LICENSE_NAMESPACE
COPY = "gpu-license-l40s"
TOKEN = base64.b64encode(b"token-bytes").decode()
CA_KEY = base64.b64encode(b"-----BEGIN PRIVATE KEY-----").decode()
SOURCE_LABELS = {names.LICENSE_SOURCE_LABEL: names.TRUE}


class World(OfflineCluster):
    def __init__(self, *, gpu_for_vms: bool = True) -> None:
        super().__init__()
        settings = Settings.model_validate({"gpuForVMs": gpu_for_vms})
        license_copier.register(self.manager, self.caches, self.recorder, settings, OPERATOR_NS)
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

    def status_writes(self) -> int:
        return sum(1 for verb, kind, _, _ in self.api.writes() if kind == names.GPU_CLASS)

    def deleted(self) -> list[str]:
        return [name for verb, _, name, _ in self.api.writes() if verb == "delete"]

    def tenant(self, namespace: str, *, entitled: bool = True) -> None:
        self.put(self.caches.namespaces, objects.namespace(namespace, entitled=entitled))

    def license_ready(self, name: str = "l40s") -> Obj | None:
        stored = self.api.stored(GPUClass, name)
        assert stored is not None
        return conditions.find((stored.get("status") or {}).get("conditions"), "LicenseReady")


def licensed_class(
    feature_type: int = 4,
    secret_name: str = "nvidia-license",  # noqa: S107 - a name
    **spec: Any,
) -> Obj:
    return objects.gpuclass(
        "l40s",
        mode="vgpu",
        resource="nvidia.com/NVIDIA_L40S-24Q",
        profile="NVIDIA L40S-24Q",
        license={"secretName": secret_name, "featureType": feature_type},
        **spec,
    )


def source(data: dict[str, str] | None = None, **kw: Any) -> Obj:
    kw.setdefault("labels", SOURCE_LABELS)
    return objects.secret(
        "nvidia-license",
        kw.pop("namespace", LICENSE_NS),
        data={licensing.TOKEN_KEY: TOKEN} if data is None else data,
        **kw,
    )


def a_copy(namespace: str, *, uid: str | None = None, **extra: object) -> Obj:
    secret = objects.secret(
        COPY, namespace, labels={names.LICENSE_OF_LABEL: "l40s"}, data={"x": "eA=="}, uid=uid
    )
    secret.update(extra)
    return secret


def claim(name: str, namespace: str, *, phase: str | None = "Bound", deleting: bool = False) -> Obj:
    return objects.claim(
        name,
        namespace=namespace,
        class_name="l40s",
        phase=phase,
        node="n1" if phase == "Bound" else None,
        deleting=deleting,
    )


@pytest.fixture
def world() -> World:
    w = World()
    w.put(w.caches.classes, licensed_class())
    w.put(w.sources, source())
    for ns in ("t1", "t2", "t3", "t4"):
        w.tenant(ns)
    return w


def gridd_conf(secret: Obj) -> str:
    return base64.b64decode(secret["data"]["gridd.conf"]).decode()


# ---- who gets a copy --------------------------------------------------------------------
def test_each_entitled_namespace_with_a_bound_claim_of_the_class_gets_one_copy(
    world: World,
) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.caches.claims, claim("b", "t1"))
    world.put(world.caches.claims, claim("going", "t2", deleting=True))  # still holds units
    world.put(world.caches.claims, claim("waiting", "t3", phase="Pending"))
    world.put(world.caches.claims, claim("lost", "t3", phase="Lost"))
    world.put(world.caches.claims, objects.claim("other-class", namespace="t4", phase="Bound"))
    world.tenant("plain", entitled=False)
    world.put(world.caches.claims, claim("sneaky", "plain"))
    world.put(world.caches.claims, claim("unknown-ns", "nowhere"))

    assert world.reconcile() is None

    assert world.writes() == [("create", "t1"), ("create", "t2")]
    made = world.copy_in("t1")
    assert made is not None
    assert made["type"] == "Opaque"
    assert made["metadata"]["labels"] == {names.LICENSE_OF_LABEL: "l40s"}
    assert made["data"][licensing.TOKEN_KEY] == TOKEN
    assert "FeatureType=4\n" in gridd_conf(made)
    assert world.recorder.reasons("l40s") == ["LicenseCopied", "LicenseCopied"]
    assert {e["kind"] for e in world.recorder.events} == {names.GPU_CLASS}
    assert "t1/gpu-license-l40s created" in world.recorder.events[0]["message"]


def test_only_the_token_key_of_the_source_is_copied(world: World) -> None:
    world.put(
        world.sources,
        source(
            {licensing.TOKEN_KEY: TOKEN, "ca.key": CA_KEY, "tls.key": CA_KEY, "gridd.conf": TOKEN}
        ),
    )
    world.put(world.caches.claims, claim("a", "t1"))

    world.reconcile()

    made = world.copy_in("t1")
    assert made is not None
    assert set(made["data"]) == {licensing.TOKEN_KEY, licensing.GRIDD_CONF_KEY}
    assert CA_KEY not in made["data"].values()


def test_a_namespace_event_wakes_the_classes_of_its_claims(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.caches.claims, objects.claim("b", namespace="t1", class_name="a10"))
    [mapper] = [
        m
        for source_, m in world.manager.sources[license_copier.NAME]
        if source_ is world.caches.namespaces
    ]
    assert mapper(objects.namespace("t1")) == [("", "a10"), ("", "l40s")]
    assert mapper(objects.namespace("empty")) == []


# ---- keeping copies current -------------------------------------------------------------
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


def test_a_changed_source_is_rewritten_in_place_from_the_copy_as_read(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.reconcile()
    made = world.copy_in("t1")
    assert made is not None
    made["metadata"]["labels"]["team"] = "blue"  # someone else's label: kept
    made = world.put(world.copies, made)
    new_token = base64.b64encode(b"renewed").decode()
    world.put(world.sources, source({licensing.TOKEN_KEY: new_token}))

    assert world.reconcile() is None

    assert world.writes()[-1] == ("replace", "t1")
    rewritten = world.copy_in("t1")
    assert rewritten is not None
    assert rewritten["data"][licensing.TOKEN_KEY] == new_token
    assert rewritten["metadata"]["uid"] == made["metadata"]["uid"]
    assert rewritten["metadata"]["labels"]["team"] == "blue"
    assert world.recorder.reasons() == ["LicenseCopied", "LicenseCopied"]
    assert "updated" in world.recorder.events[-1]["message"]


def test_a_copy_an_older_release_made_with_every_key_is_rewritten_with_the_token_only(
    world: World,
) -> None:
    """Same source, version and featureType recorded, but no digest of what it holds: the
    old copier copied every key of the source."""
    world.put(world.caches.claims, claim("a", "t1"))
    src = world.sources.store.get((LICENSE_NS, "nvidia-license"))
    assert src is not None
    old = licensing.desired_copy(licensed_class(), src, "t1")
    old["data"]["ca.key"] = CA_KEY
    del old["metadata"]["annotations"][licensing.DIGEST_ANNOTATION]
    world.put(world.copies, old)

    world.reconcile()

    assert world.writes() == [("replace", "t1")]
    rewritten = world.copy_in("t1")
    assert rewritten is not None
    assert set(rewritten["data"]) == {licensing.TOKEN_KEY, licensing.GRIDD_CONF_KEY}


def test_an_immutable_copy_is_deleted_to_be_made_again(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1", immutable=True))

    assert world.reconcile() is None

    assert world.deleted() == [COPY]
    assert [e for e in world.recorder.events if e["reason"] == "LicenseCopyRemoved"] == []


# ---- copies no longer needed ------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "said"),
    [
        pytest.param(
            lambda w: w.put(w.caches.claims, claim("a", "t2", phase="Pending")),
            "no Bound claim of the class is left in the namespace",
            id="claim-no-longer-bound",
        ),
        pytest.param(
            lambda w: w.caches.claims.store.remove(("t2", "a")),
            "no Bound claim of the class is left in the namespace",
            id="claim-gone",
        ),
        pytest.param(
            lambda w: w.tenant("t2", entitled=False),
            "the namespace is not entitled to vGPU",
            id="entitlement-removed",
        ),
    ],
)
def test_a_copy_no_longer_needed_is_deleted_by_uid(world: World, change: Any, said: str) -> None:
    world.put(world.caches.claims, claim("keep", "t1"))
    world.put(world.caches.claims, claim("a", "t2"))
    world.put(world.copies, a_copy("t1"))
    stale = world.put(world.copies, a_copy("t2"))
    change(world)

    world.reconcile()

    deletes = [c for c in world.api.writes() if c[0] == "delete"]
    assert deletes == [("delete", "Secret", COPY, {"uid": stale["metadata"]["uid"]})]
    assert world.copy_in("t1") is not None
    [removed] = [e for e in world.recorder.events if e["reason"] == "LicenseCopyRemoved"]
    assert said in removed["message"]


def test_a_secret_that_only_carries_the_label_is_not_a_copy(world: World) -> None:
    lookalike = objects.secret("other", "t2", labels={names.LICENSE_OF_LABEL: "l40s"})
    world.put(world.copies, lookalike)
    assert world.reconcile() is None
    assert [w for w in world.api.writes() if w[1] == "Secret"] == []


def test_the_copies_of_a_class_gone_are_deleted_without_an_event(world: World) -> None:
    world.caches.classes.store.remove(("", "l40s"))
    world.put(world.copies, a_copy("t1"))

    assert world.reconcile() is None
    assert world.deleted() == [COPY] and world.recorder.events == []


def test_the_copies_of_a_class_no_longer_licensed_go_and_so_does_its_condition(
    world: World,
) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    world.reconcile()
    assert world.license_ready() is not None
    made = world.copy_in("t1")
    assert made is not None
    world.deliver(world.copies, made)
    unlicensed = world.api.stored(GPUClass, "l40s")
    assert unlicensed is not None
    del unlicensed["spec"]["license"]
    world.put(world.caches.classes, unlicensed)

    world.reconcile()

    assert world.deleted() == [COPY]
    assert "no longer has spec.license" in world.recorder.events[-1]["message"]
    assert world.license_ready() is None


def test_with_gpu_for_vms_off_no_copy_is_made_or_kept() -> None:
    world = World(gpu_for_vms=False)
    world.put(world.caches.classes, licensed_class())
    world.put(world.sources, source())
    world.tenant("t1")
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1"))

    assert world.reconcile() is None

    assert world.deleted() == [COPY]
    assert world.writes() == []
    assert world.recorder.reasons() == ["LicenseCopyRemoved"]
    assert "gpuForVMs is off" in world.recorder.events[0]["message"]


# ---- which Secrets may be sources -------------------------------------------------------
def test_an_accepted_source_is_told_by_the_license_ready_condition_once(world: World) -> None:
    world.put(world.caches.claims, claim("a", "t1"))

    world.reconcile()

    ready = world.license_ready()
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("True", "SourceReady")
    assert f"{LICENSE_NS}/nvidia-license" in ready["message"]
    assert world.status_writes() == 1
    world.sync(world.caches.classes, "l40s")
    world.reconcile()
    assert world.status_writes() == 1


def test_the_condition_leaves_the_other_conditions_of_the_class_as_they_are(
    world: World,
) -> None:
    available = {
        "type": "Available",
        "status": "True",
        "reason": "EligibleNodes",
        "message": "1 eligible node(s)",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    world.put(world.caches.classes, licensed_class(status={"free": 3, "conditions": [available]}))

    world.reconcile()

    stored = world.api.stored(GPUClass, "l40s")
    assert stored is not None
    assert stored["status"]["free"] == 3
    assert [c["type"] for c in stored["status"]["conditions"]] == ["Available", "LicenseReady"]
    assert stored["status"]["conditions"][0] == available


def test_the_condition_is_written_under_the_class_resource_version(world: World) -> None:
    """Another writer (class status) changed the class since the cache saw it: the copier's
    write is refused rather than overwriting that status, and retried."""
    world.api.conflict_next.add("replace_status")

    with pytest.raises(errors.ConflictError):
        world.reconcile()


@pytest.mark.parametrize(
    ("secret_name", "in_license_ns", "reason", "fragments"),
    [
        pytest.param(
            names.WEBHOOK_CERT_SECRET,
            None,
            "SourceNotFound",
            [
                f"spec.license.secretName='{names.WEBHOOK_CERT_SECRET}'",
                f"no Secret '{names.WEBHOOK_CERT_SECRET}' in the license namespace {LICENSE_NS}",
            ],
            id="the-webhook-certificate",
        ),
        pytest.param(
            "nvidia-license",
            source(labels={}),
            "SourceNotLabelled",
            [f'does not carry the label {names.LICENSE_SOURCE_LABEL}: "true"', "no such label"],
            id="unlabelled",
        ),
        pytest.param(
            "nvidia-license",
            source(labels={names.LICENSE_SOURCE_LABEL: "yes"}),
            "SourceNotLabelled",
            ["it has the value 'yes'"],
            id="labelled-otherwise",
        ),
        pytest.param(
            "nvidia-license",
            source({"token": TOKEN}),
            "NoTokenKey",
            [f"has no non-empty key {licensing.TOKEN_KEY}"],
            id="no-token-key",
        ),
    ],
)
def test_a_class_naming_anything_but_a_labelled_source_gets_no_copy_and_a_condition(
    secret_name: str, in_license_ns: Obj | None, reason: str, fragments: list[str]
) -> None:
    world = World()
    world.put(world.caches.classes, licensed_class(secret_name=secret_name))
    # The operator's certificate Secret exists, but in the operator's namespace.
    world.api.add(
        pykube.Secret,
        objects.secret(names.WEBHOOK_CERT_SECRET, OPERATOR_NS, data={"ca.key": CA_KEY}),
    )
    if in_license_ns is not None:
        world.api.add(pykube.Secret, in_license_ns)  # on the server
        if (in_license_ns["metadata"].get("labels") or {}).get(
            names.LICENSE_SOURCE_LABEL
        ) == "true":
            world.deliver(world.sources, in_license_ns)  # and, labelled, in the cache
    world.tenant("t1")
    world.put(world.caches.claims, claim("a", "t1"))
    world.put(world.copies, a_copy("t1"))

    assert world.reconcile() is None

    assert world.writes() == []
    assert world.deleted() == [COPY]
    cond = world.license_ready()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", reason)
    for fragment in fragments:
        assert fragment in cond["message"]
    assert f"labelled {names.LICENSE_SOURCE_LABEL}" in cond["message"]  # what is allowed
    [warning] = [e for e in world.recorder.events if e["type"] == "Warning"]
    assert (warning["reason"], warning["message"]) == ("LicenseSourceRefused", cond["message"])
    # Told once: the next pass writes and warns nothing more.
    world.sync(world.caches.classes, "l40s")
    world.sync(world.copies, COPY, "t1")
    writes = len(world.api.writes())
    world.reconcile()
    assert len(world.api.writes()) == writes
    assert len([e for e in world.recorder.events if e["type"] == "Warning"]) == 1


# ---- Secrets the copier did not make; API refusals ----------------------------------------
def test_a_foreign_secret_of_the_copys_name_is_left_alone_and_looked_at_later(
    world: World,
) -> None:
    world.put(world.caches.claims, claim("a", "t1"))
    foreign = world.api.add(pykube.Secret, objects.secret(COPY, "t1", data={"mine": "eA=="}))

    result = world.reconcile()

    assert result is not None and result.requeue_after == 60.0
    assert world.writes() == [("create", "t1")]  # refused: AlreadyExists
    assert world.copy_in("t1") == foreign
    [event] = [e for e in world.recorder.events if e["reason"] == "LicenseCopyConflict"]
    assert event["type"] == "Warning"
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


# ---- what is cached and read --------------------------------------------------------------
def test_the_copies_cache_holds_no_data_of_the_labelled_secrets_tenants_make() -> None:
    world = World()
    big = base64.b64encode(b"x" * 64 * 1024).decode()
    for i in range(50):
        secret = objects.secret(
            f"junk-{i}",
            "t1",
            labels={names.LICENSE_OF_LABEL: "l40s", "pad": "y" * 60},
            annotations={"pad": big, licensing.SOURCE_ANNOTATION: big},
            data={"blob": big},
        )
        world.put(world.copies, secret)

    cached = list(world.copies.store.values())
    assert len(cached) == 50
    for obj in cached:
        assert "data" not in obj
        assert obj["metadata"]["labels"] == {names.LICENSE_OF_LABEL: "l40s"}
        assert set(obj["metadata"].get("annotations") or {}) <= {licensing.SOURCE_ANNOTATION}
    assert sum(len(repr(o)) for o in cached) < 50 * 1024  # not 50 times 64 KiB


def test_the_informers_read_only_labelled_secrets_in_small_pages(world: World) -> None:
    copies, sources = world.copies.options, world.sources.options
    assert (copies.namespace, copies.label_selector) == (None, names.LICENSE_OF_LABEL)
    assert copies.transform is licensing.slim_copy
    assert copies.page_size <= 16
    assert sources.namespace == LICENSE_NS
    assert sources.label_selector == f"{names.LICENSE_SOURCE_LABEL}=true"


def test_the_license_namespace_may_not_be_the_operators_own() -> None:
    world = OfflineCluster()
    settings = Settings.model_validate({"licenseNamespace": OPERATOR_NS})
    with pytest.raises(ValueError, match="licenseNamespace='gpu-operator' is the operator's own"):
        license_copier.register(world.manager, world.caches, world.recorder, settings, OPERATOR_NS)
