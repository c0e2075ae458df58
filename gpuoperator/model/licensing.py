"""vGPU license copies (DESIGN.md §5 "Licenses"): what a class's license Secret looks like in
a tenant namespace, and which namespaces need one.

A ``vgpu`` class may name a license Secret (``spec.license.secretName``) in the operator's
license namespace. That Secret holds the NVIDIA client configuration token (any key names:
every key of its ``data`` is copied as it is). A VM's guest needs the token and a
``gridd.conf`` saying which feature to license, and it can only mount Secrets of its own
namespace, so the license copier keeps a copy ``gpu-license-<class>`` in every namespace that
holds a claim of the class.

A copy is recognised by its label ``gpu.cozystack.io/license-of: <class>`` *and* its name
``gpu-license-<class>`` (``is_copy``): a Secret without both is never the copier's to change
or delete. Two annotations record what a copy was made from (the source's namespace/name and
resourceVersion) and the featureType, so a change of either is seen from the copy alone.

Every function is pure and idempotent: the same class, source and claims give the same copy.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import classes

Obj = dict[str, Any]

#: ``spec.license.featureType`` when unset (the schema defaults it too): 1 is NVIDIA vGPU
#: (vPC/vApps); 4 is NVIDIA Virtual Compute Server.
DEFAULT_FEATURE_TYPE: Final = 1
FEATURE_TYPES: Final = frozenset({1, 4})

#: The key of the generated guest configuration in a copy. A key of that name in the source
#: is not copied: the class's featureType decides what the guest licenses.
GRIDD_CONF_KEY: Final = "gridd.conf"

#: Annotations on a copy: the source it was made from (``<namespace>/<name>``), the source's
#: resourceVersion at that time, and the featureType written into its ``gridd.conf``.
SOURCE_ANNOTATION: Final = f"{names.DOMAIN}/license-source"
SOURCE_VERSION_ANNOTATION: Final = f"{names.DOMAIN}/license-source-version"
FEATURE_TYPE_ANNOTATION: Final = f"{names.DOMAIN}/license-feature-type"
_OWN_ANNOTATIONS: Final = (SOURCE_ANNOTATION, SOURCE_VERSION_ANNOTATION, FEATURE_TYPE_ANNOTATION)

SECRET_TYPE: Final = "Opaque"  # noqa: S105 - a Secret type, not a secret


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


def desired_copy(cls: Obj, source_secret: Obj, namespace: str) -> Obj:
    """The copy of ``cls``'s license for ``namespace``.

    ``data``: every key of the source's ``data`` as it is (already base64), except a
    ``gridd.conf`` the source may carry, plus the generated ``gridd.conf``. The copy is always
    ``Opaque`` (whatever the source's type), labelled with the class and annotated with the
    source and its resourceVersion.
    """
    class_name = classes.name(cls)
    ft = feature_type(cls)
    source_meta = _mapping(source_secret.get("metadata"))
    data = {
        str(k): v
        for k, v in _mapping(source_secret.get("data")).items()
        if k != GRIDD_CONF_KEY and isinstance(v, str)
    }
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
            },
        },
        "type": SECRET_TYPE,
        "data": data,
    }


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


def namespaces_needing(cls: Obj, claims: Iterable[Obj]) -> set[str]:
    """The namespaces that hold a claim of ``cls`` that is not being deleted.

    Only claims naming this class count (callers may pass any claims); a claim being deleted
    no longer needs the license once it is gone, and is not waited for.
    """
    class_name = classes.name(cls)
    out: set[str] = set()
    for claim in claims:
        meta = _mapping(claim.get("metadata"))
        if meta.get("deletionTimestamp"):
            continue
        if _mapping(claim.get("spec")).get("className") != class_name:
            continue
        namespace = meta.get("namespace")
        if namespace:
            out.add(str(namespace))
    return out


def copy_outdated(existing: Obj, desired: Obj) -> bool:
    """Whether ``existing`` must be rewritten to match ``desired``: its data, type, class
    label or the copier's annotations differ. Labels and annotations others added are not
    compared (and ``updated_copy`` keeps them)."""
    meta = _mapping(existing.get("metadata"))
    want = _mapping(desired.get("metadata"))
    labels = _mapping(meta.get("labels"))
    annotations = _mapping(meta.get("annotations"))
    want_annotations = _mapping(want.get("annotations"))
    return (
        dict(_mapping(existing.get("data"))) != dict(_mapping(desired.get("data")))
        or (existing.get("type") or SECRET_TYPE) != desired.get("type")
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
    """``existing`` (with its resourceVersion, the write's precondition) carrying
    ``desired``'s data, type, label and annotations; other labels and annotations stay."""
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
