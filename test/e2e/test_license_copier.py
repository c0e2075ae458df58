"""The license copier on the real control plane: a vGPU class's license token is copied, with
a generated ``gridd.conf`` and nothing else of its source, into every vGPU-entitled namespace
that holds a Bound claim of the class; it follows its source and featureType, goes when no
longer needed, and never touches a Secret it did not make. Sources are only the license
namespace's Secrets labelled ``gpu.cozystack.io/license-source: "true"``: a class naming
anything else gets ``LicenseReady=False`` saying why.

The copier runs in-process on its own ``Manager`` (no leader election, no servers) with the
token of the operator's rendered ServiceAccount (so its RBAC and the Secret-writes policy
apply, and the suite's audit check sees any 403), beside the claim-protection controller
(claims are deleted here). No binder runs: a claim's phase is written by the test, as the
binder would. Tenants act as a user holding only the built-in ``edit`` role in their
namespace. Each test uses classes, sources and namespaces of its own, removed afterwards.
"""

from __future__ import annotations

import base64
import datetime
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pykube
import pytest
from prometheus_client import CollectorRegistry

from controllers import claim_protection, license_copier
from gpuoperator import caches, names, settings
from gpuoperator.caches import Caches
from gpuoperator.kinds import GPUClaim, GPUClass
from gpuoperator.model import conditions, licensing
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.informing import Informer
from gpuoperator.runtime.kubeconfig import load_config
from gpuoperator.runtime.managing import Manager, ManagerOptions
from gpuoperator.runtime.recording import Recorder
from harness.kube import Obj, mutate, replace
from harness.operator import Deployed
from harness.tenancy import as_tenant
from harness.waiting import wait_for

TOKEN_KEY = licensing.TOKEN_KEY
LICENSE_NS = names.DEFAULT_LICENSE_NAMESPACE
CONVERGE = 20.0  # seconds: a copy must follow a change well within this
#: The node a claim is "bound" to here: no such node exists, so the suite's after-test
#: over-allocation check (which reads the nodes) counts nothing of it.
NO_NODE = "no-such-node-licenses"


@dataclass
class Copier:
    """The running copier: its license namespace, the operator's, and the caches it reads."""

    license_namespace: str
    operator_namespace: str
    caches: Caches
    copies: Informer


@pytest.fixture(scope="module")
def copier(deployed: Deployed, api: pykube.HTTPClient) -> Iterator[Copier]:
    made_license_ns = pykube.Namespace.objects(api).get_or_none(name=LICENSE_NS) is None
    if made_license_ns:
        pykube.Namespace(api, {"metadata": {"name": LICENSE_NS}}).create()
    manager = Manager(
        Client(lambda: load_config(str(deployed.kubeconfig))),  # the operator's token
        ManagerOptions(
            namespace=deployed.namespace,
            identity="license-copier-e2e",
            leader_election=False,
            health_address=None,
            metrics_address=None,
        ),
        registry=CollectorRegistry(),
    )
    shared = caches.register(manager)
    recorder = Recorder(manager.writer, api_version=names.API_VERSION)
    license_copier.register(
        manager, shared, recorder, settings.load(None, {}, {}), deployed.namespace
    )
    # Claims carry the protection finalizer from their admission; deleting one waits for
    # this controller to release it.
    claim_protection.register(manager, shared, recorder)
    copies = manager.informer(pykube.Secret, name=license_copier.COPIES_INFORMER)
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), name="copier", daemon=True)
    thread.start()
    try:
        wait_for("the copier to sync and start", manager.is_leader, timeout=60)
        yield Copier(LICENSE_NS, deployed.namespace, shared, copies)
    finally:
        stop.set()
        thread.join(20)
        if made_license_ns:
            pykube.Namespace(api, {"metadata": {"name": LICENSE_NS}}).delete()
    assert not thread.is_alive(), "the manager did not stop"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Licenses:
    """Sources, classes, claims and namespaces of one test; removed afterwards."""

    def __init__(self, api: pykube.HTTPClient, deployed: Deployed, copier: Copier) -> None:
        self.api = api
        self.deployed = deployed
        self.copier = copier
        self.tag = uuid.uuid4().hex[:6]
        self.classes: list[str] = []
        self.namespaces: list[str] = []
        self.sources: list[pykube.Secret] = []

    # ---- making things --------------------------------------------------------------
    def source(
        self,
        token: str,
        name: str | None = None,
        *,
        labelled: bool = True,
        data: dict[str, str] | None = None,
    ) -> pykube.Secret:
        meta: Obj = {"name": name or f"nls-{self.tag}", "namespace": LICENSE_NS}
        if labelled:
            meta["labels"] = {names.LICENSE_SOURCE_LABEL: names.TRUE}
        secret = pykube.Secret(
            self.api,
            {"metadata": meta, "type": "Opaque", "data": data or {TOKEN_KEY: b64(token)}},
        )
        secret.create()
        self.sources.append(secret)
        return secret

    def next_class(self) -> str:
        """The name the next :meth:`gpu_class` gets."""
        return f"lic-{self.tag}-{len(self.classes)}"

    def gpu_class(self, secret_name: str, feature_type: int | None = None) -> str:
        name = self.next_class()
        license_: Obj = {"secretName": secret_name}
        if feature_type is not None:
            license_["featureType"] = feature_type
        GPUClass(
            self.api,
            {
                "apiVersion": names.API_VERSION,
                "kind": names.GPU_CLASS,
                "metadata": {"name": name},
                "spec": {
                    "vendor": "nvidia",
                    "model": "L40S",
                    "mode": "vgpu",
                    "profile": "L40S-24Q",
                    "source": {"devicePlugin": {"resourceName": "nvidia.com/L40S-24Q"}},
                    "license": license_,
                },
            },
        ).create()
        self.classes.append(name)
        return name

    def namespace(self, *, entitled: bool = True) -> str:
        name = f"t-lic-{self.tag}-{len(self.namespaces)}"
        labels = {names.VGPU_ENTITLED_LABEL: names.TRUE} if entitled else {}
        pykube.Namespace(self.api, {"metadata": {"name": name, "labels": labels}}).create()
        self.namespaces.append(name)
        return name

    def entitle(self, namespace: str, entitled: bool) -> None:
        """The hoster grants or takes back the vGPU entitlement."""

        def change(obj: Obj) -> None:
            labels = obj["metadata"].setdefault("labels", {})
            if entitled:
                labels[names.VGPU_ENTITLED_LABEL] = names.TRUE
            else:
                labels.pop(names.VGPU_ENTITLED_LABEL, None)

        mutate(pykube.Namespace.objects(self.api).get(name=namespace), change)

    def tenant(self, namespace: str) -> pykube.HTTPClient:
        """The namespace's tenant: ``edit`` there, nothing else."""
        return as_tenant(self.deployed.admin_kubeconfig, self.api, namespace)

    def claim(
        self,
        namespace: str,
        class_name: str,
        name: str = "hold",
        *,
        by: pykube.HTTPClient | None = None,
        bound: bool = True,
    ) -> GPUClaim:
        """A claim ordered by ``by`` (the admin when None); bound as the binder would."""
        claim = GPUClaim(
            by or self.api,
            {
                "apiVersion": names.API_VERSION,
                "kind": names.GPU_CLAIM,
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"className": class_name, "count": 1},
            },
        )
        claim.create()
        if bound:
            self.set_phase(claim, "Bound")
        return claim

    def set_phase(self, claim: GPUClaim, phase: str) -> None:
        def change(obj: Obj) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = phase
            if phase == "Bound":
                status["nodeName"] = NO_NODE
                status["boundTime"] = datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
            else:
                status.pop("nodeName", None)
                status.pop("boundTime", None)

        mutate(
            GPUClaim.objects(self.api, namespace=claim.namespace).get(name=claim.name),
            change,
            subresource="status",
        )

    def delete_claim(self, claim: GPUClaim) -> None:
        """Delete and wait until the copier's cache no longer has it."""
        GPUClaim.objects(self.api, namespace=claim.namespace).get(name=claim.name).delete()
        key = (claim.namespace, claim.name)
        wait_for(
            f"claim {'/'.join(key)} gone from the copier's cache",
            lambda: self.copier.caches.claims.store.get(key) is None,
            timeout=CONVERGE,
        )

    def edit_class(self, name: str, **license_: Any) -> None:
        """Set ``spec.license`` to ``license_`` (none given: remove it)."""

        def change(obj: Obj) -> None:
            if license_:
                obj["spec"]["license"] = license_
            else:
                obj["spec"].pop("license", None)

        mutate(GPUClass.objects(self.api).get(name=name), change)

    # ---- reading --------------------------------------------------------------------
    def copy(self, namespace: str, class_name: str) -> Obj | None:
        secret = pykube.Secret.objects(self.api, namespace=namespace).get_or_none(
            name=names.license_secret_name(class_name)
        )
        return None if secret is None else dict(secret.obj)

    def wait_copy(self, namespace: str, class_name: str, token: str, feature_type: int = 1) -> Obj:
        """Wait until the copy in ``namespace`` carries ``token`` and ``feature_type``."""

        def current() -> tuple[str, str] | None:
            copy = self.copy(namespace, class_name)
            if copy is None:
                return None
            data = copy.get("data") or {}
            return (
                base64.b64decode(data.get(TOKEN_KEY, "")).decode(),
                base64.b64decode(data.get(licensing.GRIDD_CONF_KEY, "")).decode(),
            )

        wait_for(
            f"license copy of {class_name} in {namespace} with token {token!r} and "
            f"FeatureType={feature_type}",
            current,
            until=lambda c: (
                c is not None and c[0] == token and f"\nFeatureType={feature_type}\n" in c[1]
            ),
            timeout=CONVERGE,
        )
        copy = self.copy(namespace, class_name)
        assert copy is not None
        return copy

    def wait_no_copy(self, namespace: str, class_name: str) -> None:
        wait_for(
            f"no license copy of {class_name} in {namespace}",
            lambda: self.copy(namespace, class_name),
            until=lambda c: c is None,
            timeout=CONVERGE,
        )

    def license_ready(self, class_name: str) -> Obj | None:
        cls = GPUClass.objects(self.api).get(name=class_name).obj
        return conditions.find((cls.get("status") or {}).get("conditions"), "LicenseReady")

    def wait_license_ready(self, class_name: str, status: str, reason: str) -> Obj:
        found = wait_for(
            f"LicenseReady={status} ({reason}) on class {class_name}",
            lambda: self.license_ready(class_name),
            until=lambda c: c is not None and (c["status"], c["reason"]) == (status, reason),
            timeout=CONVERGE,
        )
        assert found is not None
        return found

    def events(self, class_name: str, reason: str) -> list[Obj]:
        """Events about the class (cluster-scoped objects' Events live in ``default``)."""
        return [
            e.obj
            for e in pykube.Event.objects(self.api, namespace="default")
            if e.obj.get("involvedObject", {}).get("name") == class_name
            and e.obj.get("reason") == reason
        ]

    def wait_event(self, class_name: str, reason: str, fragment: str) -> Obj:
        found = wait_for(
            f"{reason} Event on class {class_name} mentioning {fragment!r}",
            lambda: [e for e in self.events(class_name, reason) if fragment in e["message"]],
            timeout=CONVERGE,
        )
        return found[0]

    # ---- cleanup --------------------------------------------------------------------
    def cleanup(self) -> None:
        for name in self.classes:
            cls = GPUClass.objects(self.api).get_or_none(name=name)
            if cls is None:
                continue
            if cls.obj["metadata"].get("finalizers"):
                cls.obj["metadata"]["finalizers"] = []
                replace(cls)
            cls.delete()
        for name in self.namespaces:
            pykube.Namespace(self.api, {"metadata": {"name": name}}).delete()
        for secret in self.sources:
            if secret.exists():
                secret.delete()


@pytest.fixture
def licenses(api: pykube.HTTPClient, deployed: Deployed, copier: Copier) -> Iterator[Licenses]:
    lic = Licenses(api, deployed, copier)
    yield lic
    lic.cleanup()


# ---- the legitimate path ----------------------------------------------------------------
def test_a_bound_claim_brings_a_copy_with_the_token_key_and_gridd_conf_only(
    licenses: Licenses,
) -> None:
    source = licenses.source(
        "token-one",
        data={TOKEN_KEY: b64("token-one"), "ca.key": b64("private"), "notes": b64("x")},
    )
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    licenses.claim(namespace, cls, by=licenses.tenant(namespace))

    copy = licenses.wait_copy(namespace, cls, "token-one", feature_type=1)
    meta = copy["metadata"]
    assert copy["type"] == "Opaque"
    assert meta["labels"][names.LICENSE_OF_LABEL] == cls
    assert set(copy["data"]) == {TOKEN_KEY, licensing.GRIDD_CONF_KEY}
    assert meta["annotations"][licensing.SOURCE_ANNOTATION] == f"{LICENSE_NS}/{source.name}"
    event = licenses.wait_event(cls, license_copier.COPIED, f"{namespace}/gpu-license-{cls}")
    assert event["type"] == "Normal"
    assert event["involvedObject"]["kind"] == names.GPU_CLASS
    ready = licenses.wait_license_ready(cls, "True", licensing.SOURCE_READY)
    assert f"{LICENSE_NS}/{source.name}" in ready["message"]


def test_the_copy_follows_the_source_token_and_the_feature_type(licenses: Licenses) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    licenses.claim(namespace, cls)
    licenses.wait_copy(namespace, cls, "token-one")

    source.obj["data"][TOKEN_KEY] = b64("token-two")
    replace(source)
    copy = licenses.wait_copy(namespace, cls, "token-two", feature_type=1)
    assert (
        copy["metadata"]["annotations"][licensing.SOURCE_VERSION_ANNOTATION]
        == source.obj["metadata"]["resourceVersion"]
    )

    licenses.edit_class(cls, secretName=source.name, featureType=4)
    copy = licenses.wait_copy(namespace, cls, "token-two", feature_type=4)
    assert copy["metadata"]["annotations"][licensing.FEATURE_TYPE_ANNOTATION] == "4"
    licenses.wait_event(cls, license_copier.COPIED, "FeatureType=4")


def test_a_copy_stays_while_a_bound_claim_remains_and_goes_with_the_last(
    licenses: Licenses,
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace, other = licenses.namespace(), licenses.namespace()
    first = licenses.claim(namespace, cls, "first")
    last = licenses.claim(namespace, cls, "last")
    licenses.claim(other, cls)
    licenses.wait_copy(namespace, cls, "token-one")
    licenses.wait_copy(other, cls, "token-one")

    licenses.delete_claim(first)
    # A source change makes the copier look at every namespace after the claim has gone:
    # the copy that one claim still needs is kept (and updated).
    source.obj["data"][TOKEN_KEY] = b64("token-two")
    replace(source)
    licenses.wait_copy(namespace, cls, "token-two")

    licenses.delete_claim(last)
    licenses.wait_no_copy(namespace, cls)
    licenses.wait_event(cls, license_copier.REMOVED, f"{namespace}/gpu-license-{cls}")
    # The same pass kept the other namespace's copy.
    assert licenses.copy(other, cls) is not None
    licenses.wait_copy(other, cls, "token-two")


def test_switching_the_license_off_losing_the_source_or_the_class_removes_copies(
    licenses: Licenses,
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    licenses.claim(namespace, cls)
    licenses.wait_copy(namespace, cls, "token-one")

    licenses.edit_class(cls)  # spec.license removed
    licenses.wait_no_copy(namespace, cls)
    wait_for(
        f"no LicenseReady condition on {cls}",
        lambda: licenses.license_ready(cls),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )
    licenses.edit_class(cls, secretName=source.name)
    licenses.wait_copy(namespace, cls, "token-one")

    source.delete()
    licenses.wait_no_copy(namespace, cls)
    licenses.wait_license_ready(cls, "False", licensing.SOURCE_NOT_FOUND)
    licenses.wait_event(cls, license_copier.SOURCE_REFUSED, source.name)
    licenses.source("token-three", name=source.name)
    licenses.wait_copy(namespace, cls, "token-three")
    licenses.wait_license_ready(cls, "True", licensing.SOURCE_READY)

    GPUClass.objects(licenses.api).get(name=cls).delete()
    licenses.wait_no_copy(namespace, cls)


# ---- the attacks, as a tenant with edit -------------------------------------------------
def test_a_bound_claim_in_a_namespace_without_the_entitlement_gets_no_copy(
    licenses: Licenses,
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    plain = licenses.namespace(entitled=False)
    entitled = licenses.namespace()
    # The tenant's claim (as a marked template claim would be) got bound without the order
    # webhook's entitlement check; an entitled tenant's claim beside it.
    licenses.claim(plain, cls, by=licenses.tenant(plain))
    licenses.claim(entitled, cls)

    licenses.wait_copy(entitled, cls, "token-one")
    # That pass judged both namespaces: the one without the entitlement has no copy.
    assert licenses.copy(plain, cls) is None

    licenses.entitle(plain, True)
    licenses.wait_copy(plain, cls, "token-one")
    licenses.entitle(plain, False)
    licenses.wait_no_copy(plain, cls)
    licenses.wait_event(cls, license_copier.REMOVED, "not entitled to vGPU")
    assert licenses.copy(entitled, cls) is not None


def test_a_copy_goes_when_the_claim_is_no_longer_bound(licenses: Licenses) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    claim = licenses.claim(namespace, cls, by=licenses.tenant(namespace), bound=False)
    other = licenses.namespace()
    licenses.claim(other, cls)
    licenses.wait_copy(other, cls, "token-one")
    assert licenses.copy(namespace, cls) is None  # Pending: no copy

    licenses.set_phase(claim, "Bound")
    licenses.wait_copy(namespace, cls, "token-one")
    licenses.set_phase(claim, "Lost")  # its node went: no unit held, no VM runs
    licenses.wait_no_copy(namespace, cls)
    licenses.wait_event(cls, license_copier.REMOVED, "no Bound claim")


@pytest.mark.parametrize(
    ("secret_name", "make", "reason"),
    [
        pytest.param(
            names.WEBHOOK_CERT_SECRET, None, licensing.SOURCE_NOT_FOUND, id="webhook-cert"
        ),
        pytest.param(None, "unlabelled", licensing.SOURCE_NOT_LABELLED, id="unlabelled"),
        pytest.param(None, "no-token", licensing.NO_TOKEN_KEY, id="no-token-key"),
    ],
)
def test_a_class_naming_anything_but_a_labelled_source_gets_no_copy_and_a_condition(
    licenses: Licenses, secret_name: str | None, make: str | None, reason: str
) -> None:
    if secret_name == names.WEBHOOK_CERT_SECRET:
        # The operator's own certificate Secret exists, with its CA key.
        assert (
            pykube.Secret.objects(
                licenses.api, namespace=licenses.copier.operator_namespace
            ).get_or_none(name=secret_name)
            is not None
        )
    if make == "unlabelled":
        secret_name = licenses.source("token-one", labelled=False).name
    elif make == "no-token":
        secret_name = licenses.source("x", data={"token": b64("token-one")}).name
    assert secret_name is not None
    namespace = licenses.namespace()
    # The tenant's claim is Bound (and cached) before the class exists.
    claim = licenses.claim(namespace, licenses.next_class(), by=licenses.tenant(namespace))
    wait_for(
        "the copier's cache to see the claim Bound",
        lambda: licenses.copier.caches.claims.store.get((namespace, claim.name)),
        until=lambda c: c is not None and (c.get("status") or {}).get("phase") == "Bound",
        timeout=CONVERGE,
    )
    cls = licenses.gpu_class(secret_name)

    cond = licenses.wait_license_ready(cls, "False", reason)
    assert cond["message"].startswith(f"spec.license.secretName={secret_name!r}: ")
    assert f"labelled {names.LICENSE_SOURCE_LABEL}" in cond["message"]
    event = licenses.wait_event(cls, license_copier.SOURCE_REFUSED, secret_name)
    assert event["type"] == "Warning"
    # The claim was Bound and cached before the class existed, so the pass that wrote the
    # condition judged its namespace: no copy.
    assert licenses.copy(namespace, cls) is None

    if make == "unlabelled":
        # Labelling it is the hoster's act that makes it a source.
        secret = pykube.Secret.objects(licenses.api, namespace=LICENSE_NS).get(name=secret_name)
        secret.obj["metadata"]["labels"] = {names.LICENSE_SOURCE_LABEL: names.TRUE}
        replace(secret)
        licenses.wait_copy(namespace, cls, "token-one")
        licenses.wait_license_ready(cls, "True", licensing.SOURCE_READY)


def test_a_secret_the_copier_did_not_make_is_left_alone(licenses: Licenses) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    copy_name = names.license_secret_name(cls)
    namespace = licenses.namespace()
    tenant = licenses.tenant(namespace)
    foreign = pykube.Secret(
        tenant,
        {
            "metadata": {"name": copy_name, "namespace": namespace},
            "type": "Opaque",
            "data": {"mine": b64("tenant data")},
        },
    )
    foreign.create()
    # Carries the label but not the copy's name: not a copy either, though no claim of the
    # class is in its namespace.
    bystander_ns = licenses.namespace()
    bystander = pykube.Secret(
        licenses.tenant(bystander_ns),
        {
            "metadata": {
                "name": "not-a-copy",
                "namespace": bystander_ns,
                "labels": {names.LICENSE_OF_LABEL: cls},
            },
            "data": {"mine": b64("other data")},
        },
    )
    bystander.create()
    other = licenses.namespace()
    claim = licenses.claim(namespace, cls, by=tenant)
    licenses.claim(other, cls)

    event = licenses.wait_event(cls, license_copier.CONFLICT, f"{namespace}/{copy_name}")
    assert event["type"] == "Warning"
    licenses.wait_copy(other, cls, "token-one")  # the conflict holds up no other namespace

    # No claim of the class is left beside the foreign Secret; a source change makes the
    # copier pass over every namespace once more.
    licenses.delete_claim(claim)
    source.obj["data"][TOKEN_KEY] = b64("token-two")
    replace(source)
    licenses.wait_copy(other, cls, "token-two")

    after = pykube.Secret.objects(licenses.api, namespace=namespace).get(name=copy_name).obj
    assert after["metadata"]["resourceVersion"] == foreign.obj["metadata"]["resourceVersion"]
    assert after["data"] == {"mine": b64("tenant data")}
    assert names.LICENSE_OF_LABEL not in (after["metadata"].get("labels") or {})
    kept = pykube.Secret.objects(licenses.api, namespace=bystander_ns).get(name="not-a-copy").obj
    assert kept["metadata"]["resourceVersion"] == bystander.obj["metadata"]["resourceVersion"]


def test_a_copy_whose_annotations_a_tenant_edited_is_rewritten(licenses: Licenses) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    tenant = licenses.tenant(namespace)
    licenses.claim(namespace, cls, by=tenant)
    licenses.wait_copy(namespace, cls, "token-one")

    mine = pykube.Secret.objects(tenant, namespace=namespace).get(
        name=names.license_secret_name(cls)
    )
    mine.obj["data"]["extra"] = b64("x")
    mine.obj["metadata"]["annotations"][licensing.DIGEST_ANNOTATION] = "sha256:forged"
    replace(mine)

    wait_for(
        f"the copy of {cls} in {namespace} restored",
        lambda: licenses.copy(namespace, cls),
        until=lambda c: c is not None and set(c["data"]) == {TOKEN_KEY, licensing.GRIDD_CONF_KEY},
        timeout=CONVERGE,
    )


def test_many_labelled_large_secrets_do_not_fill_the_copiers_cache(licenses: Licenses) -> None:
    """~1,100 labelled 1 MiB Secrets would exhaust the operator's 1 GiB: the copies' cache
    keeps their metadata only."""
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    namespace = licenses.namespace()
    tenant = licenses.tenant(namespace)
    blob = base64.b64encode(b"\0" * 960 * 1024).decode()
    count = 24
    for i in range(count):
        pykube.Secret(
            tenant,
            {
                "metadata": {
                    "name": f"junk-{i}",
                    "namespace": namespace,
                    "labels": {names.LICENSE_OF_LABEL: cls},
                    "annotations": {"pad": "p" * 64 * 1024},
                },
                "data": {"blob": blob},
            },
        ).create()
    licenses.claim(namespace, cls, by=tenant)
    licenses.wait_copy(namespace, cls, "token-one")  # the copier still works

    store = licenses.copier.copies.store
    keys = [(namespace, f"junk-{i}") for i in range(count)]
    keys.append((namespace, names.license_secret_name(cls)))
    cached = wait_for(
        f"the copier's cache to hold the {count} labelled Secrets and the copy",
        lambda: [store.get(key) for key in keys],
        until=all,
        timeout=CONVERGE,
    )
    for obj in cached:
        assert obj is not None
        assert "data" not in obj
        assert "pad" not in (obj["metadata"].get("annotations") or {})
    held = sum(len(repr(o)) for o in cached)
    print(f"copies cache: {count} Secrets of 960 KiB data + 64 KiB annotations held in {held} B")
    assert held < count * 2048
