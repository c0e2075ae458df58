"""The operator's shared caches: one informer per kind, with the indexes its readers use.

Controllers and webhooks read these, never the API server, on their hot paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pykube

from gpuoperator.kinds import (
    DeviceClass,
    DeviceTaintRule,
    GPUClaim,
    GPUClass,
    GPUNode,
    KubeVirt,
    ResourceClaim,
    ResourceSlice,
    VirtualMachineInstance,
    VirtualMachineInstanceMigration,
    Workload,
)
from gpuoperator.model import claims as gpuclaims
from gpuoperator.model import gpu_hours, hold_admission, launcher_pods, slimming
from gpuoperator.runtime import indexing
from gpuoperator.runtime.informing import Informer, InformerOptions
from gpuoperator.runtime.managing import Informs

#: Index names.
BY_NAMESPACE = "namespace"
BY_NODE = "node"
BY_CLASS = "class"
#: ``namespace/name`` of a VMI an object may concern: a claim's controlling VMI and the VMI
#: its attachment names, a pod's VMI (``model.launcher_pods.vmi_name_of``). Readers narrow a
#: namespace's objects to these candidates and still apply their own rule to them.
BY_VMI = "vmi"


def _vmi_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def vmis_of_claim(claim: dict[str, Any]) -> list[str]:
    """The ``BY_VMI`` values of a claim: the VMIs that may be its user."""
    ns = str((claim.get("metadata") or {}).get("namespace") or "")
    return sorted(_vmi_key(ns, name) for name in gpuclaims.vmi_names(claim))


def vmi_of_pod(pod: dict[str, Any]) -> list[str]:
    """The ``BY_VMI`` value of a pod: the VMI the pod itself names (none for a plain pod)."""
    name = launcher_pods.vmi_name_of(pod)
    return [_vmi_key(str((pod.get("metadata") or {}).get("namespace") or ""), name)] if name else []


def own_key(obj: dict[str, Any]) -> list[indexing.Key]:
    """An object's own key: for controllers keyed by the objects they watch."""
    return [indexing.key_of(obj)]


def class_of_claim(claim: dict[str, Any]) -> list[indexing.Key]:
    """The key of the class a claim names (for controllers keyed by class)."""
    class_name = (claim.get("spec") or {}).get("className")
    return [("", class_name)] if class_name else []


@dataclass(frozen=True)
class Caches:
    nodes: Informer
    pods: Informer
    classes: Informer
    #: Claims as ``model.slimming.slim_claim`` keeps them: write from the API server's copy.
    claims: Informer
    gpunodes: Informer
    #: KubeVirt CRs (permittedHostDevices); optional: KubeVirt may not be installed.
    kubevirts: Informer
    namespaces: Informer
    quotas: Informer
    workloads: Informer
    #: VMIs (claim protection, placement) as ``model.slimming.slim_vmi`` keeps them; optional
    #: like the KubeVirt CR.
    vmis: Informer
    #: DRA (``resource.k8s.io/v1``, docs/design.md §5 "DRA classes"), optional: a cluster
    #: may not serve it. The drivers' ResourceSlices and the DeviceClasses, whole (without
    #: managedFields; drivers and admins write them), and every ResourceClaim as
    #: ``model.slimming.slim_resource_claim`` keeps it (tenants write them): what
    #: ``model.dra_devices`` reads to count a DRA class's devices.
    resource_slices: Informer
    device_classes: Informer
    resource_claims: Informer
    #: DeviceTaintRules (``resource.k8s.io/v1beta2``), whole: optional, a cluster serves them
    #: only with the DRADeviceTaintRules gate and that API version on (Kubernetes 1.36).
    device_taint_rules: Informer
    #: KubeVirt's VirtualMachineInstanceMigrations (docs/design.md §5 "Live migration"),
    #: optional like the VMIs: the drain starts one per node at a time, the migrations
    #: controller holds and ends them.
    migrations: Informer

    def class_keys(self) -> list[indexing.Key]:
        """Every class's key (to seed or wake controllers keyed by class)."""
        return [("", name) for _, name in self.classes.store]

    def served_vmi(self, claim: dict[str, Any]) -> dict[str, Any] | None:
        """The cached VM instance the claim serves (``gpu_hours.served_vmi_name``), if any."""
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        name = gpu_hours.served_vmi_name(claim)
        return self.vmis.store.get((namespace, name)) if name else None

    def hold_finder(self, namespace: str) -> Callable[[str], dict[str, Any] | None]:
        """``name -> the GPUClaim whose DRA hold the ResourceClaim ``namespace/name`` is``
        (``model.hold_admission.hold_of``, ``None``: nobody's), on the cached ResourceClaim,
        the namespace's GPUClaims and the classes (the pod and VMI webhooks). Nothing is read
        until a name is asked for: most pods and VMIs name no ResourceClaim."""

        def find(name: str) -> dict[str, Any] | None:
            return hold_admission.hold_of(
                name,
                self.resource_claims.store.get((namespace, name)),
                lambda claim: self.claims.store.get((namespace, claim)),
                lambda cls: self.classes.store.get(("", cls)),
            )

        return find

    def claims_of_vmi(self, namespace: str, vmi_name: str) -> list[dict[str, Any]]:
        """The cached claims controlled by or attached to a VMI of that name (candidates:
        the caller applies its own rule, e.g. ``model.claims.user``)."""
        return self.claims.store.by_index(BY_VMI, _vmi_key(namespace, vmi_name))

    def pods_of_vmi(self, namespace: str, vmi_name: str) -> list[dict[str, Any]]:
        """The cached pods that name a VMI of that name (``model.launcher_pods.vmi_name_of``:
        their controller, else their ``vm.kubevirt.io/name`` label)."""
        return self.pods.store.by_index(BY_VMI, _vmi_key(namespace, vmi_name))

    def served_vmis(self, claims: Iterable[dict[str, Any]]) -> dict[indexing.Key, dict[str, Any]]:
        """The cached VM instances ``claims`` serve, by ``(namespace, name)``."""
        out: dict[indexing.Key, dict[str, Any]] = {}
        for claim in claims:
            vmi = self.served_vmi(claim)
            if vmi is not None:
                namespace = str((claim.get("metadata") or {}).get("namespace") or "")
                out[(namespace, gpu_hours.served_vmi_name(claim))] = vmi
        return out


#: Every kind cached whole is cached without its managedFields. Tenants write VMIs and claims:
#: those keep only the fields the operator reads, bounded (``model.slimming``).
lean = slimming.without_managed_fields


def register(manager: Informs) -> Caches:
    """Create (once) the shared informers on ``manager``."""
    return Caches(
        nodes=manager.informer(pykube.Node, InformerOptions(transform=slimming.slim_node)),
        pods=manager.informer(
            pykube.Pod,
            InformerOptions(
                transform=slimming.slim_pod,
                indexers={
                    BY_NAMESPACE: indexing.by_namespace,
                    BY_NODE: indexing.by_field("spec", "nodeName"),
                    BY_VMI: vmi_of_pod,
                },
            ),
        ),
        classes=manager.informer(GPUClass, InformerOptions(transform=lean)),
        claims=manager.informer(
            GPUClaim,
            InformerOptions(
                transform=slimming.slim_claim,
                indexers={
                    BY_NAMESPACE: indexing.by_namespace,
                    BY_NODE: indexing.by_field("status", "nodeName"),
                    BY_CLASS: indexing.by_field("spec", "className"),
                    BY_VMI: vmis_of_claim,
                },
            ),
        ),
        gpunodes=manager.informer(GPUNode, InformerOptions(transform=lean)),
        kubevirts=manager.informer(KubeVirt, InformerOptions(optional=True, transform=lean)),
        namespaces=manager.informer(
            pykube.Namespace, InformerOptions(transform=slimming.slim_metadata)
        ),
        quotas=manager.informer(
            pykube.ResourceQuota,
            InformerOptions(transform=lean, indexers={BY_NAMESPACE: indexing.by_namespace}),
        ),
        workloads=manager.informer(
            Workload,
            InformerOptions(transform=lean, indexers={BY_NAMESPACE: indexing.by_namespace}),
        ),
        vmis=manager.informer(
            VirtualMachineInstance,
            InformerOptions(
                optional=True,
                transform=slimming.slim_vmi,
                indexers={BY_NAMESPACE: indexing.by_namespace},
            ),
        ),
        resource_slices=manager.informer(
            ResourceSlice,
            InformerOptions(
                optional=True,
                transform=lean,
                indexers={BY_NODE: indexing.by_field("spec", "nodeName")},
            ),
        ),
        device_classes=manager.informer(
            DeviceClass, InformerOptions(optional=True, transform=lean)
        ),
        device_taint_rules=manager.informer(
            DeviceTaintRule, InformerOptions(optional=True, transform=lean)
        ),
        resource_claims=manager.informer(
            ResourceClaim,
            InformerOptions(
                optional=True,
                transform=slimming.slim_resource_claim,
                indexers={BY_NAMESPACE: indexing.by_namespace},
            ),
        ),
        migrations=manager.informer(
            VirtualMachineInstanceMigration,
            InformerOptions(
                optional=True,
                transform=lean,
                indexers={BY_NAMESPACE: indexing.by_namespace},
            ),
        ),
    )
