"""Preemptible classes on the real control plane: a guaranteed order that fits nowhere takes
back idle spot holds on the same resource (newest first, no more than it needs) and is bound
in the same pass; running spot VMs, guaranteed holds and spot orders take nothing; a running
spot VM is told, then stopped after the grace (a VirtualMachine halted, a bare VMI deleted).
The suite's over-allocation check closes every test."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from functools import partial

import pykube
import pytest

from gpuoperator.kinds import GPUClass, VirtualMachine, VirtualMachineInstance
from harness.claims import bound_node, claim_status, create_claim, event_messages, start_vm
from harness.fleet import Fleet, published
from harness.kube import Obj
from harness.operator import Deployed
from harness.waiting import wait_for
from harness.webhooks import WebhookOperator, webhook_operator

CONVERGE = 30.0


#: The module's replica gives running spot VMs this much notice (the default is 2 minutes).
GRACE = 15.0


@pytest.fixture(scope="module")
def hooks(
    api: pykube.HTTPClient, deployed: Deployed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookOperator]:
    """The module's operator, with a short ``preemptionGrace`` where the suite runs the
    operator's process (a deployed operator runs its Deployment's settings, and the tests
    that wait for the grace are left out there)."""
    extra = () if deployed.in_cluster else (f"--preemption-grace={GRACE:g}s",)
    with webhook_operator(api, deployed, tmp_path_factory.mktemp("preemption"), *extra) as w:
        yield w


@pytest.fixture
def fleet(fleet: Fleet, hooks: WebhookOperator) -> Fleet:
    """The shared fleet, with this module's webhooks served."""
    return fleet


def bound_reason(api: pykube.HTTPClient, ns: str, name: str) -> str:
    found: list[Obj] = claim_status(api, ns, name).get("conditions", [])
    return next((str(c.get("reason")) for c in found if c["type"] == "Bound"), "")


def waits(api: pykube.HTTPClient, ns: str, name: str) -> str:
    """The reason the claim waits, once it says it waits."""
    return wait_for(
        f"{ns}/{name} waiting",
        partial(bound_reason, api, ns, name),
        until=lambda r: r not in ("", "Bound"),
        timeout=CONVERGE,
    )


def class_status(api: pykube.HTTPClient, name: str) -> Obj:
    found: Obj = GPUClass.objects(api).get(name=name).obj.get("status") or {}
    return found


def past_its_bind(api: pykube.HTTPClient, ns: str, name: str) -> None:
    """Wait until the clock has left the second the claim was bound in: "newest" compares
    ``boundTime``, which the API stores to the second, and names break ties within one."""
    bound = datetime.datetime.fromisoformat(claim_status(api, ns, name)["boundTime"])
    wait_for(
        f"the second after {ns}/{name} was bound",
        lambda: datetime.datetime.now(datetime.UTC) >= bound + datetime.timedelta(seconds=1),
        timeout=5,
    )


def test_a_guaranteed_order_takes_back_the_newest_idle_spot_hold_and_nothing_else(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    guaranteed = fleet.gpu_class()
    spot = fleet.gpu_class("-spot", preemptible=True)
    node = fleet.node(4)
    published(api, spot, 4)
    # Named so that a tie would pick the wrong one: only the bind times tell them apart.
    for name, count in (("b-old", 2), ("a-new", 1), ("spot-vm", 1)):
        create_claim(api, tenant, name, spot, count)
        assert bound_node(api, tenant, name) == node
        past_its_bind(api, tenant, name)
    start_vm(api, tenant, "vm-1", "spot-vm", timeout=CONVERGE)

    # The class publishes what it may take back: every spot unit, the running VM's too.
    wait_for(
        f"class {guaranteed} showing what it may take back",
        partial(class_status, api, guaranteed),
        until=lambda s: (
            (s.get("maxFreePerNode"), s.get("reclaimable"), s.get("maxReclaimablePerNode"))
            == (0, 4, 4)
        ),
        timeout=CONVERGE,
    )
    create_claim(api, tenant, "order", guaranteed, 1)
    assert bound_node(api, tenant, "order") == node
    taken = wait_for(
        "the Preempted event on a-new",
        partial(event_messages, api, tenant, "a-new", "Preempted"),
        timeout=CONVERGE,
    )
    assert taken == [
        f"units on node {node} were taken back for guaranteed claim {tenant}/order of class "
        f"{guaranteed} (class {spot} is preemptible); the claim will be bound again where "
        "room is"
    ]
    assert claim_status(api, tenant, "a-new").get("phase") == "Pending"
    assert "nodeName" not in claim_status(api, tenant, "a-new")
    # The idle hold that is older and the running VM's hold stay.
    for name in ("b-old", "spot-vm"):
        assert claim_status(api, tenant, name)["nodeName"] == node
        assert event_messages(api, tenant, name, "Preempted") == []
    # Idle holds were enough: the running VM got no notice.
    assert preempting(api, tenant, "spot-vm") is None


def test_a_bigger_order_takes_one_big_hold_rather_than_several_small_ones(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    guaranteed = fleet.gpu_class()
    spot = fleet.gpu_class("-spot", preemptible=True)
    node = fleet.node(3)
    published(api, spot, 3)
    for name, count in (("big", 2), ("small", 1)):
        create_claim(api, tenant, name, spot, count)
        assert bound_node(api, tenant, name) == node
        past_its_bind(api, tenant, name)

    # Taken in order (newest first) small, then big; big alone covers 2, so small stays.
    create_claim(api, tenant, "order", guaranteed, 2)
    assert bound_node(api, tenant, "order") == node
    assert claim_status(api, tenant, "small")["nodeName"] == node
    assert wait_for(
        "the Preempted event on big",
        partial(event_messages, api, tenant, "big", "Preempted"),
        timeout=CONVERGE,
    )
    assert waits(api, tenant, "big") in ("Preempted", "NoCapacity")


def test_guaranteed_holds_are_never_taken_and_spot_orders_take_nothing(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    guaranteed = fleet.gpu_class()
    spot = fleet.gpu_class("-spot", preemptible=True)
    node = fleet.node(2)
    published(api, guaranteed, 2)
    create_claim(api, tenant, "held", guaranteed, 2)
    assert bound_node(api, tenant, "held") == node

    # Neither class has room, and neither may take a guaranteed hold: both say so.
    for cls in (guaranteed, spot):
        status = wait_for(
            f"class {cls} showing no room",
            partial(class_status, api, cls),
            until=lambda s: s.get("maxFreePerNode") == 0,
            timeout=CONVERGE,
        )
        assert "reclaimable" not in status and "maxReclaimablePerNode" not in status
        with pytest.raises(pykube.exceptions.HTTPError) as refused:
            create_claim(api, tenant, f"order-{cls}", cls, 1)
        assert f"spec.count: class {cls} has no free GPU on any node" in str(refused.value)
    assert claim_status(api, tenant, "held")["nodeName"] == node
    assert event_messages(api, tenant, "held", "Preempted") == []


def preempting(api: pykube.HTTPClient, ns: str, name: str) -> Obj | None:
    found: list[Obj] = claim_status(api, ns, name).get("conditions", [])
    return next((c for c in found if c["type"] == "Preempting"), None)


def vmi_gone(api: pykube.HTTPClient, ns: str, name: str) -> bool:
    return VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name=name) is None


def spot_vm_filling_a_node(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, units: int, run: Obj | None = None
) -> tuple[str, str]:
    """A guaranteed class and a spot one on a node of ``units``, all of them held by the
    spot claim ``spot-vm`` that VM ``vm-1`` runs on (a VirtualMachine running as ``run``
    says, if given); the guaranteed class counting them as what it may take back. Returns
    the guaranteed class and the node."""
    guaranteed = fleet.gpu_class()
    spot = fleet.gpu_class("-spot", preemptible=True)
    node = fleet.node(units)
    published(api, spot, units)
    create_claim(api, tenant, "spot-vm", spot, units)
    assert bound_node(api, tenant, "spot-vm") == node
    start_vm(api, tenant, "vm-1", "spot-vm", timeout=CONVERGE, run=run)
    wait_for(
        f"class {guaranteed} counting the running VM's units",
        partial(class_status, api, guaranteed),
        until=lambda s: (
            (s.get("maxFreePerNode"), s.get("reclaimable"), s.get("maxReclaimablePerNode"))
            == (0, units, units)
        ),
        timeout=CONVERGE,
    )
    return guaranteed, node


@pytest.mark.operator_process  # the module's replica runs with a short preemptionGrace
def test_a_running_spot_vm_is_told_then_stopped_and_its_hold_goes_to_the_order(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    guaranteed, node = spot_vm_filling_a_node(api, fleet, tenant, 2)

    create_claim(api, tenant, "order", guaranteed, 2)
    notice = wait_for(
        "the notice on spot-vm",
        partial(preempting, api, tenant, "spot-vm"),
        until=lambda c: c is not None and c["status"] == "True",
        timeout=CONVERGE,
    )
    assert notice is not None and notice["reason"] == "StopScheduled"
    assert f"VM {tenant}/vm-1 will be stopped at " in notice["message"]
    assert f"guaranteed claim {tenant}/order of class {guaranteed}" in notice["message"]
    # Told before it happens: the VM still runs and the order still waits.
    assert not vmi_gone(api, tenant, "vm-1")
    assert claim_status(api, tenant, "order").get("phase") != "Bound"

    wait_for("vm-1 stopped", partial(vmi_gone, api, tenant, "vm-1"), timeout=GRACE + CONVERGE)
    assert bound_node(api, tenant, "order", node, timeout=CONVERGE) == node
    taken = claim_status(api, tenant, "spot-vm")
    assert taken.get("phase") == "Pending" and preempting(api, tenant, "spot-vm") is None
    assert event_messages(api, tenant, "spot-vm", "VMStopped") == [
        f"VM {tenant}/vm-1 was stopped: guaranteed claim {tenant}/order takes back the units "
        "it used"
    ]
    assert len(event_messages(api, tenant, "spot-vm", "Preempted")) == 1


@pytest.mark.operator_process  # the module's replica runs with a short preemptionGrace
def test_a_notice_is_withdrawn_when_the_order_goes_and_the_vm_keeps_running(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str
) -> None:
    guaranteed, node = spot_vm_filling_a_node(api, fleet, tenant, 1)
    order = create_claim(api, tenant, "order", guaranteed, 1)
    wait_for(
        "the notice on spot-vm",
        partial(preempting, api, tenant, "spot-vm"),
        until=lambda c: c is not None,
        timeout=CONVERGE,
    )
    order.delete()
    wait_for(
        "the notice withdrawn",
        partial(preempting, api, tenant, "spot-vm"),
        until=lambda c: c is None,
        timeout=CONVERGE,
    )
    assert event_messages(api, tenant, "spot-vm", "PreemptionCancelled") == [
        "no guaranteed order needs the units of this claim's VM any more; it keeps running"
    ]
    assert not vmi_gone(api, tenant, "vm-1")
    assert claim_status(api, tenant, "spot-vm")["nodeName"] == node


def vm_of(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    return dict(VirtualMachine.objects(api, namespace=ns).get(name=name).obj)


@pytest.mark.operator_process  # the module's replica runs with a short preemptionGrace
@pytest.mark.parametrize(
    ("run", "halted"),
    [
        ({"runStrategy": "Always"}, {"runStrategy": "Halted"}),
        ({"running": True}, {"running": False}),
    ],
    ids=["runStrategy", "running"],
)
def test_a_running_spot_virtual_machine_is_halted_and_its_hold_goes_to_the_order(
    api: pykube.HTTPClient, fleet: Fleet, tenant: str, run: Obj, halted: Obj
) -> None:
    guaranteed, node = spot_vm_filling_a_node(api, fleet, tenant, 2, run=run)
    vmi = VirtualMachineInstance.objects(api, namespace=tenant).get(name="vm-1").obj
    assert [o["kind"] for o in vmi["metadata"]["ownerReferences"]] == ["VirtualMachine"]

    create_claim(api, tenant, "order", guaranteed, 2)
    notice = wait_for(
        "the notice on spot-vm",
        partial(preempting, api, tenant, "spot-vm"),
        until=lambda c: c is not None and c["status"] == "True",
        timeout=CONVERGE,
    )
    assert notice is not None and notice["reason"] == "StopScheduled"
    assert vm_of(api, tenant, "vm-1")["spec"].items() >= run.items(), "told, not yet halted"

    # After the grace the VirtualMachine is halted (in the field it uses), and KubeVirt's VM
    # controller stops its VMI; nothing starts a new one.
    stopped = wait_for(
        "vm-1 Stopped",
        partial(vm_of, api, tenant, "vm-1"),
        until=lambda vm: (vm.get("status") or {}).get("printableStatus") == "Stopped",
        timeout=GRACE + CONVERGE,
    )
    assert stopped["spec"].items() >= halted.items(), stopped["spec"]
    assert stopped["status"]["created"] is False and stopped["status"]["ready"] is False
    assert vmi_gone(api, tenant, "vm-1")
    assert bound_node(api, tenant, "order", node, timeout=CONVERGE) == node
    assert claim_status(api, tenant, "spot-vm").get("phase") == "Pending"
    assert event_messages(api, tenant, "spot-vm", "VMStopped") == [
        f"VM {tenant}/vm-1 was stopped: guaranteed claim {tenant}/order takes back the units "
        "it used"
    ]
