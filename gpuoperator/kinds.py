"""The product's kinds and KubeVirt's that pykube-ng has no class for, declared once for the
whole operator (their names are :mod:`gpuoperator.names`)."""

from __future__ import annotations

from pykube.objects import APIObject, NamespacedAPIObject

from gpuoperator import names


class GPUClass(APIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_CLASSES
    kind = names.GPU_CLASS


class GPUClaim(NamespacedAPIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_CLAIMS
    kind = names.GPU_CLAIM


class GPUNode(APIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.GPU_NODES
    kind = names.GPU_NODE


class Workload(NamespacedAPIObject):  # type: ignore[misc]
    version = names.API_VERSION
    endpoint = names.WORKLOADS
    kind = names.WORKLOAD


class VirtualMachineInstance(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.VMIS
    kind = names.VMI_KIND


class VirtualMachine(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.VMS
    kind = names.VM_KIND


class VirtualMachineInstanceMigration(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.VMIMS
    kind = names.VMIM_KIND


class KubeVirt(NamespacedAPIObject):  # type: ignore[misc]
    version = names.KUBEVIRT_API_VERSION
    endpoint = names.KUBEVIRTS
    kind = names.KUBEVIRT_KIND


class ResourceSlice(APIObject):  # type: ignore[misc]
    version = names.DRA_API_VERSION
    endpoint = names.RESOURCE_SLICES
    kind = names.RESOURCE_SLICE_KIND


class DeviceClass(APIObject):  # type: ignore[misc]
    version = names.DRA_API_VERSION
    endpoint = names.DEVICE_CLASSES
    kind = names.DEVICE_CLASS_KIND


class DeviceTaintRule(APIObject):  # type: ignore[misc]
    version = names.DEVICE_TAINT_RULE_API_VERSION
    endpoint = names.DEVICE_TAINT_RULES
    kind = names.DEVICE_TAINT_RULE_KIND


class ResourceClaim(NamespacedAPIObject):  # type: ignore[misc]
    version = names.DRA_API_VERSION
    endpoint = names.RESOURCE_CLAIMS
    kind = names.RESOURCE_CLAIM_KIND
