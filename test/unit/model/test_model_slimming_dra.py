"""The cached copy of a ResourceClaim (``slimming.slim_resource_claim``): tenants write
ResourceClaims, so the cache keeps only what the DRA readers use, bounded, and every reader
decides on it as on the object the API server returned (docs/design.md §5 "DRA classes")."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

from gpuoperator import names
from gpuoperator.model import dra_devices, dra_holds, slimming
from harness.offline import offline_caches, put

Obj = dict[str, Any]
DRIVER = "gpu.example.com"
MIB = 1 << 20
NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)


def gpuclaim() -> Obj:
    return {"metadata": {"namespace": "tenant", "name": "hold-a", "uid": "u-1"}}


def hold(*devices: str, node: str = "n1") -> Obj:
    """A hold as the API server returns it once allocated, with what a tenant's claim or
    the API server adds besides."""
    made = dra_holds.resource_claim(gpuclaim(), "a10", len(devices))
    made["metadata"].update(uid="rc-1", resourceVersion="7", generation=1, managedFields=[{}])
    made["status"] = dra_holds.allocation(
        [dra_devices.DeviceRef(DRIVER, node, d) for d in devices], node, NOW
    )
    made["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "p-1"}]
    made["status"]["devices"] = [{"driver": DRIVER, "pool": node, "device": devices[0]}]
    return made


def test_every_dra_reader_decides_alike_on_the_cached_copy() -> None:
    full = hold("gpu-1", "gpu-3")
    slim = slimming.slim_resource_claim(copy.deepcopy(full))
    assert dra_devices.held_devices([slim]) == dra_devices.held_devices([full])
    assert dra_holds.allocated(slim) == dra_holds.allocated(full)
    assert dra_holds.is_hold_of(slim, gpuclaim()) and dra_holds.is_hold_of(full, gpuclaim())
    assert slim["status"]["allocation"] == full["status"]["allocation"]
    assert slim["metadata"]["labels"] == {names.DRA_HOLD_LABEL: "true"}
    assert "spec" not in slim and "managedFields" not in slim["metadata"]


def test_an_unallocated_claim_is_cached_without_a_status() -> None:
    full = dra_holds.resource_claim(gpuclaim(), "a10", 1)
    full["status"] = {"reservedFor": []}
    slim = slimming.slim_resource_claim(full)
    assert "status" not in slim and dra_holds.allocated(slim) == ()


def test_a_tenants_megabyte_resource_claim_is_cached_small_with_its_results_bounded() -> None:
    full = hold(*(f"gpu-{i}" for i in range(40)))
    full["metadata"]["labels"].update({f"l{i}": "v" * 63 for i in range(4000)})
    full["metadata"]["annotations"] = {"note": "x" * MIB}
    full["status"]["allocation"]["devices"]["results"][0]["device"] = "d" * MIB
    terms = full["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [{"key": "x" * MIB, "operator": "Exists"}]})
    assert len(json.dumps(full)) > 3 * MIB

    cached = put(offline_caches().resource_claims, full)

    assert len(json.dumps(cached)) < 4096
    results = cached["status"]["allocation"]["devices"]["results"]
    assert len(results) == slimming.MAX_ALLOCATION_RESULTS
    # A cut name still matches no device of a valid name.
    assert len(results[0]["device"]) == slimming.MAX_LABEL + 1
    assert results[1] == {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}
    # Only the metadata.name terms (the outside allocator's shape) are kept.
    assert cached["status"]["allocation"]["nodeSelector"] == dra_holds.node_selector("n1")
