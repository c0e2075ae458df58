"""The admission policies' parameter: what the ConfigMap ``gpu-operator-policy-params``
(operator namespace) must hold for the policies in ``config/policy`` to judge.

The API server runs those policies even while the operator is down, so everything they
compare with lives in that ConfigMap, as plain strings (CEL reads ``params.data``):

* ``resourceNames``: every GPUClass's ``spec.source.devicePlugin.resourceName``, sorted,
  without duplicates, joined by commas (a resource name never contains one). Several
  classes may share one; DRA classes name none. Empty when no class names one;
* ``operatorServiceAccount``, ``kubevirtServiceAccount``: the usernames the policies let
  through (the settings of the same names);
* ``exemptNamespaces``: the namespaces the policies leave alone, sorted, comma-joined.

The keys and their order are fixed here, once; the controller writes what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gpuoperator.model import classes

RESOURCE_NAMES: Final = "resourceNames"
OPERATOR_SERVICE_ACCOUNT: Final = "operatorServiceAccount"
KUBEVIRT_SERVICE_ACCOUNT: Final = "kubevirtServiceAccount"
EXEMPT_NAMESPACES: Final = "exemptNamespaces"
#: Every key the operator owns in the ConfigMap.
KEYS: Final = (
    RESOURCE_NAMES,
    OPERATOR_SERVICE_ACCOUNT,
    KUBEVIRT_SERVICE_ACCOUNT,
    EXEMPT_NAMESPACES,
)
SEPARATOR: Final = ","


def resource_names(gpu_classes: Iterable[dict[str, Any]]) -> list[str]:
    """The sorted set of the classes' device-plugin resource names (DRA classes add none)."""
    return sorted({name for name in (classes.resource_name(c) for c in gpu_classes) if name})


def data(
    gpu_classes: Iterable[dict[str, Any]],
    *,
    operator_service_account: str,
    kubevirt_service_account: str,
    exempt_namespaces: Iterable[str],
) -> dict[str, str]:
    """The ConfigMap's ``data`` the policies need, from the classes and the settings."""
    exempt = sorted({ns.strip() for ns in exempt_namespaces if ns.strip()})
    return {
        RESOURCE_NAMES: SEPARATOR.join(resource_names(gpu_classes)),
        OPERATOR_SERVICE_ACCOUNT: operator_service_account.strip(),
        KUBEVIRT_SERVICE_ACCOUNT: kubevirt_service_account.strip(),
        EXEMPT_NAMESPACES: SEPARATOR.join(exempt),
    }


def changes(current: dict[str, Any] | None, wanted: dict[str, str]) -> dict[str, str]:
    """The keys of ``wanted`` whose value ``current`` (the ConfigMap's data) lacks or
    differs on; other keys of ``current`` (a hoster's notes) are left alone."""
    have = current or {}
    return {key: value for key, value in wanted.items() if have.get(key) != value}
