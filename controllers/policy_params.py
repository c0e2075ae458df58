"""Policy parameters: the ConfigMap ``gpu-operator-policy-params`` in the operator's
namespace holds what the admission policies of ``config/policy`` compare with, and this
controller (leader only) keeps it current (``model.policy_params``): the sorted set of the
classes' resource names (device-plugin resources, and the extended resource name of a DRA
class's DeviceClass), the DeviceClasses the DRA classes name, and the effective settings
the policies read (operatorServiceAccount, kubevirtServiceAccount, exemptNamespaces).

One key, the ConfigMap's; woken by every GPUClass and DeviceClass event and by the
ConfigMap itself (an informer by name, so a hand edit or a re-apply of the manifests is
put right at once).

Why the ConfigMap is never created here: it ships with the manifests (so the policies
judge from the first apply, before any operator runs), and RBAC cannot restrict a create
by name. Without it the policies refuse what they guard (their parameterNotFoundAction is
Deny) and this controller logs that it is missing and waits for it (its informer wakes it
when the ConfigMap is applied again). Writes are updates of the whole ConfigMap under its
resourceVersion; only the keys above are touched, others are left as they are.
"""

from __future__ import annotations

import copy
from typing import Protocol

import pykube
import structlog

from gpuoperator import names, settings
from gpuoperator.caches import Caches
from gpuoperator.model import policy_params
from gpuoperator.runtime import errors, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.informing import Informer, InformerOptions
from gpuoperator.runtime.managing import ManagerOptions

log = structlog.get_logger(__name__)

NAME = "policy-params"


class ApiAccess(protocols.Replaces, Protocol):
    """What the controller asks of the API server: the ConfigMap replaced."""


class ManagerAccess(managing.Informs, managing.Controls, Protocol):
    """What ``register`` uses of the manager: the operator's namespace (its options), the
    ConfigMap's informer and the fenced writer."""

    @property
    def options(self) -> ManagerOptions: ...

    @property
    def writer(self) -> ApiAccess: ...


class PolicyParams:
    def __init__(
        self,
        caches: Caches,
        params: Informer,
        writer: ApiAccess,
        operator_settings: settings.Settings,
    ) -> None:
        self.caches = caches
        self.params = params
        self.writer = writer
        self.settings = operator_settings

    def wanted(self) -> dict[str, str]:
        device_classes = {
            str((dc.get("metadata") or {}).get("name")): dc
            for dc in self.caches.device_classes.store.values()
        }
        return policy_params.data(
            self.caches.classes.store.values(),
            device_classes=device_classes,
            operator_service_account=self.settings.operator_service_account,
            kubevirt_service_account=self.settings.kubevirt_service_account,
            exempt_namespaces=self.settings.exempt_namespaces,
        )

    def reconcile(self, key: Key) -> Result | None:
        namespace, name = key
        current = self.params.store.get(key)
        if current is None:
            log.warning(
                "policy parameters missing",
                controller=NAME,
                key=f"{namespace}/{name}",
                reason="ParamsMissing",
                hint="apply the manifests again (config/default ships the ConfigMap); until "
                "then the admission policies refuse what they guard",
            )
            return None
        changed = policy_params.changes(current.get("data"), self.wanted())
        if not changed:
            return None
        obj: Obj = copy.deepcopy(current)
        obj["data"] = {**(obj.get("data") or {}), **changed}
        try:
            self.writer.replace(pykube.ConfigMap, obj)
        except errors.NotFoundError:
            return None  # deleted meanwhile: its informer's event brings us back
        log.info(
            "policy parameters written",
            controller=NAME,
            key=f"{namespace}/{name}",
            reason="ParamsChanged",
            changed=changed,
        )
        return None


def register(
    manager: ManagerAccess, caches: Caches, operator_settings: settings.Settings
) -> Controller[Key]:
    namespace = manager.options.namespace
    key: Key = (namespace, names.POLICY_PARAMS_CONFIGMAP)
    params = manager.informer(
        pykube.ConfigMap,
        InformerOptions(
            namespace=namespace, field_selector=f"metadata.name={names.POLICY_PARAMS_CONFIGMAP}"
        ),
        name=NAME,
    )
    controller = manager.controller(
        NAME,
        PolicyParams(caches, params, manager.writer, operator_settings),
        workers=1,
        seed=lambda: [key],
    )
    manager.add_controller(
        controller,
        [
            (caches.classes, lambda _o: [key]),
            (caches.device_classes, lambda _o: [key]),
            (params, lambda _o: [key]),
        ],
    )
    return controller
