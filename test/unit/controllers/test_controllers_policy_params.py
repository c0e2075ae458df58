"""The policy-params controller on in-memory caches and a writer double: it updates the
shipped ConfigMap (under its resourceVersion) with the classes' resource names and the
settings when they differ, keeps other keys, writes nothing when it is current, and never
creates it."""

from __future__ import annotations

from typing import Any

import pykube

from controllers import policy_params as controller
from gpuoperator import names, settings
from gpuoperator.runtime.client import Kind
from harness import objects
from harness.offline import OfflineManager, offline_caches

Obj = dict[str, Any]
NS = "gpu-operator-system"
KEY = (NS, names.POLICY_PARAMS_CONFIGMAP)
OPERATOR = f"system:serviceaccount:{NS}:gpu-operator"


class Writer:
    def __init__(self) -> None:
        self.replaced: list[tuple[Kind, Obj]] = []

    def replace(self, kind: Kind, obj: Obj, **_: Any) -> Obj:
        self.replaced.append((kind, obj))
        return obj


def world(configmap: Obj | None, exempt: str = "") -> tuple[controller.PolicyParams, Writer]:
    manager = OfflineManager()
    caches = offline_caches(manager)
    for name, resource in (("l40s", "nvidia.com/L40S-24Q"), ("a10", "nvidia.com/A10")):
        caches.classes.store.put(objects.gpuclass(name, resource=resource))
    params = manager.informer(pykube.ConfigMap, name="policy-params")
    if configmap is not None:
        params.store.put(configmap)
    writer = Writer()
    loaded = settings.load({"operatorServiceAccount": OPERATOR, "exemptNamespaces": exempt}, {}, {})
    return controller.PolicyParams(caches, params, writer, loaded), writer


def configmap(data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.POLICY_PARAMS_CONFIGMAP,
            "namespace": NS,
            "resourceVersion": "7",
        },
        "data": data,
    }


def test_a_stale_configmap_is_updated_under_its_resource_version_keeping_other_keys() -> None:
    reconciler, writer = world(
        configmap({"resourceNames": "", "note": "the hoster's"}), exempt="hoster,tools"
    )
    assert reconciler.reconcile(KEY) is None
    [(kind, written)] = writer.replaced
    assert kind is pykube.ConfigMap
    assert written["metadata"]["resourceVersion"] == "7"
    assert written["data"] == {
        "resourceNames": "nvidia.com/A10,nvidia.com/L40S-24Q",
        "deviceClassNames": "",
        "operatorServiceAccount": OPERATOR,
        "kubevirtServiceAccount": "system:serviceaccount:kubevirt:kubevirt-controller",
        "exemptNamespaces": "hoster,tools",
        "note": "the hoster's",
    }


def test_a_current_configmap_is_not_written() -> None:
    reconciler, writer = world(
        configmap(
            {
                "resourceNames": "nvidia.com/A10,nvidia.com/L40S-24Q",
                "deviceClassNames": "",
                "operatorServiceAccount": OPERATOR,
                "kubevirtServiceAccount": "system:serviceaccount:kubevirt:kubevirt-controller",
                "exemptNamespaces": "",
            }
        )
    )
    assert reconciler.reconcile(KEY) is None
    assert writer.replaced == []


def test_a_missing_configmap_is_not_created() -> None:
    reconciler, writer = world(None)
    assert reconciler.reconcile(KEY) is None
    assert writer.replaced == []


def test_dra_classes_publish_their_device_classes_and_an_extended_resource_name() -> None:
    """A DRA class's DeviceClass is listed in deviceClassNames; when that DeviceClass has an
    extendedResourceName, the name joins resourceNames (kube-scheduler would hand a pod
    asking for it a device of the class)."""
    reconciler, writer = world(configmap({}))
    reconciler.caches.classes.store.put(
        objects.gpuclass("h100", source={"dra": {"deviceClassName": "h100.example.com"}})
    )
    reconciler.caches.classes.store.put(
        objects.gpuclass("b200", source={"dra": {"deviceClassName": "b200.example.com"}})
    )
    reconciler.caches.device_classes.store.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "h100.example.com"},
            "spec": {"extendedResourceName": "example.com/h100"},
        }
    )
    assert reconciler.reconcile(KEY) is None
    [(_, written)] = writer.replaced
    assert written["data"]["deviceClassNames"] == "b200.example.com,h100.example.com"
    assert written["data"]["resourceNames"] == (
        "example.com/h100,nvidia.com/A10,nvidia.com/L40S-24Q"
    )
