"""GPUClass admission on the real API server: every rule of the API, accepted and refused.

Each refusal is checked for the field it names and for what it says is allowed.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykube
import pytest

from gpuoperator.kinds import GPUClass
from harness.kube import Obj, refused, replace
from localcluster.cluster import kubectl

Make = Callable[..., GPUClass]


def passthrough(name: str) -> Obj:
    return {
        "apiVersion": "cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {
            "vendor": "nvidia",
            "model": "A10",
            "mode": "passthrough",
            "memory": "24Gi",
            "source": {"devicePlugin": {"resourceName": "nvidia.com/GA102GL_A10"}},
        },
    }


def vgpu(name: str) -> Obj:
    obj = passthrough(name)
    obj["spec"].update(
        model="L40S",
        mode="vgpu",
        profile="L40S-24Q",
        source={"devicePlugin": {"resourceName": "nvidia.com/L40S-24Q"}},
        license={"secretName": "nvidia-vgpu-license"},
    )
    return obj


def unique(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make(api: pykube.HTTPClient) -> Iterator[Make]:
    """Create GPUClasses (cluster-scoped) and delete every one created after the test."""
    made: list[GPUClass] = []

    def create(
        base: Callable[[str], Obj] = passthrough, name: str | None = None, **spec: Any
    ) -> GPUClass:
        obj = base(name or unique())
        for key, value in spec.items():
            if value is None:
                obj["spec"].pop(key, None)
            else:
                obj["spec"][key] = value
        cls = GPUClass(api, obj)
        cls.create()
        made.append(cls)
        return cls

    yield create
    for cls in made:
        cls.delete()


def refusal_of(make: Make, **kwargs: Any) -> str:
    with refused() as r:
        make(**kwargs)
    message: str = r[0].message
    return message


# ---------------------------------------------------------------------------------------
# accepted


def test_a_minimal_passthrough_class_is_accepted(make: Make) -> None:
    cls = make()
    assert cls.obj["spec"]["mode"] == "passthrough"
    assert "maxCount" not in cls.obj["spec"], "maxCount has no schema default (readers resolve it)"


def test_a_vgpu_class_with_a_license_defaults_feature_type_to_1(make: Make) -> None:
    cls = make(vgpu)
    assert cls.obj["spec"]["license"] == {"secretName": "nvidia-vgpu-license", "featureType": 1}


@pytest.mark.parametrize("memory", ["24Gi", "24576Mi", 25769803776, "1.5Gi"])
def test_memory_is_any_positive_quantity(make: Make, memory: object) -> None:
    assert make(memory=memory).obj["spec"]["memory"] == memory


def test_memory_is_optional(make: Make) -> None:
    assert "memory" not in make(memory=None).obj["spec"]


def test_several_classes_may_share_one_resource_name(make: Make) -> None:
    a, b = make(), make()
    rn = a.obj["spec"]["source"]["devicePlugin"]["resourceName"]
    assert rn == b.obj["spec"]["source"]["devicePlugin"]["resourceName"]


@pytest.mark.parametrize(
    "resource_name",
    [
        "nvidia.com/GA102GL_A10",
        "nvidia.com/L40S-24Q",
        "example.org/gpu.v2",
        "notkubernetes.io/gpu",  # only kubernetes.io and its subdomains are refused
        "cozystack.io/gpu",  # only gpu. and gpuclass. (and below) are refused
        "a" * 63 + "." + "b" * 63 + ".example.com/" + "n" * 63,
    ],
)
def test_extended_resource_names_are_accepted(make: Make, resource_name: str) -> None:
    make(source={"devicePlugin": {"resourceName": resource_name}})


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
        [{"operator": "Exists"}],  # an empty key with Exists tolerates everything
        [{"key": "k", "value": "v", "effect": ""}],
        [{"key": "k", "effect": "PreferNoSchedule"}],
        [{"key": f"t{i}", "operator": "Exists"} for i in range(16)],
    ],
    ids=["exists", "equal", "empty-key-exists", "empty-effect", "prefer", "sixteen"],
)
def test_tolerations_pod_validation_accepts_are_accepted(
    make: Make, tolerations: list[Obj]
) -> None:
    cls = make(tolerations=tolerations)
    for t in cls.obj["spec"]["tolerations"]:
        assert t["operator"] in ("Exists", "Equal"), "operator defaults to Equal"


def test_toleration_operator_defaults_to_equal(make: Make) -> None:
    cls = make(tolerations=[{"key": "k", "value": "v"}])
    assert cls.obj["spec"]["tolerations"][0]["operator"] == "Equal"


def test_max_count_one_and_more_are_accepted(make: Make) -> None:
    assert make(maxCount=1).obj["spec"]["maxCount"] == 1
    assert make(vgpu, maxCount=2).obj["spec"]["maxCount"] == 2


def test_the_class_is_listed_with_its_printer_columns_short_name_and_category(
    make: Make, kubeconfig: Path
) -> None:
    cls = make()
    name = cls.obj["metadata"]["name"]
    for resource in ("gpuclasses", "gpucl"):
        lines = kubectl(kubeconfig, "get", resource, name).splitlines()
        assert lines[0].split() == ["NAME", "MODE", "RESOURCE", "FREE", "MAXFREEPERNODE", "AGE"]
        assert lines[1].split()[:3] == [name, "passthrough", "nvidia.com/GA102GL_A10"]
    assert (
        f"gpuclass.cozystack.io/{name}" in kubectl(kubeconfig, "get", "gpu", "-o", "name").split()
    )


# ---------------------------------------------------------------------------------------
# refused on create: (keyword changes, fragments the message must contain)

REFUSED: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    # metadata.name
    ("name-uppercase", {"name": "A10"}, ("metadata.name",)),
    ("name-dotted", {"name": "a10.big"}, ("metadata.name", "DNS label")),
    ("name-64", {"name": "a" * 64}, ("metadata.name", "63")),
    ("name-total", {"name": "total"}, ("metadata.name", "total")),
    ("name-requests", {"name": "requests"}, ("metadata.name", "'requests'", "quota key")),
    ("name-limits", {"name": "limits"}, ("metadata.name", "'limits'", "KubeVirt")),
    # vendor
    ("vendor-missing", {"vendor": None}, ("spec.vendor", "Required")),
    ("vendor-not-a-label", {"vendor": "NVIDIA Corp"}, ("spec.vendor", "DNS label")),
    ("vendor-too-long", {"vendor": "n" * 64}, ("spec.vendor", "63")),
    # model
    ("model-missing", {"model": None}, ("spec.model", "Required")),
    ("model-empty", {"model": ""}, ("spec.model", "at least 1")),
    ("model-too-long", {"model": "m" * 129}, ("spec.model", "128")),
    # mode
    ("mode-missing", {"mode": None}, ("spec.mode", "Required")),
    ("mode-unknown", {"mode": "mig"}, ("spec.mode", "passthrough", "vgpu")),
    # profile
    (
        "profile-on-passthrough",
        {"profile": "A10-24Q"},
        ("spec.profile", "forbidden", "passthrough"),
    ),
    (
        "profile-missing-on-vgpu",
        {"base": vgpu, "profile": None},
        ("spec.profile", "required", "vgpu"),
    ),
    ("profile-too-long", {"base": vgpu, "profile": "p" * 65}, ("spec.profile", "64")),
    # memory
    ("memory-not-a-quantity", {"memory": "lots"}, ("spec.memory", "quantity")),
    ("memory-zero", {"memory": "0"}, ("spec.memory", "positive quantity")),
    ("memory-negative", {"memory": "-1Gi"}, ("spec.memory", "positive quantity")),
    # maxCount
    ("maxcount-zero", {"maxCount": 0}, ("spec.maxCount", "greater than or equal to 1")),
    ("maxcount-not-integer", {"maxCount": "two"}, ("spec.maxCount", "integer")),
    # source
    ("source-missing", {"source": None}, ("spec.source", "Required")),
    ("source-empty", {"source": {}}, ("spec.source", "exactly one member", "devicePlugin")),
    (
        "source-both",
        {
            "source": {
                "devicePlugin": {"resourceName": "nvidia.com/x"},
                "dra": {"deviceClassName": "gpu"},
            }
        },
        ("spec.source.dra", "exactly one member", "devicePlugin"),
    ),
    ("resource-name-missing", {"source": {"devicePlugin": {}}}, ("resourceName", "Required")),
    (
        "resource-name-no-domain",
        {"source": {"devicePlugin": {"resourceName": "gpu"}}},
        ("spec.source.devicePlugin.resourceName", "domain/name"),
    ),
    (
        "resource-name-empty-name",
        {"source": {"devicePlugin": {"resourceName": "nvidia.com/"}}},
        ("spec.source.devicePlugin.resourceName", "domain/name"),
    ),
    (
        "resource-name-upper-domain",
        {"source": {"devicePlugin": {"resourceName": "NVIDIA.com/a10"}}},
        ("spec.source.devicePlugin.resourceName", "DNS subdomain"),
    ),
    (
        "resource-name-long-name",
        {"source": {"devicePlugin": {"resourceName": "nvidia.com/" + "n" * 64}}},
        ("spec.source.devicePlugin.resourceName", "63"),
    ),
    (
        "resource-name-long-domain",
        {"source": {"devicePlugin": {"resourceName": ".".join(["d" * 63] * 4) + "x/gpu"}}},
        ("spec.source.devicePlugin.resourceName", "253"),
    ),
    (
        "resource-name-two-slashes",
        {"source": {"devicePlugin": {"resourceName": "a.com/b/c"}}},
        ("spec.source.devicePlugin.resourceName", "domain/name"),
    ),
    (
        "resource-name-kubernetes-io",
        {"source": {"devicePlugin": {"resourceName": "kubernetes.io/gpu"}}},
        ("spec.source.devicePlugin.resourceName", "kubernetes.io"),
    ),
    (
        "resource-name-sub-kubernetes-io",
        {"source": {"devicePlugin": {"resourceName": "gpu.kubernetes.io/a10"}}},
        ("spec.source.devicePlugin.resourceName", "kubernetes.io"),
    ),
    (
        "resource-name-budget-domain",
        {"source": {"devicePlugin": {"resourceName": "gpuclass.cozystack.io/devices"}}},
        ("spec.source.devicePlugin.resourceName", "budget key"),
    ),
    (
        "resource-name-sub-budget-domain",
        {"source": {"devicePlugin": {"resourceName": "a10.gpuclass.cozystack.io/devices"}}},
        ("spec.source.devicePlugin.resourceName", "budget key"),
    ),
    (
        "resource-name-gpu-domain",
        {"source": {"devicePlugin": {"resourceName": "gpu.cozystack.io/a10"}}},
        ("spec.source.devicePlugin.resourceName", "gpu.cozystack.io"),
    ),
    (
        "resource-name-sub-gpu-domain",
        {"source": {"devicePlugin": {"resourceName": "x.gpu.cozystack.io/a10"}}},
        ("spec.source.devicePlugin.resourceName", "gpu.cozystack.io"),
    ),
    # license
    ("license-on-passthrough", {"license": {"secretName": "lic"}}, ("spec.license", "vgpu")),
    (
        "license-bad-secret-name",
        {"base": vgpu, "license": {"secretName": "Bad_Name"}},
        ("spec.license.secretName", "DNS subdomain"),
    ),
    (
        "license-no-secret-name",
        {"base": vgpu, "license": {"featureType": 1}},
        ("spec.license.secretName", "Required"),
    ),
    (
        "license-feature-type-2",
        {"base": vgpu, "license": {"secretName": "lic", "featureType": 2}},
        ("spec.license.featureType", "1", "4"),
    ),
    # tolerations
    (
        "tolerations-17",
        {"tolerations": [{"key": f"t{i}", "operator": "Exists"} for i in range(17)]},
        ("spec.tolerations", "16"),
    ),
    (
        "toleration-operator-gt",
        {"tolerations": [{"key": "k", "operator": "Gt", "value": "1"}]},
        ("spec.tolerations[0].operator", "Exists", "Equal"),
    ),
    (
        "toleration-exists-with-value",
        {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
        ("spec.tolerations[0].value", "empty", "Exists"),
    ),
    (
        "toleration-empty-key-equal",
        {"tolerations": [{"operator": "Equal", "value": "v"}]},
        ("spec.tolerations[0].key", "Exists"),
    ),
    (
        "toleration-bad-key",
        {"tolerations": [{"key": "bad key", "operator": "Exists"}]},
        ("spec.tolerations[0].key", "qualified name"),
    ),
    (
        "toleration-key-long-name",
        {"tolerations": [{"key": "k" * 64, "operator": "Exists"}]},
        ("spec.tolerations[0].key", "63"),
    ),
    (
        "toleration-bad-value",
        {"tolerations": [{"key": "k", "value": "-v"}]},
        ("spec.tolerations[0].value", "label value"),
    ),
    (
        "toleration-bad-effect",
        {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoEvict"}]},
        ("spec.tolerations[0].effect", "NoSchedule", "NoExecute"),
    ),
    (
        "toleration-seconds",
        {
            "tolerations": [
                {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        ("spec.tolerations[0].tolerationSeconds", "not allowed"),
    ),
]


@pytest.mark.parametrize(
    ("changes", "fragments"), [(c, f) for _, c, f in REFUSED], ids=[i for i, _, _ in REFUSED]
)
def test_invalid_class_is_refused_naming_the_field(
    make: Make, changes: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    kwargs = dict(changes)
    message = refusal_of(make, **kwargs)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in refusal: {message}"


# ---------------------------------------------------------------------------------------
# updates: immutable fields

IMMUTABLE: list[tuple[str, Callable[[str], Obj], dict[str, Any], str]] = [
    ("vendor", passthrough, {"vendor": "amd"}, "spec.vendor"),
    ("model", passthrough, {"model": "A16"}, "spec.model"),
    ("mode", passthrough, {"mode": "vgpu", "profile": "A10-24Q"}, "spec.mode"),
    ("profile", vgpu, {"profile": "L40S-48Q"}, "spec.profile"),
    ("memory", passthrough, {"memory": "48Gi"}, "spec.memory"),
    ("preemptible", passthrough, {"preemptible": True}, "spec.preemptible"),
    (
        "resource-name",
        passthrough,
        {"source": {"devicePlugin": {"resourceName": "nvidia.com/A10_v2"}}},
        "spec.source",
    ),
]


@pytest.mark.parametrize(
    ("base", "changes", "field"),
    [(b, c, f) for _, b, c, f in IMMUTABLE],
    ids=[i for i, _, _, _ in IMMUTABLE],
)
def test_changing_an_immutable_field_is_refused(
    make: Make, base: Callable[[str], Obj], changes: dict[str, Any], field: str
) -> None:
    cls = make(base)
    before = copy.deepcopy(cls.obj["spec"])
    cls.obj["spec"].update(changes)
    with refused() as r:
        replace(cls)
    assert field in r[0].message and "immutable" in r[0].message, r[0].message
    cls.reload()
    assert cls.obj["spec"] == before, "a refused update must change nothing"


@pytest.mark.parametrize(
    ("created_with", "updated_to"),
    [("24Gi", None), (None, "24Gi")],
    ids=["removed", "added"],
)
def test_memory_can_be_neither_added_nor_removed(
    make: Make, created_with: str | None, updated_to: str | None
) -> None:
    cls = make(memory=created_with)
    before = copy.deepcopy(cls.obj["spec"])
    if updated_to is None:
        del cls.obj["spec"]["memory"]
    else:
        cls.obj["spec"]["memory"] = updated_to
    with refused() as r:
        replace(cls)
    assert "spec.memory" in r[0].message and "immutable" in r[0].message, r[0].message
    cls.reload()
    assert cls.obj["spec"] == before, "a refused update must change nothing"


def test_a_class_is_guaranteed_unless_it_says_it_is_preemptible(make: Make) -> None:
    guaranteed = make(passthrough)
    assert guaranteed.obj["spec"]["preemptible"] is False
    spot = make(passthrough, preemptible=True)
    del spot.obj["spec"]["preemptible"]
    with refused() as r:
        replace(spot)
    assert "spec.preemptible is immutable" in r[0].message, r[0].message
    spot.reload()
    assert spot.obj["spec"]["preemptible"] is True


def test_memory_respelled_as_the_same_quantity_is_not_a_change(make: Make) -> None:
    cls = make(memory="24Gi")
    cls.obj["spec"]["memory"] = "24576Mi"
    replace(cls)
    cls.obj["spec"]["memory"] = 25769803776
    replace(cls)


@pytest.mark.parametrize(
    "changes",
    [
        {"maxCount": 2},
        {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
    ],
    ids=["maxCount", "tolerations"],
)
def test_mutable_fields_can_change(make: Make, changes: dict[str, Any]) -> None:
    cls = make()
    cls.obj["spec"].update(changes)
    replace(cls)
    cls.reload()
    for key, value in changes.items():
        assert cls.obj["spec"][key] == value or key == "tolerations"


def test_a_vgpu_license_can_change_and_be_removed(make: Make) -> None:
    cls = make(vgpu)
    cls.obj["spec"]["license"] = {"secretName": "other", "featureType": 4}
    replace(cls)
    del cls.obj["spec"]["license"]
    replace(cls)
    cls.reload()
    assert "license" not in cls.obj["spec"]


def test_dra_cannot_be_added_to_an_existing_class(make: Make) -> None:
    cls = make()
    cls.obj["spec"]["source"]["dra"] = {"deviceClassName": "gpu"}
    with refused() as r:
        replace(cls)
    assert "spec.source.dra" in r[0].message and "exactly one member" in r[0].message


# ---------------------------------------------------------------------------------------
# status subresource, pruning


def test_status_sent_on_create_is_dropped(api: pykube.HTTPClient) -> None:
    obj = passthrough(unique())
    obj["status"] = {"free": 99, "nodes": 3}
    cls = GPUClass(api, obj)
    cls.create()
    try:
        cls.reload()
        assert "status" not in cls.obj or "free" not in cls.obj["status"]
    finally:
        cls.delete()


def test_a_status_update_leaves_spec_untouched_and_spec_updates_leave_status(make: Make) -> None:
    cls = make()
    spec = copy.deepcopy(cls.obj["spec"])
    cls.obj["status"] = {"free": 8, "maxFreePerNode": 4, "nodes": 2, "observedGeneration": 1}
    cls.obj["spec"]["maxCount"] = 7
    replace(cls, subresource="status")
    cls.reload()
    assert cls.obj["spec"] == spec
    assert cls.obj["status"]["free"] == 8
    cls.obj["spec"]["maxCount"] = 3
    cls.obj["status"]["free"] = 0
    replace(cls)
    cls.reload()
    assert cls.obj["spec"]["maxCount"] == 3
    assert cls.obj["status"]["free"] == 8, "a spec update must not write status"


def test_unknown_fields_are_pruned(make: Make) -> None:
    cls = make(colour="green")
    cls.reload()
    assert "colour" not in cls.obj["spec"]
