"""GPU-hours on the real control plane: a claim's ``status.usage`` follows its VM (idle while
the VM is off, in use while its launcher pod runs) and the replica exports the totals."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pykube
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from harness.claims import create_vmi
from harness.fleet import Fleet, published
from harness.kube import Obj
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, webhook_operator

pytestmark = pytest.mark.operator_process  # it scrapes its own replica's metrics

CONVERGE = 30.0


@pytest.fixture(scope="module")
def hooks(
    api: pykube.HTTPClient, deployed: Deployed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookOperator]:
    with webhook_operator(
        api, deployed, tmp_path_factory.mktemp("gpuhours"), "--metrics-insecure"
    ) as w:
        yield w


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


def usage(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    status = GPUClaim.objects(api, namespace=ns).get(name=name).obj.get("status") or {}
    found: Obj = {**(status.get("usage") or {}), "boundTime": status.get("boundTime")}
    return found


def scraped(port: int, ns: str, claim: str) -> dict[str, float]:
    """``{state: value}`` of the claim's unit-seconds series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "gpuoperator_claim_gpu_unit_seconds_total":
                continue
            if sample.labels.get("namespace") == ns and sample.labels.get("claim") == claim:
                out[sample.labels["state"]] = sample.value
    return out


def test_a_claim_counts_idle_then_in_use_while_its_vm_runs(
    api: pykube.HTTPClient, hooks: WebhookOperator, fleet: Fleet, tenant: str
) -> None:
    cls = fleet.gpu_class()
    fleet.node(4)
    published(api, cls, 4)
    GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": "hold", "namespace": tenant},
            "spec": {"className": cls, "count": 2},
        },
    ).create()
    idle = wait_for(
        "the hold counted idle from its binding",
        lambda: usage(api, tenant, "hold"),
        until=lambda u: u.get("state") == "Idle",
        timeout=CONVERGE,
    )
    assert idle["since"] == idle["boundTime"]

    refs: list[dict[str, Any]] = [{"claim": "hold"}]
    vm = create_vmi(api, tenant, "vm-1", refs)
    in_use = wait_for(
        "the hold counted in use once the VM's pod runs",
        lambda: usage(api, tenant, "hold"),
        until=lambda u: u.get("state") == "InUse",
        timeout=CONVERGE,
    )
    assert in_use["since"] >= idle["since"]
    assert hooks.operator is not None
    port = hooks.operator.metrics_port
    series = wait_for(
        "the replica to export the hold's series",
        lambda: scraped(port, tenant, "hold"),
        until=lambda s: set(s) == {"idle", "in_use"},
        timeout=CONVERGE,
    )
    assert series["idle"] >= in_use["idleUnitSeconds"]

    vm.delete()
    stopped = wait_for(
        "the hold counted idle again once the VM is gone",
        lambda: usage(api, tenant, "hold"),
        until=lambda u: u.get("state") == "Idle" and u["since"] >= in_use["since"],
        timeout=CONVERGE,
    )
    # Two units: every closed interval is an even number of unit-seconds.
    assert stopped["inUseUnitSeconds"] % 2 == 0
    assert stopped["idleUnitSeconds"] == in_use["idleUnitSeconds"]
    after = scraped(port, tenant, "hold")
    assert after["in_use"] >= stopped["inUseUnitSeconds"]
    assert after["idle"] >= series["idle"]
