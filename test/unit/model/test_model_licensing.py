"""License copies: which classes are licensed, which Secrets may be sources (the license
namespace's labelled ones with the token key), what a copy holds (the source's token key as
it is plus a ``gridd.conf`` with the featureType, nothing else), which namespaces need one
(entitled, with a Bound claim), what the copies' cache keeps, and when a copy must be
rewritten or re-made."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from gpuoperator import names
from gpuoperator.model import licensing
from harness import objects

Obj = dict[str, Any]

TOKEN = base64.b64encode(b"eyJhbGciOi...token").decode()
OTHER = base64.b64encode(b"second-key").decode()
SOURCE_CONF = base64.b64encode(b"FeatureType=2\nServerAddress=evil\n").decode()


def gpu_class(name: str = "l40s", mode: str = "vgpu", **license_: Any) -> Obj:
    extra: dict[str, Any] = {"license": license_} if license_ else {}
    return objects.gpuclass(name, mode=mode, **extra)


LICENSE_NS = "gpu-licenses"
SOURCE_LABELS = {names.LICENSE_SOURCE_LABEL: names.TRUE}


def source(
    data: Obj | None = None,
    *,
    type_: str = "Opaque",
    rv: str = "41",
    namespace: str = LICENSE_NS,
    labels: Obj | None = None,
) -> Obj:
    return objects.secret(
        "nls-token",
        namespace,
        data={"client_configuration_token.tok": TOKEN} if data is None else data,
        rv=rv,
        type_=type_,
        labels=SOURCE_LABELS if labels is None else labels,
    )


def claim(
    namespace: str,
    class_name: str = "l40s",
    *,
    phase: str | None = "Bound",
    deleting: bool = False,
) -> Obj:
    return objects.claim(
        f"c-{namespace}",
        namespace=namespace,
        class_name=class_name,
        phase=phase,
        node="n1" if phase == "Bound" else None,
        deleting=deleting,
    )


def decoded_conf(secret: Obj) -> str:
    return base64.b64decode(secret["data"][licensing.GRIDD_CONF_KEY]).decode()


# ---- reading the class --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(gpu_class(secretName="s"), 1, id="unset-is-vgpu"),
        pytest.param(gpu_class(secretName="s", featureType=1), 1, id="one"),
        pytest.param(gpu_class(secretName="s", featureType=4), 4, id="four"),
        pytest.param(gpu_class(secretName="s", featureType=2), 1, id="not-admitted-is-default"),
        pytest.param(gpu_class(secretName="s", featureType="4"), 1, id="string-is-not-a-number"),
        pytest.param(gpu_class(secretName="s", featureType=True), 1, id="boolean-is-not-a-number"),
        pytest.param(gpu_class(), 1, id="no-license"),
        pytest.param({"spec": None}, 1, id="null-spec"),
        pytest.param({"spec": {"license": None}}, 1, id="null-license"),
    ],
)
def test_feature_type(cls: Obj, expected: int) -> None:
    assert licensing.feature_type(cls) == expected


@pytest.mark.parametrize(
    ("cls", "secret", "licensed"),
    [
        pytest.param(gpu_class(secretName="nls"), "nls", True, id="vgpu-with-license"),
        pytest.param(gpu_class(), "", False, id="vgpu-without-license"),
        pytest.param(gpu_class(secretName=""), "", False, id="empty-secret-name"),
        pytest.param(gpu_class(featureType=4), "", False, id="no-secret-name"),
        pytest.param(
            gpu_class(mode="passthrough", secretName="nls"), "nls", False, id="passthrough-never"
        ),
        pytest.param({"metadata": {"name": "x"}}, "", False, id="no-spec"),
    ],
)
def test_a_class_is_licensed_when_vgpu_with_a_secret(cls: Obj, secret: str, licensed: bool) -> None:
    assert licensing.secret_name(cls) == secret
    assert licensing.licensed(cls) is licensed


# ---- gridd.conf -----------------------------------------------------------------------------
@pytest.mark.parametrize("feature_type", [1, 4])
def test_gridd_conf_sets_only_the_feature_type(feature_type: int) -> None:
    text = licensing.gridd_conf(feature_type)
    assert text.endswith("\n")
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == [f"FeatureType={feature_type}"]


# ---- the copy -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "src", "data_keys", "feature_type"),
    [
        pytest.param(
            gpu_class(secretName="nls-token"),
            source(),
            {"client_configuration_token.tok": TOKEN},
            1,
            id="token-and-default-feature-type",
        ),
        pytest.param(
            gpu_class(secretName="nls-token", featureType=4),
            source(),
            {"client_configuration_token.tok": TOKEN},
            4,
            id="compute-server",
        ),
        pytest.param(
            gpu_class(secretName="nls-token"),
            source({"client_configuration_token.tok": TOKEN, "ca.key": OTHER, "b": OTHER}),
            {"client_configuration_token.tok": TOKEN},
            1,
            id="only-the-token-key-copied",
        ),
        pytest.param(
            gpu_class(secretName="nls-token"),
            source({"client_configuration_token.tok": TOKEN, "gridd.conf": SOURCE_CONF}),
            {"client_configuration_token.tok": TOKEN},
            1,
            id="source-gridd-conf-not-copied",
        ),
        pytest.param(
            gpu_class(secretName="nls-token"),
            source({}),
            {},
            1,
            id="empty-source",
        ),
        pytest.param(
            gpu_class(secretName="nls-token"),
            source(type_="kubernetes.io/tls"),
            {"client_configuration_token.tok": TOKEN},
            1,
            id="copy-is-opaque-whatever-the-source",
        ),
    ],
)
def test_desired_copy(cls: Obj, src: Obj, data_keys: Obj, feature_type: int) -> None:
    out = licensing.desired_copy(cls, src, "tenant-a")
    meta = out["metadata"]
    assert (out["apiVersion"], out["kind"], out["type"]) == ("v1", "Secret", "Opaque")
    assert (meta["name"], meta["namespace"]) == ("gpu-license-l40s", "tenant-a")
    assert meta["labels"] == {names.LICENSE_OF_LABEL: "l40s"}
    assert meta["annotations"] == {
        licensing.SOURCE_ANNOTATION: "gpu-licenses/nls-token",
        licensing.SOURCE_VERSION_ANNOTATION: "41",
        licensing.FEATURE_TYPE_ANNOTATION: str(feature_type),
        licensing.DIGEST_ANNOTATION: licensing.data_digest(out["data"]),
    }
    assert {k: v for k, v in out["data"].items() if k != "gridd.conf"} == data_keys
    assert decoded_conf(out) == licensing.gridd_conf(feature_type)
    assert licensing.is_copy(out, "l40s")


def test_desired_copy_is_idempotent_and_does_not_alias_the_source() -> None:
    cls, src = gpu_class(secretName="nls-token"), source()
    before = copy.deepcopy(src)
    first = licensing.desired_copy(cls, src, "t")
    assert first == licensing.desired_copy(cls, src, "t")
    first["data"]["client_configuration_token.tok"] = "changed"
    assert src == before


# ---- who needs a copy -----------------------------------------------------------------------
NAMESPACES = {
    "a": objects.namespace("a", entitled=True),
    "b": objects.namespace("b", entitled=True),
    "plain": objects.namespace("plain"),
    "other-value": objects.namespace("other-value", labels={names.VGPU_ENTITLED_LABEL: "yes"}),
}


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        pytest.param([], set(), id="no-claims"),
        pytest.param([claim("a")], {"a"}, id="one"),
        pytest.param([claim("a"), claim("a"), claim("b")], {"a", "b"}, id="one-per-namespace"),
        pytest.param([claim("a", deleting=True)], {"a"}, id="bound-being-deleted-still-holds"),
        pytest.param([claim("a", phase="Pending")], set(), id="pending"),
        pytest.param([claim("a", phase="Lost")], set(), id="lost"),
        pytest.param([claim("a", phase=None)], set(), id="no-status"),
        pytest.param([claim("a", phase="Pending"), claim("a")], {"a"}, id="another-bound-keeps-it"),
        pytest.param([claim("plain")], set(), id="not-entitled"),
        pytest.param([claim("other-value")], set(), id="entitlement-label-not-true"),
        pytest.param([claim("unknown")], set(), id="namespace-unknown"),
        pytest.param([claim("a", "other")], set(), id="other-class"),
        pytest.param([{"metadata": {"namespace": "a"}}], set(), id="no-spec"),
        pytest.param(
            [
                {
                    "metadata": {},
                    "spec": {"className": "l40s"},
                    "status": {"phase": "Bound", "nodeName": "n1"},
                }
            ],
            set(),
            id="no-namespace",
        ),
    ],
)
def test_namespaces_needing(claims: list[Obj], expected: set[str]) -> None:
    assert (
        licensing.namespaces_needing(gpu_class(secretName="s"), claims, NAMESPACES.get) == expected
    )


# ---- which Secrets may be sources -----------------------------------------------------------
CLS = gpu_class(secretName="nls-token")


@pytest.mark.parametrize(
    ("src", "reason", "fragments"),
    [
        pytest.param(
            None,
            licensing.SOURCE_NOT_FOUND,
            [
                "spec.license.secretName='nls-token'",
                "no Secret 'nls-token' in the license namespace gpu-licenses",
            ],
            id="missing",
        ),
        pytest.param(
            source(namespace="gpu-operator"),
            licensing.SOURCE_OUTSIDE_LICENSE_NAMESPACE,
            ["Secret gpu-operator/nls-token is not in the license namespace"],
            id="other-namespace",
        ),
        pytest.param(
            source(labels={}),
            licensing.SOURCE_NOT_LABELLED,
            ["(it has no such label)"],
            id="unlabelled",
        ),
        pytest.param(
            source(labels={names.LICENSE_SOURCE_LABEL: "True"}),
            licensing.SOURCE_NOT_LABELLED,
            ["(it has the value 'True')"],
            id="label-not-true",
        ),
        pytest.param(
            source({"token": TOKEN}),
            licensing.NO_TOKEN_KEY,
            ["has no non-empty key client_configuration_token.tok"],
            id="no-token-key",
        ),
        pytest.param(
            source({"client_configuration_token.tok": ""}),
            licensing.NO_TOKEN_KEY,
            ["has no non-empty key"],
            id="empty-token",
        ),
    ],
)
def test_source_refusal_names_the_field_the_value_and_what_is_allowed(
    src: Obj | None, reason: str, fragments: list[str]
) -> None:
    refusal = licensing.source_refusal(CLS, src, license_namespace=LICENSE_NS)
    assert refusal is not None
    assert refusal.reason == reason
    assert refusal.message.startswith("spec.license.secretName='nls-token': ")
    for fragment in fragments:
        assert fragment in refusal.message
    assert (
        "a license source must be a Secret in the license namespace gpu-licenses, labelled "
        'gpu.cozystack.io/license-source: "true", holding the token under the key '
        "client_configuration_token.tok" in refusal.message
    )


def test_a_labelled_source_of_the_license_namespace_with_the_token_is_accepted() -> None:
    assert licensing.source_refusal(CLS, source(), license_namespace=LICENSE_NS) is None


@pytest.mark.parametrize(
    ("license_ns", "operator_ns", "refused"),
    [
        ("gpu-licenses", "gpu-operator-system", False),
        ("gpu-operator-system", "gpu-operator-system", True),
    ],
)
def test_the_license_namespace_is_never_the_operators(
    license_ns: str, operator_ns: str, refused: bool
) -> None:
    refusal = licensing.license_namespace_refusal(license_ns, operator_ns)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.startswith("licenseNamespace='gpu-operator-system' is the operator's own")
        assert "gpu-licenses" in refusal


# ---- which Secrets are copies ---------------------------------------------------------------
def secret(name: str, labels: Obj | None) -> Obj:
    meta: Obj = {"name": name, "namespace": "t"}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(secret("gpu-license-l40s", {names.LICENSE_OF_LABEL: "l40s"}), True, id="copy"),
        pytest.param(secret("gpu-license-l40s", None), False, id="unlabelled-same-name"),
        pytest.param(secret("gpu-license-l40s", {}), False, id="empty-labels"),
        pytest.param(
            secret("gpu-license-l40s", {names.LICENSE_OF_LABEL: "a10"}), False, id="other-class"
        ),
        pytest.param(
            secret("my-secret", {names.LICENSE_OF_LABEL: "l40s"}), False, id="label-other-name"
        ),
    ],
)
def test_only_a_labelled_secret_of_the_copy_name_is_a_copy(obj: Obj, expected: bool) -> None:
    assert licensing.is_copy(obj, "l40s") is expected


# ---- rewriting ------------------------------------------------------------------------------
DESIRED = licensing.desired_copy(gpu_class(secretName="nls-token"), source(), "t")


def existing(**changes: Any) -> Obj:
    """A stored copy as the API server returns it, with top-level or metadata changes."""
    out = copy.deepcopy(DESIRED)
    out["metadata"].update(uid="u1", resourceVersion="7")
    for key, value in changes.items():
        if key in ("labels", "annotations"):
            out["metadata"][key] = value
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


ANN = DESIRED["metadata"]["annotations"]
LABELS = DESIRED["metadata"]["labels"]


@pytest.mark.parametrize(
    ("current", "outdated"),
    [
        pytest.param(existing(), False, id="same"),
        pytest.param(existing(type=None), False, id="type-omitted-means-opaque"),
        pytest.param(existing(labels={**LABELS, "team": "x"}), False, id="foreign-label-kept"),
        pytest.param(
            existing(annotations={**ANN, "note": "x"}), False, id="foreign-annotation-kept"
        ),
        pytest.param(
            existing(annotations={**ANN, licensing.DIGEST_ANNOTATION: "sha256:0"}),
            True,
            id="digest-differs",
        ),
        pytest.param(
            existing(
                annotations={k: v for k, v in ANN.items() if k != licensing.DIGEST_ANNOTATION}
            ),
            True,
            id="made-by-a-release-without-digest",
        ),
        pytest.param(
            existing(data={**DESIRED["data"], "stale": OTHER}),
            False,
            id="data-is-not-read-from-the-cache",
        ),
        pytest.param(
            existing(annotations={**ANN, licensing.SOURCE_VERSION_ANNOTATION: "40"}),
            True,
            id="source-version-changed",
        ),
        pytest.param(
            existing(annotations={**ANN, licensing.FEATURE_TYPE_ANNOTATION: "4"}),
            True,
            id="feature-type-changed",
        ),
        pytest.param(existing(annotations={}), True, id="annotations-lost"),
        pytest.param(existing(type="kubernetes.io/tls"), True, id="type-differs"),
    ],
)
def test_copy_outdated(current: Obj, outdated: bool) -> None:
    assert licensing.copy_outdated(current, DESIRED) is outdated
    assert licensing.copy_outdated(licensing.slim_copy(current), DESIRED) is outdated


def test_a_copy_is_judged_the_same_from_its_slim_cached_form() -> None:
    assert not licensing.copy_outdated(licensing.slim_copy(existing()), DESIRED)


# ---- what the copies' cache keeps -----------------------------------------------------------
def test_slim_copy_keeps_identity_class_label_own_annotations_and_type_only() -> None:
    big = "A" * 100_000
    tenant_made = existing(
        data={"blob": big},
        labels={**LABELS, "pad": "x" * 63, "more": "y"},
        annotations={**ANN, "pad": big, licensing.SOURCE_ANNOTATION: big},
        immutable=True,
    )
    tenant_made["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f": big}}]

    slim = licensing.slim_copy(tenant_made)

    assert set(slim) == {"metadata", "type", "immutable"}
    assert set(slim["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "labels",
        "annotations",
    }
    assert slim["metadata"]["labels"] == LABELS
    assert set(slim["metadata"]["annotations"]) == set(ANN)
    assert len(repr(slim)) < 2_000
    assert licensing.is_copy(slim, "l40s")


@pytest.mark.parametrize(
    ("current", "replaceable"),
    [
        pytest.param(existing(), True, id="opaque"),
        pytest.param(existing(type=None), True, id="type-omitted"),
        pytest.param(existing(immutable=False), True, id="explicitly-mutable"),
        pytest.param(existing(immutable=True), False, id="immutable"),
        pytest.param(existing(type="kubernetes.io/tls"), False, id="type-is-immutable"),
    ],
)
def test_replaceable(current: Obj, replaceable: bool) -> None:
    assert licensing.replaceable(current, DESIRED) is replaceable


def test_updated_copy_carries_the_desired_content_and_keeps_the_rest() -> None:
    current = existing(
        data={"old": OTHER},
        labels={**LABELS, "team": "x"},
        annotations={**ANN, licensing.SOURCE_VERSION_ANNOTATION: "40", "note": "y"},
        stringData={"leak": "x"},
    )
    out = licensing.updated_copy(current, DESIRED)
    meta = out["metadata"]
    assert (meta["resourceVersion"], meta["uid"]) == ("7", "u1")  # the write's precondition
    assert out["data"] == DESIRED["data"]
    assert "stringData" not in out
    assert meta["labels"] == {**LABELS, "team": "x"}
    assert meta["annotations"] == {**ANN, "note": "y"}
    assert not licensing.copy_outdated(out, DESIRED)
    assert current["data"] == {"old": OTHER}  # the cached object is not modified
