"""What the admission policies' parameter ConfigMap holds (``model.policy_params``)."""

from __future__ import annotations

from typing import Any

from gpuoperator.model import policy_params

KUBEVIRT = "system:serviceaccount:kubevirt:kubevirt-controller"
OPERATOR = "system:serviceaccount:gpu-operator-system:gpu-operator"


def device_plugin(name: str, resource: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"source": {"devicePlugin": {"resourceName": resource}}},
    }


def dra(name: str, device_class: str = "gpu") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"source": {"dra": {"deviceClassName": device_class}}},
    }


def device_class(name: str, extended: str | None = None) -> dict[str, Any]:
    spec = {"extendedResourceName": extended} if extended is not None else {}
    return {"metadata": {"name": name}, "spec": spec}


def data(
    classes: list[dict[str, Any]],
    exempt: tuple[str, ...] = (),
    device_classes: dict[str, dict[str, Any]] | None = None,
) -> dict[str, str]:
    return policy_params.data(
        classes,
        device_classes=device_classes,
        operator_service_account=OPERATOR,
        kubevirt_service_account=KUBEVIRT,
        exempt_namespaces=exempt,
    )


def test_resource_names_are_sorted_unique_and_comma_joined() -> None:
    classes = [
        device_plugin("l40s", "nvidia.com/L40S-24Q"),
        device_plugin("a10", "nvidia.com/GA102GL_A10"),
        device_plugin("a10-spot", "nvidia.com/GA102GL_A10"),  # classes may share a resource
        dra("h100"),  # a DRA class names no extended resource
        {"metadata": {"name": "broken"}, "spec": {}},
    ]
    assert data(classes) == {
        "resourceNames": "nvidia.com/GA102GL_A10,nvidia.com/L40S-24Q",
        "deviceClassNames": "gpu",
        "operatorServiceAccount": OPERATOR,
        "kubevirtServiceAccount": KUBEVIRT,
        "exemptNamespaces": "",
    }


def test_no_class_gives_an_empty_list_and_every_key() -> None:
    got = data([])
    assert got["resourceNames"] == ""
    assert got["deviceClassNames"] == ""
    assert set(got) == set(policy_params.KEYS)


def test_device_class_names_are_the_dra_classes_sorted_and_unique() -> None:
    classes = [
        dra("h100", "h100.example.com"),
        dra("b200", "b200.example.com"),
        dra("h100-spot", "h100.example.com"),  # two classes may name one DeviceClass
        device_plugin("a10", "nvidia.com/GA102GL_A10"),
    ]
    assert data(classes)["deviceClassNames"] == "b200.example.com,h100.example.com"


def test_a_dra_device_classs_extended_resource_name_is_guarded_as_a_resource() -> None:
    classes = [
        dra("h100", "h100.example.com"),
        dra("b200", "b200.example.com"),  # its DeviceClass sets none
        dra("gone", "missing.example.com"),  # its DeviceClass is not there
        device_plugin("a10", "nvidia.com/GA102GL_A10"),
    ]
    device_classes = {
        "h100.example.com": device_class("h100.example.com", " example.com/h100 "),
        "b200.example.com": device_class("b200.example.com"),
        # A DeviceClass no DRA class names is not the catalog's: its name stays out.
        "other.example.com": device_class("other.example.com", "example.com/other"),
    }
    got = data(classes, device_classes=device_classes)
    assert got["resourceNames"] == "example.com/h100,nvidia.com/GA102GL_A10"


def test_exempt_namespaces_are_sorted_and_blank_entries_dropped() -> None:
    assert data([], ("tools", " ", "hoster", "tools"))["exemptNamespaces"] == "hoster,tools"


def test_usernames_are_written_trimmed() -> None:
    got = policy_params.data(
        [],
        operator_service_account=f" {OPERATOR}\n",
        kubevirt_service_account=KUBEVIRT,
        exempt_namespaces=(),
    )
    assert got["operatorServiceAccount"] == OPERATOR


def test_changes_names_only_the_keys_that_differ_and_leaves_others_alone() -> None:
    wanted = data([device_plugin("a10", "nvidia.com/GA102GL_A10")])
    current = {**wanted, "resourceNames": "", "note": "kept by the hoster"}
    assert policy_params.changes(current, wanted) == {"resourceNames": "nvidia.com/GA102GL_A10"}
    assert policy_params.changes(wanted, wanted) == {}
    assert policy_params.changes(None, wanted) == wanted
