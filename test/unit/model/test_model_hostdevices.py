"""KubeVirt's permittedHostDevices table: unset permits everything, set permits what its PCI
and mediated-device entries list (an empty table nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import hostdevices


def kubevirt(table: Any) -> dict[str, Any]:
    return {"spec": {"configuration": {"permittedHostDevices": table}}}


A10 = "nvidia.com/GA102GL_A10"
L40S = "nvidia.com/L40S-24Q"


@pytest.mark.parametrize(
    ("cr", "expected"),
    [
        pytest.param(None, None, id="no-kubevirt-cr"),
        pytest.param({}, None, id="empty-cr"),
        pytest.param({"spec": {}}, None, id="no-configuration"),
        pytest.param({"spec": {"configuration": {}}}, None, id="table-unset"),
        pytest.param(kubevirt(None), None, id="table-null"),
        pytest.param(kubevirt({}), frozenset(), id="table-empty-permits-nothing"),
        pytest.param(
            kubevirt({"pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": A10}]}),
            frozenset({A10}),
            id="pci",
        ),
        pytest.param(
            kubevirt({"mediatedDevices": [{"mdevNameSelector": "L40S-24Q", "resourceName": L40S}]}),
            frozenset({L40S}),
            id="mediated",
        ),
        pytest.param(
            kubevirt(
                {
                    "pciHostDevices": [{"resourceName": A10}, {"pciVendorSelector": "x"}],
                    "mediatedDevices": [{"resourceName": L40S}],
                }
            ),
            frozenset({A10, L40S}),
            id="both-entries-without-name-ignored",
        ),
        pytest.param(
            kubevirt({"usb": [{"resourceName": "kubevirt.io/storage"}]}),
            frozenset(),
            id="usb-is-no-gpu",
        ),
    ],
)
def test_permitted_resources(cr: dict[str, Any] | None, expected: frozenset[str] | None) -> None:
    assert hostdevices.permitted_resources(cr) == expected


@pytest.mark.parametrize(
    ("resource", "permitted", "expected"),
    [
        pytest.param(A10, None, True, id="no-table-permits-all"),
        pytest.param(A10, frozenset(), False, id="empty-table-permits-none"),
        pytest.param(A10, frozenset({A10}), True, id="listed"),
        pytest.param(L40S, frozenset({A10}), False, id="not-listed"),
    ],
)
def test_is_permitted(resource: str, permitted: frozenset[str] | None, expected: bool) -> None:
    assert hostdevices.is_permitted(resource, permitted) is expected


def test_gpu_host_devices_are_the_entries_naming_a_gpu_resource() -> None:
    vmi = {
        "spec": {
            "domain": {
                "devices": {
                    "hostDevices": [
                        {"name": "a", "deviceName": "nvidia.com/A10"},
                        {"name": "nic", "deviceName": "intel.com/sriov"},
                        "garbage",
                        {"name": "b", "deviceName": "nvidia.com/A10"},
                    ]
                }
            }
        }
    }
    found = hostdevices.gpu_host_devices(vmi, {"nvidia.com/A10", "nvidia.com/L40S"})
    assert found == [("a", "nvidia.com/A10"), ("b", "nvidia.com/A10")]
    assert hostdevices.gpu_host_devices({"spec": {"domain": "x"}}, {"nvidia.com/A10"}) == []
    assert hostdevices.gpu_host_devices({}, {"nvidia.com/A10"}) == []
