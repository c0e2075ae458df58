"""The shared caches keep what tenants write small: the VMI and claim informers slim every
object they store (``model.slimming``), whatever the tenant put in it."""

from __future__ import annotations

import json

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
