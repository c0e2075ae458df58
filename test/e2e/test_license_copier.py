"""The license copier on the real control plane (DESIGN.md §5 "Licenses"): a vGPU class's
license Secret is copied into every namespace that holds a claim of the class, follows its
source and featureType, goes when no longer needed, and never touches a Secret it did not
make.

The copier runs in-process on its own ``Manager`` (no leader election, no servers) beside the
claim-protection controller (claims are deleted here, and each carries its finalizer from
admission), with the default settings, so the license namespace is the operator's own: a
namespace of this module.
Each test uses classes of its own (cluster-scoped), removed afterwards.
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykube
import pytest
from prometheus_client import CollectorRegistry

from controllers import claim_protection, license_copier
from gpuoperator import caches, names, settings
from gpuoperator.caches import Caches
from gpuoperator.kinds import GPUClaim, GPUClass
from gpuoperator.model import licensing
from gpuoperator.runtime.client import Client, load_config
from gpuoperator.runtime.managing import Manager, ManagerOptions
from gpuoperator.runtime.recording import Recorder
from harness.kube import Obj, replace
from harness.waiting import wait_for

TOKEN_KEY = "client_configuration_token.tok"
CONVERGE = 20.0  # seconds: a copy must follow a change well within this


@dataclass
class Copier:
    """The running copier: its license (= operator) namespace and the caches it reads."""

    license_namespace: str
    caches: Caches


@pytest.fixture(scope="module")
def copier(kubeconfig: Path, api: pykube.HTTPClient) -> Iterator[Copier]:
    ns = f"gpu-operator-lic-{uuid.uuid4().hex[:5]}"
    pykube.Namespace(api, {"metadata": {"name": ns}}).create()
    manager = Manager(
        Client(lambda: load_config(str(kubeconfig))),
        ManagerOptions(
            namespace=ns,
            identity="license-copier-e2e",
            leader_election=False,
            health_address=None,
            metrics_address=None,
        ),
        registry=CollectorRegistry(),
    )
    shared = caches.register(manager)
    recorder = Recorder(manager.writer, api_version=names.API_VERSION)
    license_copier.register(manager, shared, recorder, settings.load(None, {}, {}), ns)
    # Claims carry the protection finalizer from their admission; deleting one waits for
    # this controller to release it.
    claim_protection.register(manager, shared, recorder)
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), name="copier", daemon=True)
    thread.start()
    try:
        wait_for("the copier to sync and start", manager.is_leader, timeout=60)
        yield Copier(ns, shared)
    finally:
        stop.set()
        thread.join(20)
        pykube.Namespace(api, {"metadata": {"name": ns}}).delete()
    assert not thread.is_alive(), "the manager did not stop"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Licenses:
    """Sources, classes, claims and namespaces of one test; removed afterwards."""

    def __init__(self, api: pykube.HTTPClient, copier: Copier) -> None:
        self.api = api
        self.copier = copier
        self.tag = uuid.uuid4().hex[:6]
        self.classes: list[str] = []
        self.namespaces: list[str] = []

    # ---- making things --------------------------------------------------------------
    def source(self, token: str, name: str | None = None) -> pykube.Secret:
        secret = pykube.Secret(
            self.api,
            {
                "metadata": {
                    "name": name or f"nls-{self.tag}",
                    "namespace": self.copier.license_namespace,
                },
                "type": "Opaque",
                "data": {TOKEN_KEY: b64(token)},
            },
        )
        secret.create()
        return secret

    def gpu_class(self, secret_name: str, feature_type: int | None = None) -> str:
        name = f"lic-{self.tag}-{len(self.classes)}"
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

    def namespace(self) -> str:
        name = f"t-lic-{self.tag}-{len(self.namespaces)}"
        pykube.Namespace(self.api, {"metadata": {"name": name}}).create()
        self.namespaces.append(name)
        return name

    def claim(self, namespace: str, class_name: str, name: str = "hold") -> GPUClaim:
        # Entitled, so an order webhook (when one is deployed) admits the vGPU claim.
        ns = pykube.Namespace.objects(self.api).get(name=namespace)
        ns.obj["metadata"].setdefault("labels", {})[names.VGPU_ENTITLED_LABEL] = names.TRUE
        replace(ns)
        claim = GPUClaim(
            self.api,
            {
                "apiVersion": names.API_VERSION,
                "kind": names.GPU_CLAIM,
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"className": class_name, "count": 1},
            },
        )
        claim.create()
        return claim

    def delete_claim(self, claim: GPUClaim) -> None:
        """Delete and wait until the copier's cache no longer has it."""
        claim.delete()
        key = (claim.namespace, claim.name)
        wait_for(
            f"claim {'/'.join(key)} gone from the copier's cache",
            lambda: self.copier.caches.claims.store.get(key) is None,
            timeout=CONVERGE,
        )

    def edit_class(self, name: str, **license_: Any) -> None:
        """Set ``spec.license`` to ``license_`` (none given: remove it)."""
        cls = GPUClass.objects(self.api).get(name=name)
        if license_:
            cls.obj["spec"]["license"] = license_
        else:
            cls.obj["spec"].pop("license", None)
        replace(cls)

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


@pytest.fixture
def licenses(api: pykube.HTTPClient, copier: Copier) -> Iterator[Licenses]:
    lic = Licenses(api, copier)
    yield lic
    lic.cleanup()


def test_a_claim_brings_a_copy_with_the_token_and_gridd_conf(
    licenses: Licenses, namespace: str
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    licenses.claim(namespace, cls)

    copy = licenses.wait_copy(namespace, cls, "token-one", feature_type=1)
    meta = copy["metadata"]
    assert copy["type"] == "Opaque"
    assert meta["labels"][names.LICENSE_OF_LABEL] == cls
    assert set(copy["data"]) == {TOKEN_KEY, licensing.GRIDD_CONF_KEY}
    assert meta["annotations"][licensing.SOURCE_ANNOTATION] == (
        f"{licenses.copier.license_namespace}/{source.name}"
    )
    event = licenses.wait_event(cls, license_copier.COPIED, f"{namespace}/gpu-license-{cls}")
    assert event["type"] == "Normal"
    assert event["involvedObject"]["kind"] == names.GPU_CLASS


def test_the_copy_follows_the_source_token_and_the_feature_type(
    licenses: Licenses, namespace: str
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    licenses.claim(namespace, cls)
    licenses.wait_copy(namespace, cls, "token-one")

    source.obj["data"][TOKEN_KEY] = b64("token-two")
    replace(source)
    copy = licenses.wait_copy(namespace, cls, "token-two", feature_type=1)
    assert (
        copy["metadata"]["annotations"][licensing.SOURCE_VERSION_ANNOTATION]
        == (source.obj["metadata"]["resourceVersion"])
    )

    licenses.edit_class(cls, secretName=source.name, featureType=4)
    copy = licenses.wait_copy(namespace, cls, "token-two", feature_type=4)
    assert copy["metadata"]["annotations"][licensing.FEATURE_TYPE_ANNOTATION] == "4"
    licenses.wait_event(cls, license_copier.COPIED, "FeatureType=4")


def test_a_copy_stays_while_a_claim_remains_and_goes_with_the_last(
    licenses: Licenses, namespace: str
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    other = licenses.namespace()
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
    licenses: Licenses, namespace: str
) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    licenses.claim(namespace, cls)
    licenses.wait_copy(namespace, cls, "token-one")

    licenses.edit_class(cls)  # spec.license removed
    licenses.wait_no_copy(namespace, cls)
    licenses.edit_class(cls, secretName=source.name)
    licenses.wait_copy(namespace, cls, "token-one")

    source.delete()
    licenses.wait_no_copy(namespace, cls)
    licenses.wait_event(cls, license_copier.SOURCE_MISSING, source.name)
    licenses.source("token-three", name=source.name)
    licenses.wait_copy(namespace, cls, "token-three")

    GPUClass.objects(licenses.api).get(name=cls).delete()
    licenses.wait_no_copy(namespace, cls)


def test_a_secret_the_copier_did_not_make_is_left_alone(licenses: Licenses, namespace: str) -> None:
    source = licenses.source("token-one")
    cls = licenses.gpu_class(source.name)
    copy_name = names.license_secret_name(cls)
    foreign = pykube.Secret(
        licenses.api,
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
        licenses.api,
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
    claim = licenses.claim(namespace, cls)
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
