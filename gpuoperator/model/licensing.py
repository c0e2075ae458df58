"""vGPU license copies: what a class's license Secret looks like in a tenant namespace,
which namespaces need one, and which Secrets may be copied at all.

A ``vgpu`` class may name a license source (``spec.license.secretName``). A source is
copied only when it is a Secret of the **license namespace** (the setting
``licenseNamespace``, default ``gpu-licenses``, never the operator's own: its webhook
certificate Secret must never be a source), labelled ``gpu.cozystack.io/license-source:
"true"`` by the hoster, and holding the NVIDIA client configuration token under the key
``client_configuration_token.tok`` (:data:`TOKEN_KEY`, the file name NVIDIA's guest driver
reads from ``/etc/nvidia/ClientConfigToken/``). Only that key is copied; any other key of
the source stays where it is. :func:`source_refusal` says why a named Secret is not a
source, naming the field, the value and what is allowed.

A VM's guest needs the token and a ``gridd.conf`` saying which feature to license, and it
can only mount Secrets of its own namespace, so the license copier keeps a copy
``gpu-license-<class>`` in every namespace that is entitled to vGPU and holds a **Bound**
claim of the class (:func:`namespaces_needing`). A Bound claim being deleted still counts:
it holds its units (and is charged) until it is gone, and its VM may run until then.

A copy is recognised by its label ``gpu.cozystack.io/license-of: <class>`` *and* its name
``gpu-license-<class>`` (``is_copy``): a Secret without both is never the copier's to change
or delete. Annotations record what a copy was made from (the source's namespace/name and
resourceVersion), the featureType and a digest of the data written, so a copy is judged
from its metadata alone (:func:`copy_outdated`): the copier caches copies without their
data (:func:`slim_copy`), since any tenant can make Secrets carrying the label.

Every function is pure and idempotent: the same class, source and claims give the same copy.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import classes, tenants

Obj = dict[str, Any]

#: ``spec.license.featureType`` when unset (the schema defaults it too): 1 is NVIDIA vGPU
#: (vPC/vApps); 4 is NVIDIA Virtual Compute Server.
DEFAULT_FEATURE_TYPE: Final = 1
FEATURE_TYPES: Final = frozenset({1, 4})

#: The one key of a source that is copied: NVIDIA's client configuration token, under the
#: file name the guest driver looks for.
TOKEN_KEY: Final = "client_configuration_token.tok"  # noqa: S105 - a key name, not a secret
#: The key of the generated guest configuration in a copy.
GRIDD_CONF_KEY: Final = "gridd.conf"

#: Annotations on a copy: the source it was made from (``<namespace>/<name>``), the source's
#: resourceVersion at that time, the featureType written into its ``gridd.conf``, and the
#: digest of the data written (:func:`data_digest`).
SOURCE_ANNOTATION: Final = f"{names.DOMAIN}/license-source"
SOURCE_VERSION_ANNOTATION: Final = f"{names.DOMAIN}/license-source-version"
FEATURE_TYPE_ANNOTATION: Final = f"{names.DOMAIN}/license-feature-type"
DIGEST_ANNOTATION: Final = f"{names.DOMAIN}/license-digest"
_OWN_ANNOTATIONS: Final = (
    SOURCE_ANNOTATION,
    SOURCE_VERSION_ANNOTATION,
    FEATURE_TYPE_ANNOTATION,
    DIGEST_ANNOTATION,
)

SECRET_TYPE: Final = "Opaque"  # noqa: S105 - a Secret type, not a secret

#: Reasons of a class's ``LicenseReady`` condition.
SOURCE_READY: Final = "SourceReady"
SOURCE_NOT_FOUND: Final = "SourceNotFound"
SOURCE_OUTSIDE_LICENSE_NAMESPACE: Final = "SourceOutsideLicenseNamespace"
SOURCE_NOT_LABELLED: Final = "SourceNotLabelled"
NO_TOKEN_KEY: Final = "NoTokenKey"  # noqa: S105 - a reason, not a secret


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _license(cls: Obj) -> Mapping[str, Any]:
    return _mapping(_mapping(cls.get("spec")).get("license"))


def secret_name(cls: Obj) -> str:
    """The source Secret's name (``spec.license.secretName``); ``""`` without a license."""
    return str(_license(cls).get("secretName") or "")


def licensed(cls: Obj) -> bool:
    """Whether the class's VMs get license copies: a ``vgpu`` class with a license Secret.

    The schema forbids ``spec.license`` on other modes; a class that somehow has one anyway
    gets no copies (a passthrough GPU is licensed inside the guest, not by the operator).
    """
    return classes.is_vgpu(cls) and bool(secret_name(cls))


def feature_type(cls: Obj) -> int:
    """``spec.license.featureType``: 1 (vGPU) or 4 (Virtual Compute Server); 1 when unset or
    not one of those (the schema admits only 1 and 4)."""
    value = _license(cls).get("featureType")
    if isinstance(value, int) and not isinstance(value, bool) and value in FEATURE_TYPES:
        return value
    return DEFAULT_FEATURE_TYPE


def gridd_conf(feature_type: int) -> str:
    """The guest's ``/etc/nvidia/gridd.conf``, minimal on purpose.

    With a client configuration token (placed by the guest in
    ``/etc/nvidia/ClientConfigToken/``) the license server's address comes from the token,
    so ``FeatureType`` is the only setting the guest driver needs: 1 licenses NVIDIA vGPU,
    4 NVIDIA Virtual Compute Server. Everything else keeps the driver's defaults.
    """
    return (
        "# Written by gpuoperator from the GPUClass's spec.license.featureType.\n"
        "# The license server comes from the client configuration token beside this file.\n"
        f"FeatureType={feature_type}\n"
    )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# ---- which Secrets may be sources -----------------------------------------------------------
@dataclass(frozen=True)
class SourceRefusal:
    """Why a class's named Secret is not copied: the ``LicenseReady`` condition's reason and
    a message naming the field, the value and what is allowed."""

    reason: str
    message: str


def _allowed(license_namespace: str) -> str:
    return (
        f"a license source must be a Secret in the license namespace {license_namespace}, "
        f'labelled {names.LICENSE_SOURCE_LABEL}: "{names.TRUE}", holding the token under the '
        f"key {TOKEN_KEY}"
    )


def source_refusal(
    cls: Obj, source_secret: Obj | None, *, license_namespace: str
) -> SourceRefusal | None:
    """Why ``source_secret`` (the Secret ``spec.license.secretName`` names, as read in the
    license namespace; ``None``: no such Secret there) may not be copied for ``cls``;
    ``None`` when it may.

    Refused: no Secret of that name in the license namespace (a Secret of another namespace
    — the operator's own certificate Secret, say — is never looked for); a Secret outside
    the license namespace; one without the label ``gpu.cozystack.io/license-source: "true"``
    (the hoster marks what may leave the namespace); one whose token key is missing or
    empty."""
    name = secret_name(cls)
    field = f"spec.license.secretName={name!r}"
    allowed = _allowed(license_namespace)
    if source_secret is None:
        return SourceRefusal(
            SOURCE_NOT_FOUND,
            f"{field}: no Secret {name!r} in the license namespace {license_namespace}; {allowed}",
        )
    meta = _mapping(source_secret.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    if namespace != license_namespace or meta.get("name") != name:
        return SourceRefusal(
            SOURCE_OUTSIDE_LICENSE_NAMESPACE,
            f"{field}: Secret {namespace}/{meta.get('name')} is not in the license namespace; "
            f"{allowed}",
        )
    label = _mapping(meta.get("labels")).get(names.LICENSE_SOURCE_LABEL)
    if label != names.TRUE:
        has = "no such label" if label is None else f"the value {label!r}"
        return SourceRefusal(
            SOURCE_NOT_LABELLED,
            f"{field}: Secret {license_namespace}/{name} does not carry the label "
            f'{names.LICENSE_SOURCE_LABEL}: "{names.TRUE}" (it has {has}); {allowed}',
        )
    token = _mapping(source_secret.get("data")).get(TOKEN_KEY)
    if not isinstance(token, str) or not token:
        return SourceRefusal(
            NO_TOKEN_KEY,
            f"{field}: Secret {license_namespace}/{name} has no non-empty key {TOKEN_KEY}; "
            f"{allowed} (only that key is copied)",
        )
    return None


def source_ready_message(cls: Obj, license_namespace: str) -> str:
    """The ``LicenseReady=True`` message."""
    return (
        f"license source {license_namespace}/{secret_name(cls)} is copied (key {TOKEN_KEY} "
        f"and a gridd.conf with FeatureType={feature_type(cls)}) into each vGPU-entitled "
        f"namespace holding a Bound claim of this class"
    )


# ---- the copy -------------------------------------------------------------------------------
def data_digest(data: Mapping[str, Any]) -> str:
    """A digest of a copy's ``data`` (keys and base64 values), recorded on the copy: a copy
    whose recorded digest differs from the one wanted is rewritten, whatever its source
    version says (a copy made by an older release with other keys, say)."""
    canonical = json.dumps(dict(sorted(data.items())), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def desired_copy(cls: Obj, source_secret: Obj, namespace: str) -> Obj:
    """The copy of ``cls``'s license for ``namespace``.

    ``data``: the source's token key as it is (already base64) and the generated
    ``gridd.conf``; nothing else of the source. The copy is always ``Opaque`` (whatever the
    source's type), labelled with the class and annotated with the source, its
    resourceVersion, the featureType and the data's digest. Callers copy only sources
    :func:`source_refusal` accepts.
    """
    class_name = classes.name(cls)
    ft = feature_type(cls)
    source_meta = _mapping(source_secret.get("metadata"))
    data: dict[str, str] = {}
    token = _mapping(source_secret.get("data")).get(TOKEN_KEY)
    if isinstance(token, str) and token:
        data[TOKEN_KEY] = token
    data[GRIDD_CONF_KEY] = _b64(gridd_conf(ft))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.license_secret_name(class_name),
            "namespace": namespace,
            "labels": {names.LICENSE_OF_LABEL: class_name},
            "annotations": {
                SOURCE_ANNOTATION: f"{source_meta.get('namespace', '')}/"
                f"{source_meta.get('name', '')}",
                SOURCE_VERSION_ANNOTATION: str(source_meta.get("resourceVersion") or ""),
                FEATURE_TYPE_ANNOTATION: str(ft),
                DIGEST_ANNOTATION: data_digest(data),
            },
        },
        "type": SECRET_TYPE,
        "data": data,
    }


def slim_copy(secret: Obj) -> Obj:
    """What the copies' cache keeps of a Secret labelled ``gpu.cozystack.io/license-of``:
    its identity, the class label, the copier's own annotations, its type and whether it is
    immutable. No data, no other labels or annotations: any tenant can make such Secrets
    (up to 1 MiB each), and the cache must not grow with what they carry. The copy is
    judged from this alone (:func:`copy_outdated`); an update reads the exact copy first."""
    meta = _mapping(secret.get("metadata"))
    out_meta: Obj = {
        k: meta[k]
        for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
        if k in meta
    }
    label = _mapping(meta.get("labels")).get(names.LICENSE_OF_LABEL)
    if label is not None:
        out_meta["labels"] = {names.LICENSE_OF_LABEL: str(label)[:63]}
    annotations = _mapping(meta.get("annotations"))
    # Values bounded too: a copy's own annotations are short; a longer value is not ours.
    kept = {k: str(annotations[k])[:256] for k in _OWN_ANNOTATIONS if k in annotations}
    if kept:
        out_meta["annotations"] = kept
    out: Obj = {"metadata": out_meta}
    if isinstance(secret.get("type"), str):
        out["type"] = secret["type"][:256]
    if secret.get("immutable"):
        out["immutable"] = True
    return out


def is_copy(secret: Obj, class_name: str) -> bool:
    """Whether ``secret`` is the copier's copy for ``class_name``: the label names the class
    and the name is ``gpu-license-<class>``. A Secret that merely carries the label (another
    name) is someone else's."""
    meta = _mapping(secret.get("metadata"))
    return (
        bool(class_name)
        and _mapping(meta.get("labels")).get(names.LICENSE_OF_LABEL) == class_name
        and meta.get("name") == names.license_secret_name(class_name)
    )


def namespaces_needing(
    cls: Obj, claims: Iterable[Obj], namespace_of: Callable[[str], Obj | None]
) -> set[str]:
    """The namespaces that need ``cls``'s license: entitled to vGPU (``namespace_of`` gives
    the Namespace object, ``None`` when unknown: not entitled) and holding a Bound claim of
    the class.

    Only claims naming this class count (callers may pass any claims). A Bound claim being
    deleted still counts: it holds its units until it is gone, and its VM may run until
    then. A Pending or Lost claim holds no unit, so no VM of it runs: its namespace gets no
    copy until the claim is Bound again."""
    class_name = classes.name(cls)
    out: set[str] = set()
    for claim in claims:
        if _mapping(claim.get("spec")).get("className") != class_name or not gpuclaims.is_bound(
            claim
        ):
            continue
        namespace = str(_mapping(claim.get("metadata")).get("namespace") or "")
        if namespace and namespace not in out and tenants.vgpu_entitled(namespace_of(namespace)):
            out.add(namespace)
    return out


def copy_outdated(existing: Obj, desired: Obj) -> bool:
    """Whether ``existing`` (a cached copy: metadata, type, no data) must be rewritten to
    match ``desired``: its type, class label or the copier's annotations (source, source
    version, featureType, data digest) differ. Labels and annotations others added are not
    compared (and ``updated_copy`` keeps them)."""
    meta = _mapping(existing.get("metadata"))
    want = _mapping(desired.get("metadata"))
    labels = _mapping(meta.get("labels"))
    annotations = _mapping(meta.get("annotations"))
    want_annotations = _mapping(want.get("annotations"))
    return (
        (existing.get("type") or SECRET_TYPE) != desired.get("type")
        or labels.get(names.LICENSE_OF_LABEL)
        != _mapping(want.get("labels")).get(names.LICENSE_OF_LABEL)
        or any(annotations.get(k) != want_annotations.get(k) for k in _OWN_ANNOTATIONS)
    )


def replaceable(existing: Obj, desired: Obj) -> bool:
    """Whether ``existing`` can be brought to ``desired`` in place. A Secret's ``type`` is
    immutable, and so is the data of one marked ``immutable``: such a copy must be deleted
    and made again."""
    return not existing.get("immutable") and (existing.get("type") or SECRET_TYPE) == desired.get(
        "type"
    )


def updated_copy(existing: Obj, desired: Obj) -> Obj:
    """``existing`` (the whole Secret as read, with its resourceVersion, the write's
    precondition) carrying ``desired``'s data, type, label and annotations; other labels and
    annotations stay, other data keys go."""
    meta = dict(_mapping(existing.get("metadata")))
    want = _mapping(desired.get("metadata"))
    meta["labels"] = {**_mapping(meta.get("labels")), **_mapping(want.get("labels"))}
    meta["annotations"] = {
        **_mapping(meta.get("annotations")),
        **_mapping(want.get("annotations")),
    }
    out = {k: v for k, v in existing.items() if k != "stringData"}
    out.update(
        apiVersion="v1",
        kind="Secret",
        metadata=meta,
        type=desired.get("type"),
        data=dict(_mapping(desired.get("data"))),
    )
    return out


def license_namespace_refusal(license_namespace: str, operator_namespace: str) -> str | None:
    """Why ``license_namespace`` may not be the license namespace: it is the operator's own
    (which holds the webhooks' CA and serving key; a class naming that Secret would copy
    them into tenant namespaces). ``None`` when it may."""
    if license_namespace != operator_namespace:
        return None
    return (
        f"licenseNamespace={license_namespace!r} is the operator's own namespace: license "
        f"sources must live in a namespace of their own (default "
        f"{names.DEFAULT_LICENSE_NAMESPACE}), so that no Secret of the operator can be copied"
    )
