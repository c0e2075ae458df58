"""The admission policies' parameter: what the ConfigMap ``gpu-operator-policy-params``
(operator namespace) must hold for the policies in ``config/policy`` to judge.

The API server runs those policies even while the operator is down, so everything they
compare with lives in that ConfigMap, as plain strings (CEL reads ``params.data``):

* ``resourceNames``: every GPUClass's ``spec.source.devicePlugin.resourceName``, and the
  ``spec.extendedResourceName`` of the DeviceClass a DRA class names (a pod asking for that
  name gets a device of the class from kube-scheduler, so it is guarded as a device-plugin
  resource is), sorted, without duplicates, joined by commas (a resource name never
  contains one). Several classes may share one. Empty when no class names one;
* ``deviceClassNames``: the DeviceClass every DRA class names (``spec.source.dra``), sorted,
  without duplicates, comma-joined (a DeviceClass name is a DNS subdomain): the ResourceClaims
  and templates that name one are the binder's alone to make (docs/design.md §5 "DRA
  classes", one allocator per device);
* ``operatorServiceAccount``, ``kubevirtServiceAccount``: the usernames the policies let
  through (the settings of the same names);
* ``exemptNamespaces``: the namespaces the policies leave alone, sorted, comma-joined.

The keys and their order are fixed here, once; the controller writes what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuoperator.model import classes

RESOURCE_NAMES: Final = "resourceNames"
DEVICE_CLASS_NAMES: Final = "deviceClassNames"
OPERATOR_SERVICE_ACCOUNT: Final = "operatorServiceAccount"
KUBEVIRT_SERVICE_ACCOUNT: Final = "kubevirtServiceAccount"
EXEMPT_NAMESPACES: Final = "exemptNamespaces"
#: Every key the operator owns in the ConfigMap.
KEYS: Final = (
    RESOURCE_NAMES,
    DEVICE_CLASS_NAMES,
    OPERATOR_SERVICE_ACCOUNT,
    KUBEVIRT_SERVICE_ACCOUNT,
    EXEMPT_NAMESPACES,
)
SEPARATOR: Final = ","


def device_class_names(gpu_classes: Iterable[dict[str, Any]]) -> list[str]:
    """The sorted set of the DeviceClasses the DRA classes name."""
    return sorted({s.device_class_name for s in (classes.dra(c) for c in gpu_classes) if s})


def extended_resource_name(device_class: Mapping[str, Any] | None) -> str:
    """A DeviceClass's ``spec.extendedResourceName`` (DRA extended resources: a pod that
    requests that name is given a device of the class by kube-scheduler), empty when unset."""
    spec = device_class.get("spec") if isinstance(device_class, Mapping) else None
    value = spec.get("extendedResourceName") if isinstance(spec, Mapping) else None
    return value.strip() if isinstance(value, str) else ""


def resource_names(
    gpu_classes: Iterable[dict[str, Any]],
    device_classes: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """The sorted set of the classes' device-plugin resource names and the extended resource
    names of the DeviceClasses (by name, ``device_classes``) the DRA classes name."""
    found: set[str] = set()
    for cls in gpu_classes:
        source = classes.dra(cls)
        if source is None:
            found.add(classes.resource_name(cls))
        else:
            found.add(extended_resource_name((device_classes or {}).get(source.device_class_name)))
    return sorted(name for name in found if name)


def data(
    gpu_classes: Iterable[dict[str, Any]],
    *,
    device_classes: Mapping[str, Mapping[str, Any]] | None = None,
    operator_service_account: str,
    kubevirt_service_account: str,
    exempt_namespaces: Iterable[str],
) -> dict[str, str]:
    """The ConfigMap's ``data`` the policies need, from the classes, the DeviceClasses by
    name (``device_classes``: only their ``spec.extendedResourceName`` is read) and the
    settings."""
    listed = list(gpu_classes)
    exempt = sorted({ns.strip() for ns in exempt_namespaces if ns.strip()})
    return {
        RESOURCE_NAMES: SEPARATOR.join(resource_names(listed, device_classes)),
        DEVICE_CLASS_NAMES: SEPARATOR.join(device_class_names(listed)),
        OPERATOR_SERVICE_ACCOUNT: operator_service_account.strip(),
        KUBEVIRT_SERVICE_ACCOUNT: kubevirt_service_account.strip(),
        EXEMPT_NAMESPACES: SEPARATOR.join(exempt),
    }


def changes(current: dict[str, Any] | None, wanted: dict[str, str]) -> dict[str, str]:
    """The keys of ``wanted`` whose value ``current`` (the ConfigMap's data) lacks or
    differs on; other keys of ``current`` (a hoster's notes) are left alone."""
    have = current or {}
    return {key: value for key, value in wanted.items() if have.get(key) != value}
