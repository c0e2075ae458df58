"""Cache transforms keep what the operator reads and drop the rest; what tenants write (VMIs,
claims) is cached small whatever they write, and every reader decides on the cached copy as
on the whole object."""

from __future__ import annotations

import datetime
import json
from typing import Any, cast

import pytest

from gpuoperator import names
from gpuoperator.model import (
    attachments,
    claims,
    draining,
    gpu_hours,
    hostdevices,
    objects,
    orders,
    references,
    slimming,
    templates,
    vmi_admission,
)
from gpuoperator.runtime import indexing


def full_pod() -> dict[str, object]:
    return {
        "metadata": {
            "name": "virt-launcher-vm-abcde",
            "namespace": "t",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"kubevirt.io": "virt-launcher", names.CLAIMS_LABEL: "true"},
            "annotations": {
                names.CLAIMS_ANNOTATION: "[]",
                "kubevirt.io/domain": "vm",
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 5000,
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm",
                    "uid": "v1",
                    "controller": True,
                },
                {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "o1"},
            ],
            "managedFields": [{"manager": "x"}],
        },
        "spec": {
            "nodeName": "a10-0",
            "schedulingGates": [{"name": names.PLACEMENT_GATE}],
            "containers": [
                {
                    "name": "compute",
                    "image": "i",
                    "env": [{"name": "A"}],
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/GA102GL_A10": "2"},
                        "limits": {"nvidia.com/GA102GL_A10": "2"},
                    },
                }
            ],
            "initContainers": [
                {
                    "name": "init",
                    "restartPolicy": "Always",
                    "resources": {"limits": {"example.com/x": "1"}},
                }
            ],
            "overhead": {"cpu": "100m", "example.com/y": "1"},
            "volumes": [{"name": "v"}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "m",
                    "lastTransitionTime": "t",
                },
                {"type": "Ready", "status": "False"},
            ],
        },
    }


def test_a_slim_pod_keeps_what_gpu_accounting_and_placement_read() -> None:
    slim = slimming.slim_pod(full_pod())
    meta = slim["metadata"]
    assert meta["labels"][names.CLAIMS_LABEL] == "true"
    assert set(meta["annotations"]) == {names.CLAIMS_ANNOTATION, "kubevirt.io/domain"}
    assert [o["uid"] for o in meta["ownerReferences"]] == ["v1"]
    assert "managedFields" not in meta
    spec = slim["spec"]
    assert spec["nodeName"] == "a10-0"
    assert spec["schedulingGates"] == [{"name": names.PLACEMENT_GATE}]
    assert spec["containers"] == [
        {"name": "compute", "resources": {"requests": {"nvidia.com/GA102GL_A10": "2"}}}
    ]
    assert spec["initContainers"] == [
        {
            "name": "init",
            "restartPolicy": "Always",
            "resources": {"requests": {"example.com/x": "1"}},
        }
    ]
    assert spec["overhead"] == {"example.com/y": "1"}
    assert "volumes" not in spec
    assert slim["status"] == {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
        ],
    }


def test_a_gated_pod_keeps_its_affinity_and_an_ungated_one_drops_it() -> None:
    pod = full_pod()
    spec = cast("dict[str, Any]", pod["spec"])
    affinity: dict[str, Any] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }
    spec["affinity"] = affinity
    assert slimming.slim_pod(pod)["spec"]["affinity"] == affinity
    del spec["schedulingGates"]
    assert "affinity" not in slimming.slim_pod(pod)["spec"]


def test_a_slim_node_keeps_gpu_resources_taints_cordon_and_readiness() -> None:
    node = {
        "metadata": {
            "name": "a10-0",
            "uid": "n",
            "labels": {"a": "b"},
            "annotations": {"big": "x" * 1000},
        },
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "k", "effect": "NoSchedule"}],
            "podCIDR": "10.0.0.0/24",
        },
        "status": {
            "capacity": {"cpu": "32", "nvidia.com/GA102GL_A10": "8"},
            "allocatable": {"cpu": "31", "nvidia.com/GA102GL_A10": "8"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "t",
                },
            ],
            "images": [{"names": ["x"] * 50}],
        },
    }
    slim = slimming.slim_node(node)
    assert "annotations" not in slim["metadata"]
    assert slim["spec"] == {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert slim["status"] == {
        "capacity": {"nvidia.com/GA102GL_A10": "8"},
        "allocatable": {"nvidia.com/GA102GL_A10": "8"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }


def plain_pod(resources: dict[str, object] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-1",
            "namespace": "t",
            "uid": "u2",
            "resourceVersion": "9",
            "labels": {"app": "web"},
            "annotations": {"note": "x" * 100},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "controller": True}],
        },
        "spec": {
            "nodeName": "cpu-0",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "resources": resources or {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready"}]},
    }


def test_a_pod_without_gpus_or_kubevirt_labels_is_kept_as_a_stub() -> None:
    assert slimming.slim_pod(plain_pod()) == {
        "metadata": {"name": "web-1", "namespace": "t", "uid": "u2", "resourceVersion": "9"},
        "spec": {"nodeName": "cpu-0"},
        "status": {"phase": "Running"},
    }


def test_a_pod_with_an_extended_resource_even_as_a_limit_is_kept_in_full() -> None:
    slim = slimming.slim_pod(plain_pod({"limits": {"nvidia.com/GA102GL_A10": "1"}}))
    assert slim["spec"]["containers"] == [
        {"name": "c", "resources": {"requests": {"nvidia.com/GA102GL_A10": "1"}}}
    ]
    assert slim["metadata"]["labels"] == {"app": "web"}


def test_a_kubevirt_pod_without_gpus_is_kept_in_full() -> None:
    pod = plain_pod()
    pod["metadata"]["labels"] = {"kubevirt.io": "virt-launcher"}
    assert "containers" in slimming.slim_pod(pod)["spec"]


def test_managed_fields_are_dropped_and_nothing_else() -> None:
    claim: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": "t", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound"},
    }
    assert slimming.without_managed_fields(claim) == {
        "metadata": {"name": "c", "namespace": "t"},
        "spec": {"className": "a10", "count": 1},
        "status": {"phase": "Bound"},
    }
    assert claim["metadata"]["managedFields"]  # the original is left alone
    lean = {"metadata": {"name": "c"}}
    assert slimming.without_managed_fields(lean) is lean


# ---- objects tenants make: VMIs and claims ----------------------------------------------
MIB = 1 << 20
A10 = "nvidia.com/GA102GL_A10"
REFS = '[{"claim":"hold"},{"claimTemplate":{"className":"a10","count":2}}]'


def noise(n: int = MIB) -> str:
    return "x" * n


def full_vmi(scale: int = 1, **meta: Any) -> dict[str, Any]:
    """A VMI as a tenant may write it: what the operator reads, and 1 MiB each (``scale``
    0: a few bytes) of labels, annotations, finalizers, ownerReferences, spec and status it
    does not read."""
    n = MIB * scale or 8
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": "vm1",
            "namespace": "t",
            "uid": "uid-vm1",
            "resourceVersion": "7",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "labels": {
                names.CLAIMS_LABEL: names.TRUE,
                **{f"l{i}": "v" * 63 for i in range(n // 116)},
            },
            "annotations": {names.CLAIMS_ANNOTATION: REFS, "note": noise(n)},
            "finalizers": [
                names.FOREGROUND_DELETION_FINALIZER,
                *[f"x/f{i}" for i in range(n // 13)],
            ],
            "ownerReferences": [
                *[
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": f"c{i}", "uid": f"u{i}"}
                    for i in range(n // 86)
                ],
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachine",
                    "name": "vm1",
                    "uid": "uid-vm",
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f": noise(n)}}],
            **meta,
        },
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [
                        {"name": "gpuop-0", "deviceName": A10, "virtualGPUOptions": noise(n)},
                        {"name": "raw", "deviceName": "example.com/x", "tag": "t"},
                    ],
                    "hostDevices": [{"name": "nic", "deviceName": "example.com/nic"}],
                    "disks": [{"name": f"d{i}", "disk": {"bus": "virtio"}} for i in range(n // 50)],
                },
                "resources": {"requests": {"memory": "1Gi"}},
            },
            "volumes": [{"name": "v", "cloudInitNoCloud": {"userData": noise(n)}}],
            "evictionStrategy": "LiveMigrate",
        },
        "status": {
            "phase": "Running",
            "nodeName": "a10-0",
            "conditions": [{"type": "Ready", "message": noise(n)}],
            "migrationState": {
                "migrationUid": "uid-mig",
                "sourceNode": "a10-0",
                "targetNode": "a10-1",
                "completed": True,
                "failed": False,
                "abortStatus": "Failed",
                "targetPod": "virt-launcher-vm1-x",
                "migrationConfiguration": {"bandwidthPerMigration": noise(n)},
            },
        },
    }


def full_claim(scale: int = 1, **meta: Any) -> dict[str, Any]:
    """A claim as a tenant may write it: 1 MiB each (``scale`` 0: a few bytes) of labels,
    annotations, finalizers, ownerReferences and (were the schema's pruning off) spec it does
    not read."""
    n = MIB * scale or 8
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": "hold",
            "namespace": "t",
            "uid": "uid-claim",
            "resourceVersion": "11",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "labels": {
                names.TEMPLATE_CLAIM_LABEL: names.TRUE,
                **{f"l{i}": "v" * 63 for i in range(n // 116)},
            },
            "annotations": {"note": noise(n)},
            "finalizers": [names.CLAIM_PROTECTION_FINALIZER, *[f"x/f{i}" for i in range(n // 13)]],
            "ownerReferences": [
                *[
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": f"c{i}", "uid": f"u{i}"}
                    for i in range(n // 86)
                ],
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm1",
                    "uid": "uid-vm1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
            **meta,
        },
        "spec": {"className": "a10", "count": 2, "extra": noise(n)},
        "status": {
            "phase": "Bound",
            "nodeName": "a10-0",
            "boundTime": "2026-01-01T00:00:05Z",
            "attachment": {"vmi": "vm1", "uid": "uid-vm1"},
            "refusedNodes": [{"nodeName": "a10-1", "until": "2026-01-01T00:10:00Z"}],
            "conditions": [{"type": "Bound", "status": "True", "reason": "Bound"}],
            "usage": {
                "idleUnitSeconds": 10,
                "inUseUnitSeconds": 20,
                "state": "InUse",
                "since": "2026-01-01T00:01:00Z",
            },
        },
    }


def size(obj: object) -> int:
    return len(json.dumps(obj))


def test_a_vmi_with_megabytes_of_what_no_reader_reads_is_cached_small() -> None:
    vmi = full_vmi()
    assert size(vmi) > 6 * MIB
    assert size(slimming.slim_vmi(vmi)) < 2048


def test_a_claim_with_megabytes_of_what_no_reader_reads_is_cached_small() -> None:
    claim = full_claim()
    assert size(claim) > 4 * MIB
    assert size(slimming.slim_claim(claim)) < 2048


def test_a_slim_vmi_keeps_exactly_the_fields_its_readers_use() -> None:
    assert slimming.slim_vmi(full_vmi()) == {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": "vm1",
            "namespace": "t",
            "uid": "uid-vm1",
            "resourceVersion": "7",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "labels": {names.CLAIMS_LABEL: names.TRUE},
            "annotations": {names.CLAIMS_ANNOTATION: REFS},
            "finalizers": [names.FOREGROUND_DELETION_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachine",
                    "name": "vm1",
                    "uid": "uid-vm",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [
                        {"name": "gpuop-0", "deviceName": A10},
                        {"name": "raw", "deviceName": "example.com/x"},
                    ],
                    "hostDevices": [{"name": "nic", "deviceName": "example.com/nic"}],
                }
            },
            "evictionStrategy": "LiveMigrate",
        },
        "status": {
            "phase": "Running",
            "nodeName": "a10-0",
            "migrationState": {
                "migrationUid": "uid-mig",
                "sourceNode": "a10-0",
                "targetNode": "a10-1",
                "completed": True,
                "failed": False,
                "abortStatus": "Failed",
            },
        },
    }


def test_a_slim_claim_keeps_exactly_the_fields_its_readers_use() -> None:
    claim = full_claim()
    slim = slimming.slim_claim(claim)
    assert slim["metadata"] == {
        "name": "hold",
        "namespace": "t",
        "uid": "uid-claim",
        "resourceVersion": "11",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "deletionTimestamp": "2026-01-02T00:00:00Z",
        "labels": {names.TEMPLATE_CLAIM_LABEL: names.TRUE},
        "finalizers": [names.CLAIM_PROTECTION_FINALIZER],
        "ownerReferences": [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": "vm1",
                "uid": "uid-vm1",
                "controller": True,
            }
        ],
    }
    assert slim["spec"] == {"className": "a10", "count": 2}
    assert slim["status"] == claim["status"]  # only the operator writes it
    assert (slim["apiVersion"], slim["kind"]) == (names.API_VERSION, names.GPU_CLAIM)


def vmi_variants() -> list[dict[str, Any]]:
    """VMIs that differ in what some reader decides on."""
    out = [full_vmi(0)]
    alive = full_vmi(0)
    del alive["metadata"]["deletionTimestamp"]
    alive["metadata"]["finalizers"] = ["x/other"]
    out.append(alive)
    for phase in ("Scheduled", "Succeeded", "Failed", "Pending"):
        v = full_vmi(0)
        v["status"]["phase"] = phase
        out.append(v)
    unlabelled = full_vmi(0)
    del unlabelled["metadata"]["labels"][names.CLAIMS_LABEL]
    out.append(unlabelled)
    bad = full_vmi(0)
    bad["metadata"]["annotations"][names.CLAIMS_ANNOTATION] = '[{"claim": "Hold"}]'
    out.append(bad)
    other = full_vmi(0, uid="uid-other", name="vm2")
    out.append(other)
    return out


def claim_variants() -> list[dict[str, Any]]:
    """Claims that differ in what some reader decides on."""
    out = [full_claim(0)]
    held = full_claim(0)
    del held["metadata"]["labels"][names.TEMPLATE_CLAIM_LABEL]
    held["metadata"]["ownerReferences"] = held["metadata"]["ownerReferences"][:-1]
    del held["metadata"]["deletionTimestamp"]
    held["metadata"]["finalizers"] = ["x/other"]
    out.append(held)
    pending = full_claim(0)
    pending["status"] = {"phase": "Pending"}
    out.append(pending)
    unconfirmed = full_claim(0)
    unconfirmed["metadata"]["ownerReferences"] = []
    unconfirmed["status"]["attachment"] = {"vmi": "vm2"}
    out.append(unconfirmed)
    return out


def claim_readings(claim: dict[str, Any]) -> tuple[object, ...]:
    """What every reader of the claims cache decides from one claim."""
    return (
        objects.key(claim),
        orders.ordered_class(claim),
        orders.ordered_count(claim),
        orders.is_template_claim(claim),
        orders.creation_order(claim),
        orders.usage([claim], "a10"),
        claims.phase(claim),
        claims.node_name(claim),
        claims.is_bound(claim),
        claims.attachment(claim),
        claims.controlling_vmi(claim),
        claims.user(claim),
        claims.covering_vmi(claim),
        gpu_hours.read(claim),
        gpu_hours.served_vmi_name(claim),
        names.CLAIM_PROTECTION_FINALIZER in (claim["metadata"].get("finalizers") or []),
        indexing.by_field("status", "nodeName")(claim),
        indexing.by_field("spec", "className")(claim),
        indexing.by_namespace(claim),
        {k: claim["metadata"].get(k) for k in ("uid", "resourceVersion", "generation")},
    )


def vmi_readings(vmi: dict[str, Any], claim: dict[str, Any]) -> tuple[object, ...]:
    """What every reader of the VMI cache decides from one VMI (with a claim beside it)."""
    try:
        refs: object = references.from_object(vmi)
    except references.AnnotationError as exc:
        refs = str(exc)
    ref = claims.user(claim)
    meta = vmi["metadata"]
    return (
        objects.key(vmi),
        references.has_references(vmi),
        refs,
        claims.is_vmi_final(vmi),
        claims.is_live_user(ref, vmi),
        claims.protects(ref, vmi, pods_left=False),
        claims.protects(ref, vmi, pods_left=True),
        claims.serves_live_vmi(claim, vmi),
        claims.controlling_vmi(vmi),
        gpu_hours.state_of(claim, vmi),
        gpu_hours.transition(claim, vmi, datetime.datetime(2026, 1, 1, 1, tzinfo=datetime.UTC)),
        draining.hold(claim, vmi),
        templates.is_template_claim_of(claim, vmi),
        templates.template_claims(vmi, refs) if isinstance(refs, list) else None,
        [(e.get("name"), e.get("deviceName")) for e in vmi_admission.raw_gpu_entries(vmi)],
        hostdevices.gpu_host_devices(vmi, frozenset({A10, "example.com/nic"})),
        attachments.uses_claim(vmi, "hold"),
        attachments.confirms(vmi, "hold"),
        attachments.stale_reason({"vmi": "vm1", "uid": "uid-vm1"}, vmi),
        {k: meta.get(k) for k in ("uid", "resourceVersion", "creationTimestamp")},
        (vmi.get("status") or {}).get("nodeName"),
    )


def test_every_reader_of_a_claim_decides_alike_on_the_cached_copy() -> None:
    for claim in claim_variants():
        assert claim_readings(slimming.slim_claim(claim)) == claim_readings(claim)


def test_every_reader_of_a_vmi_decides_alike_on_the_cached_copy() -> None:
    for vmi in vmi_variants():
        for claim in claim_variants():
            cached = slimming.slim_vmi(vmi), slimming.slim_claim(claim)
            assert vmi_readings(*cached) == vmi_readings(vmi, claim)


def test_a_claims_annotation_padded_past_its_bound_is_cut_and_refused_alike() -> None:
    """JSON allows any whitespace; the parser refuses a value past its bound, and the cache
    keeps only as much as takes the same refusal."""
    vmi = full_vmi()
    vmi["metadata"]["annotations"][names.CLAIMS_ANNOTATION] = REFS + " " * MIB
    slim = slimming.slim_vmi(vmi)
    kept = slim["metadata"]["annotations"][names.CLAIMS_ANNOTATION]
    assert len(kept) == references.MAX_ANNOTATION_LENGTH + 1
    with pytest.raises(references.AnnotationError) as whole:
        references.from_object(vmi)
    with pytest.raises(references.AnnotationError) as cut:
        references.from_object(slim)
    assert str(cut.value) == str(whole.value)
    assert "longer than 4096 characters" in str(whole.value)


def test_tenant_strings_are_cut_past_their_longest_valid_value() -> None:
    long_name = "a" * MIB
    vmi = full_vmi()
    vmi["spec"]["domain"]["devices"]["gpus"] = [
        {"name": long_name, "deviceName": A10 + long_name, "claimName": "c", "requestName": "r"}
    ]
    vmi["metadata"]["ownerReferences"][-1]["name"] = long_name
    vmi["status"]["nodeName"] = long_name
    slim = slimming.slim_vmi(vmi)
    [entry] = slim["spec"]["domain"]["devices"]["gpus"]
    assert entry == {
        "name": "a" * 64,
        "deviceName": (A10 + long_name)[:318],
        "claimName": "c",
        "requestName": "r",
    }
    assert slim["metadata"]["ownerReferences"][0]["name"] == "a" * 254
    assert slim["status"]["nodeName"] == "a" * 254
    # Still longer than any valid value: it equals none, as the whole did.
    assert entry["deviceName"] != A10 and len(entry["deviceName"]) > 317
    assert size(slim) < 8192


def test_device_lists_keep_at_most_what_the_vmi_webhook_writes() -> None:
    vmi = full_vmi()
    many = [{"name": f"g{i}", "deviceName": "example.com/x"} for i in range(50_000)]
    vmi["spec"]["domain"]["devices"]["gpus"] = many
    vmi["spec"]["domain"]["devices"]["hostDevices"] = many
    devices = slimming.slim_vmi(vmi)["spec"]["domain"]["devices"]
    assert slimming.MAX_DEVICE_ENTRIES == 16 * 64
    assert devices["gpus"] == many[: slimming.MAX_DEVICE_ENTRIES]
    assert devices["hostDevices"] == many[: slimming.MAX_DEVICE_ENTRIES]


def test_a_vmi_or_claim_without_the_optional_parts_is_slimmed_without_inventing_them() -> None:
    assert slimming.slim_vmi({"metadata": {"name": "v", "namespace": "t"}}) == {
        "metadata": {"name": "v", "namespace": "t"},
        "spec": {},
        "status": {},
    }
    assert slimming.slim_claim({"metadata": {"name": "c", "namespace": "t"}, "spec": {}}) == {
        "metadata": {"name": "c", "namespace": "t"},
        "spec": {},
    }
    odd = {"metadata": "x", "spec": ["x"], "status": "x"}
    assert slimming.slim_vmi(odd) == {"metadata": {}, "spec": {}, "status": {}}
