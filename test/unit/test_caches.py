"""The shared caches keep what tenants write small: the VMI and claim informers slim every
object they store (``model.slimming``), whatever the tenant put in it."""

from __future__ import annotations

import json
from typing import Any

from gpuoperator import names
from harness import objects
from harness.offline import offline_caches, put

MIB = 1 << 20


def test_a_tenants_megabyte_vmi_and_claim_are_cached_in_a_few_hundred_bytes() -> None:
    caches = offline_caches()
    vmi = objects.vmi(
        refs=[{"claim": "hold"}],
        labels={f"l{i}": "v" * 63 for i in range(4000)},
        annotations={"note": "x" * MIB},
    )
    claim = objects.claim(labels={"team": "x" * 63}, finalizers=[f"x/f{i}" for i in range(80000)])
    claim["metadata"]["annotations"] = {"note": "x" * MIB}
    assert len(json.dumps(vmi)) > MIB and len(json.dumps(claim)) > MIB

    cached_vmi = put(caches.vmis, vmi)
    cached_claim = put(caches.claims, claim)

    assert len(json.dumps(cached_vmi)) < 512
    assert len(json.dumps(cached_claim)) < 512
    assert cached_vmi["metadata"]["annotations"] == {names.CLAIMS_ANNOTATION: '[{"claim": "hold"}]'}
    assert caches.vmis.store.get((objects.NS, "vm1")) == cached_vmi
    assert caches.claims.store.by_index("class", "a10") == [cached_claim]


def by_name(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(str(o["metadata"]["name"]) for o in objs)


def test_claims_and_pods_are_found_by_the_vmi_they_name_in_their_own_namespace() -> None:
    """``Caches.claims_of_vmi``/``pods_of_vmi`` narrow a namespace to the objects naming a
    VMI: a claim by its controlling VMI or its attachment, a pod by its controller or its
    ``vm.kubevirt.io/name`` label; an update that changes the VMI moves the object."""
    caches = offline_caches()
    owned = put(caches.claims, objects.claim("owned", owner_uid="uid-vm1"))
    attached = put(caches.claims, objects.claim("att", attached={"vmi": "vm1", "uid": "u"}))
    put(caches.claims, objects.claim("other", attached={"vmi": "vm2", "uid": "u2"}))
    put(caches.claims, objects.claim("elsewhere", namespace="t2", attached={"vmi": "vm1"}))
    put(caches.claims, objects.claim("free"))
    launcher = put(caches.pods, objects.launcher_pod("virt-launcher-vm1-x"))
    labels = {"kubevirt.io": "virt-launcher", names.VM_NAME_LABEL: "vm1"}
    labelled = put(caches.pods, objects.pod("lab", labels=labels))
    put(caches.pods, objects.pod("plain"))
    put(caches.pods, objects.launcher_pod("virt-launcher-vm2-x", vmi_name="vm2", vmi_uid="u2"))

    assert by_name(caches.claims_of_vmi(objects.NS, "vm1")) == by_name([owned, attached])
    assert by_name(caches.claims_of_vmi("t2", "vm1")) == ["elsewhere"]
    assert caches.claims_of_vmi(objects.NS, "vm3") == []
    assert by_name(caches.pods_of_vmi(objects.NS, "vm1")) == by_name([launcher, labelled])

    put(caches.claims, objects.claim("att", attached={"vmi": "vm2", "uid": "u2"}))
    assert by_name(caches.claims_of_vmi(objects.NS, "vm1")) == ["owned"]
    assert by_name(caches.claims_of_vmi(objects.NS, "vm2")) == ["att", "other"]
