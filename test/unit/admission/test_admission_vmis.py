"""The VMI webhook (docs/design.md §5 "VMs"): a VMI with claim references is refused with every
reason the model finds (prefixed with the VMI), or admitted with one ``gpus`` entry per unit.
It writes nothing (it holds no client: the attachments controller records attachments), so a
dry run is answered exactly as a real create, and its refusals name nothing the review did
not bring beyond facts about the claims it names. Its registration (config/webhook) is
checked with the shipped manifests (test/unit/config/test_config_webhooks.py)."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from admission import vmis
from gpuoperator import names, settings
from gpuoperator.ledger import Ledger
from gpuoperator.runtime import admitting, serving
from harness import objects
from harness.objects import gpuclass
from harness.offline import apply_json_patch, store_caches

Obj = dict[str, Any]
NS = "tenant-a"
A10_RES = "nvidia.com/GA102GL_A10"
L40S_RES = "nvidia.com/L40S-24Q"
WHO = f"VirtualMachineInstance {NS}/vm1: "
ANNOTATION = "annotation gpu.cozystack.io/claims"


# -- fakes ------------------------------------------------------------------------------------


class FakeInventory:
    def __init__(
        self, permitted: frozenset[str] | None = None, largest: dict[str, int] | None = None
    ) -> None:
        self._permitted = permitted
        self._largest = largest if largest is not None else {}

    def permitted(self) -> frozenset[str] | None:
        return self._permitted

    def largest_allocatable(self, class_name: str) -> int:
        return self._largest.get(class_name, 8)


def _inventory_fits(inventory: Ledger) -> vmis.WebhookInventory:
    return inventory  # mypy checks that the real inventory fits the protocol


# -- objects ----------------------------------------------------------------------------------


def claim(
    name: str,
    class_name: str = "a10",
    count: int = 1,
    *,
    rv: str = "7",
    template: bool = False,
    deleting: bool = False,
    attachment: Obj | None = None,
) -> Obj:
    return objects.claim(
        name,
        class_name=class_name,
        count=count,
        rv=rv,
        labels={names.TEMPLATE_CLAIM_LABEL: names.TRUE} if template else None,
        deleting=deleting,
        phase="Bound" if attachment is not None else None,
        attached=attachment,
    )


def vmi(
    name: str = "vm1",
    refs: str | None = None,
    *,
    labelled: bool = True,
    uid: str | None = None,
    gpus: list[Obj] | None = None,
    deleting: bool = False,
    namespace: bool = False,
) -> Obj:
    meta: Obj = {"name": name} if name else {"generateName": "vm-"}
    if namespace:
        meta["namespace"] = NS
    if uid:
        meta["uid"] = uid
    if labelled:
        meta["labels"] = {"gpu.cozystack.io/claims": "true", "app": "x"}
    if refs is not None:
        meta["annotations"] = {"gpu.cozystack.io/claims": refs}
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T11:00:00Z"
    devices: Obj = {"disks": [{"name": "root"}]}
    if gpus is not None:
        devices["gpus"] = gpus
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {"domain": {"devices": devices}},
    }


def request(
    obj: Obj, *, operation: str = "CREATE", dry_run: bool = False
) -> admitting.AdmissionRequest:
    return objects.admission_request(
        obj,
        kind="VirtualMachineInstance",
        group="kubevirt.io",
        operation=operation,
        dry_run=dry_run,
    )


class World:
    """Caches, inventory and settings around one webhook."""

    def __init__(
        self,
        *,
        claims: list[Obj] | None = None,
        vmis_: list[Obj] | None = None,
        entitled: bool = False,
        permitted: frozenset[str] | None = None,
        largest: dict[str, int] | None = None,
        switch: bool = True,
    ) -> None:
        self.caches = store_caches()
        for cls in (
            gpuclass("a10"),
            gpuclass("a10-max4", maxCount=4),
            gpuclass("l40s", mode="vgpu", resource=L40S_RES),
        ):
            self.caches.classes.store.put(cls)
        for obj in claims or []:
            self.caches.claims.store.put(obj)
        for obj in vmis_ or []:
            self.caches.vmis.store.put({**obj, "metadata": {**obj["metadata"], "namespace": NS}})
        labels = {"gpu.cozystack.io/vgpu-entitled": "true"} if entitled else {}
        self.caches.namespaces.store.put({"metadata": {"name": NS, "labels": labels}})
        self.settings = settings.load({"gpuForVMs": str(switch).lower()}, {}, {})
        self.webhook = vmis.VmiWebhook(
            self.caches, FakeInventory(permitted, largest), self.settings
        )

    def admit(self, obj: Obj, **kwargs: Any) -> admitting.Admission:
        return self.webhook(request(obj, **kwargs))


HOLD_A = claim("hold-a")
HOLD_B = claim("hold-b", count=2, rv="9")


def test_the_webhook_holds_no_client() -> None:
    """It cannot write: its only inputs are the caches, the inventory and the settings."""
    assert set(inspect.signature(vmis.VmiWebhook).parameters) == {
        "caches",
        "inventory",
        "settings",
    }


# -- out of scope -----------------------------------------------------------------------------


def test_a_vmi_without_the_claims_label_is_admitted_untouched() -> None:
    world = World()
    admission = world.admit(vmi(refs='[{"claimTemplate":{"className":"a10"}}]', labelled=False))
    assert admission == admitting.Admission.allow()


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_judged(operation: str) -> None:
    world = World(claims=[HOLD_A])
    admission = world.admit(vmi(refs="not json"), operation=operation)
    assert admission == admitting.Admission.allow()


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refs", "fragment"),
    [
        pytest.param(None, f"{ANNOTATION}: missing", id="missing"),
        pytest.param("not json", f"{ANNOTATION}: not valid JSON", id="not-json"),
        pytest.param("[]", f"{ANNOTATION}: the list is empty", id="empty"),
        pytest.param('[{"claim":"A"}]', f"{ANNOTATION}: item 1: claim must be", id="bad-name"),
    ],
)
def test_a_labelled_vmi_with_a_missing_or_malformed_annotation_is_refused(
    refs: str | None, fragment: str
) -> None:
    world = World(claims=[HOLD_A])
    admission = world.admit(vmi(refs=refs))
    assert not admission.allowed
    assert admission.code == 403
    assert admission.message.startswith(WHO + fragment), admission.message


@pytest.mark.parametrize(
    ("world_kwargs", "obj", "fragments"),
    [
        pytest.param(
            {"switch": False},
            vmi(refs='[{"claimTemplate":{"className":"a10","count":1}}]'),
            [f"{ANNOTATION}: GPU claim references are switched off", "gpuForVMs"],
            id="switch-off",
        ),
        pytest.param(
            {},
            vmi(refs='[{"claimTemplate":{"className":"nope","count":1}}]'),
            [f"{ANNOTATION}: item 1: claimTemplate.className: class nope does not exist"],
            id="unknown-class",
        ),
        pytest.param(
            {"claims": [HOLD_A]},
            vmi(refs='[{"claim":"ghost"}]'),
            [f"{ANNOTATION}: item 1: claim ghost: no such GPUClaim in namespace {NS}"],
            id="unknown-claim",
        ),
        pytest.param(
            {
                "claims": [claim("hold-a", attachment={"vmi": "other", "uid": "u-o"})],
                "vmis_": [vmi("other", uid="u-o")],
            },
            vmi(refs='[{"claim":"hold-a"}]'),
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is in use by another VM instance"],
            id="attached-to-another-live-vmi",
        ),
        pytest.param(
            {"claims": [HOLD_A], "vmis_": [vmi("other", '[{"claim":"hold-a"}]', uid="u-o")]},
            vmi(refs='[{"claim":"hold-a"}]'),
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is in use by another VM instance"],
            id="named-by-another-live-vmi",
        ),
        pytest.param(
            {"claims": [claim("vm0-gpu-0", template=True)]},
            vmi(refs='[{"claim":"vm0-gpu-0"}]'),
            [f"{ANNOTATION}: item 1: claim vm0-gpu-0: the operator made this claim"],
            id="template-claim-named-directly",
        ),
        pytest.param(
            {},
            vmi(refs='[{"claimTemplate":{"className":"a10-max4","count":5}}]'),
            [f"{ANNOTATION}: item 1: claimTemplate.count: class a10-max4 allows at most 4 GPUs"],
            id="count-above-max-count",
        ),
        pytest.param(
            {},
            vmi(refs='[{"claimTemplate":{"className":"l40s","count":1}}]'),
            [f"class l40s is a vGPU class; namespace {NS} is not entitled"],
            id="vgpu-not-entitled",
        ),
        pytest.param(
            {"claims": [HOLD_A]},
            vmi(refs='[{"claim":"hold-a"}]', gpus=[{"name": "mine", "deviceName": A10_RES}]),
            ["spec.domain.devices.gpus: 1 entry (mine) next to claim references"],
            id="raw-gpus-and-references",
        ),
        pytest.param(
            {"permitted": frozenset({L40S_RES})},
            vmi(refs='[{"claimTemplate":{"className":"a10","count":1}}]'),
            [f"class a10 uses {A10_RES}, which the KubeVirt CR's"],
            id="not-permitted-host-device",
        ),
        pytest.param(
            {"claims": [claim("hold-a", deleting=True)]},
            vmi(refs='[{"claim":"hold-a"}]'),
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is being deleted"],
            id="claim-being-deleted",
        ),
        pytest.param(
            {"largest": {"a10": 4}},
            vmi(refs='[{"claimTemplate":{"className":"a10","count":5}}]'),
            [
                f"{ANNOTATION}: item 1: claimTemplate.count: 5 GPUs of class a10 could never "
                "fit on one node: the most one node serving class a10 has allocatable is 4; "
                "allowed: a count of at most 4"
            ],
            id="template-count-above-every-nodes-allocatable",
        ),
        pytest.param(
            {"largest": {"a10": 0}},
            vmi(refs='[{"claimTemplate":{"className":"a10","count":1}}]'),
            ["claimTemplate.count: 1 GPU of class a10 could never fit on one node: no node "],
            id="template-of-a-class-no-node-serves",
        ),
    ],
)
def test_refusals_name_the_vmi_and_the_reason(
    world_kwargs: dict[str, Any], obj: Obj, fragments: list[str]
) -> None:
    world = World(**world_kwargs)
    admission = world.admit(obj)
    assert not admission.allowed
    assert (admission.code, admission.reason) == (403, "Forbidden")
    name = obj["metadata"].get("name") or "(generated)"
    prefix = f"VirtualMachineInstance {NS}/{name}: "
    assert admission.message.startswith(prefix), admission.message
    for fragment in fragments:
        assert fragment in admission.message
    assert admission.patch == []


def test_every_refusal_is_joined_into_one_message() -> None:
    world = World(claims=[HOLD_A])
    refs = '[{"claim":"ghost"},{"claimTemplate":{"className":"nope","count":1}}]'
    admission = world.admit(vmi(refs=refs))
    assert not admission.allowed
    parts = admission.message.removeprefix(WHO).split("; ")
    assert [p.split(": ")[1] for p in parts if p.startswith(ANNOTATION)] == ["item 1", "item 2"]


# -- what a refusal tells ---------------------------------------------------------------------


def test_a_refusal_names_no_other_claim_no_other_vm_and_no_class_list() -> None:
    """A review naming a namespace (a forged one too: the webhook cannot verify its caller)
    learns nothing it did not name: not the namespace's other claims, not the VM that uses a
    claim, not the catalog or the KubeVirt CR's permitted table."""
    world = World(
        claims=[
            claim("secret-hold", attachment={"vmi": "victim-vm", "uid": "u-v"}),
            claim("other-hold"),
        ],
        vmis_=[vmi("victim-vm", '[{"claim":"secret-hold"}]', uid="u-v")],
        permitted=frozenset({L40S_RES, "intel.com/secret-nic"}),
    )
    refs = (
        '[{"claim":"ghost"},{"claim":"secret-hold"},'
        '{"claimTemplate":{"className":"nope","count":1}},'
        '{"claimTemplate":{"className":"a10","count":1}}]'
    )
    admission = world.admit(vmi("attacker", refs=refs))
    assert not admission.allowed
    message = admission.message
    assert "claim ghost: no such GPUClaim" in message
    assert "claim secret-hold: the claim is in use by another VM instance" in message
    assert "class nope does not exist" in message
    for secret in ("other-hold", "victim-vm", "u-v", "a10-max4", "l40s", "secret-nic"):
        assert secret not in message, (secret, message)


# -- admission --------------------------------------------------------------------------------


def test_admits_with_one_gpus_entry_per_unit() -> None:
    world = World(claims=[HOLD_A, HOLD_B, claim("spare")])
    refs = '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":2}},{"claim":"hold-b"}]'
    obj = vmi(refs=refs)
    admission = world.admit(obj)
    assert admission.allowed, admission.message
    assert admission.patch == [
        {
            "op": "add",
            "path": "/spec/domain/devices/gpus",
            "value": [{"name": f"gpuop-{n}", "deviceName": A10_RES} for n in range(5)],
        }
    ]
    patched = apply_json_patch(obj, admission.patch)
    assert patched["spec"]["domain"]["devices"]["disks"] == [{"name": "root"}]


def test_the_gpus_entries_create_missing_parents() -> None:
    obj = vmi(refs='[{"claimTemplate":{"className":"l40s","count":1}}]')
    del obj["spec"]["domain"]["devices"]
    world = World(entitled=True)
    admission = world.admit(obj)
    assert admission.allowed, admission.message
    assert admission.patch == [
        {
            "op": "add",
            "path": "/spec/domain/devices",
            "value": {"gpus": [{"name": "gpuop-0", "deviceName": L40S_RES}]},
        }
    ]


def test_a_template_count_equal_to_the_largest_allocatable_is_admitted() -> None:
    world = World(largest={"a10": 4})
    admission = world.admit(vmi(refs='[{"claimTemplate":{"className":"a10","count":4}}]'))
    assert admission.allowed, admission.message


def test_a_generated_name_is_admitted_with_held_claims_too() -> None:
    """The attachment is recorded once the VMI exists, under the name it got."""
    world = World(claims=[HOLD_A])
    refs = '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":1}}]'
    admission = world.admit(vmi("", refs=refs))
    assert admission.allowed, admission.message
    assert len(admission.patch) == 1


def test_the_namespace_comes_from_the_request() -> None:
    world = World(claims=[HOLD_A])
    with_ns = world.admit(vmi(refs='[{"claim":"hold-a"}]', namespace=True))
    without_ns = World(claims=[HOLD_A]).admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert with_ns.allowed
    assert without_ns.allowed
    assert with_ns.patch == without_ns.patch


@pytest.mark.parametrize(
    "attachment",
    [
        pytest.param({"vmi": "vm1", "uid": "old"}, id="earlier-vmi-of-this-name"),
        pytest.param({"vmi": "vm1"}, id="a-retried-create-of-this-name"),
        pytest.param({"vmi": "gone", "uid": "u-gone"}, id="attached-vmi-gone"),
        pytest.param({"vmi": "racer"}, id="unconfirmed-for-a-vmi-not-cached"),
    ],
)
def test_a_claim_attached_to_no_live_vmi_is_admitted(attachment: Obj) -> None:
    """The attachments controller moves the attachment once the old user is gone."""
    world = World(claims=[claim("hold-a", attachment=attachment)])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert admission.allowed, admission.message


def test_a_claim_attached_to_a_vmi_being_deleted_is_refused_until_that_vmi_is_gone() -> None:
    """The VMI being deleted may still hold the GPU through its launcher pod."""
    world = World(
        claims=[claim("hold-a", attachment={"vmi": "other", "uid": "u-o"})],
        vmis_=[vmi("other", '[{"claim":"hold-a"}]', uid="u-o", deleting=True)],
    )
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert "in use by another VM instance, which is being deleted" in admission.message

    gone = World(claims=[claim("hold-a", attachment={"vmi": "other", "uid": "u-o"})])
    assert gone.admit(vmi(refs='[{"claim":"hold-a"}]')).allowed


def test_a_vmi_restarting_under_the_same_name_is_admitted() -> None:
    old = vmi("vm1", '[{"claim":"hold-a"}]', uid="u-old", deleting=True)
    world = World(claims=[claim("hold-a", attachment={"vmi": "vm1", "uid": "u-old"})], vmis_=[old])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert admission.allowed, admission.message


# -- dry run ----------------------------------------------------------------------------------


def test_a_dry_run_is_answered_exactly_as_a_real_create() -> None:
    world = World(claims=[HOLD_A, HOLD_B])
    for refs in ('[{"claim":"hold-a"},{"claim":"hold-b"}]', '[{"claim":"ghost"}]'):
        obj = vmi(refs=refs)
        assert world.admit(obj, dry_run=True) == world.admit(obj)


# -- the server -------------------------------------------------------------------------------


def test_an_unexpected_error_is_refused_by_the_server() -> None:
    class Broken(FakeInventory):
        def largest_allocatable(self, class_name: str) -> int:
            raise RuntimeError("inventory broken")

    world = World()
    world.webhook.inventory = Broken()
    handler = admitting.app(
        {vmis.PATH: world.webhook}, ready=lambda: True, registry=CollectorRegistry()
    )
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request(vmi(refs='[{"claimTemplate":{"className":"a10","count":1}}]')).raw,
        }
    ).encode()
    status, review = _call(handler, body)
    assert status.startswith("200")
    assert review["response"]["allowed"] is False
    assert review["response"]["status"]["code"] == 500


def _call(handler: Any, body: bytes) -> tuple[str, Any]:
    response = handler(serving.Request("POST", vmis.PATH, body))
    return str(response.status), json.loads(response.body)
