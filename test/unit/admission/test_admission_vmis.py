"""The VMI webhook (DESIGN.md §5 "VMs"): a VMI with claim references is refused with every
reason the model finds (prefixed with the VMI), or admitted with one ``gpus`` entry per unit;
each held claim's attachment is recorded with the claim's resourceVersion as precondition,
never on dry run, and a VMI whose claim could not be attached is refused with "retry". Its
registration (config/webhook) is checked with the shipped manifests
(test/unit/config/test_config_webhooks.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from admission import vmis
from gpuoperator import names, settings
from gpuoperator.inventory import Inventory
from gpuoperator.kinds import GPUClaim
from gpuoperator.runtime import admitting, errors, serving
from gpuoperator.runtime.client import Client, Kind
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


class FakeWriter:
    """Records every patch; raises the error given for a claim name instead of writing."""

    def __init__(self, failures: dict[str, Exception] | None = None) -> None:
        self.patches: list[tuple[Kind, str, Any, str | None, str | None]] = []
        self.failures = failures or {}
        self.gets: list[str] = []
        self.live: dict[str, Obj] = {}

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        self.patches.append((kind, name, copy.deepcopy(patch), namespace, subresource))
        if name in self.failures:
            raise self.failures[name]
        return {}

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        """The live claim after a conflict: as the cache had it, with a newer version."""
        self.gets.append(name)
        return self.live.get(name, {"metadata": {"name": name, "resourceVersion": "fresh"}})


class FakeInventory:
    def __init__(self, permitted: frozenset[str] | None = None) -> None:
        self._permitted = permitted

    def permitted(self) -> frozenset[str] | None:
        return self._permitted


def _client_is_a_status_writer(client: Client) -> vmis.StatusClient:
    return client  # mypy checks that the real client fits the protocol


def _inventory_has_permitted(inventory: Inventory) -> vmis.PermittedHostDevices:
    return inventory


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
    """Caches, inventory, settings and writer around one webhook."""

    def __init__(
        self,
        *,
        claims: list[Obj] | None = None,
        vmis_: list[Obj] | None = None,
        entitled: bool = False,
        permitted: frozenset[str] | None = None,
        switch: bool = True,
        failures: dict[str, Exception] | None = None,
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
        self.writer = FakeWriter(failures)
        self.settings = settings.load({"gpuForVMs": str(switch).lower()}, {}, {})
        self.webhook = vmis.VmiWebhook(
            self.caches, FakeInventory(permitted), self.settings, self.writer
        )

    def admit(self, obj: Obj, **kwargs: Any) -> admitting.Admission:
        return self.webhook(request(obj, **kwargs))


HOLD_A = claim("hold-a")
HOLD_B = claim("hold-b", count=2, rv="9")


def attachment_write(name: str, rv: str, vmi_name: str = "vm1") -> tuple[Any, ...]:
    body: Obj = {
        "status": {"attachment": {"vmi": vmi_name, "uid": None}},
        "metadata": {"resourceVersion": rv},
    }
    return (GPUClaim, name, body, NS, "status")


# -- out of scope -----------------------------------------------------------------------------


def test_a_vmi_without_the_claims_label_is_admitted_untouched() -> None:
    world = World()
    admission = world.admit(vmi(refs='[{"claimTemplate":{"className":"a10"}}]', labelled=False))
    assert admission == admitting.Admission.allow()
    assert world.writer.patches == []


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_judged(operation: str) -> None:
    world = World(claims=[HOLD_A])
    admission = world.admit(vmi(refs="not json"), operation=operation)
    assert admission == admitting.Admission.allow()
    assert world.writer.patches == []


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
    assert world.writer.patches == []


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
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is attached to VM other"],
            id="attached-to-another-live-vmi",
        ),
        pytest.param(
            {"claims": [HOLD_A], "vmis_": [vmi("other", '[{"claim":"hold-a"}]', uid="u-o")]},
            vmi(refs='[{"claim":"hold-a"}]'),
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is attached to VM other"],
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
            [f"class a10 uses {A10_RES}, which the KubeVirt CR's", f"permitted: {L40S_RES}"],
            id="not-permitted-host-device",
        ),
        pytest.param(
            {"claims": [claim("hold-a", deleting=True)]},
            vmi(refs='[{"claim":"hold-a"}]'),
            [f"{ANNOTATION}: item 1: claim hold-a: the claim is being deleted"],
            id="claim-being-deleted",
        ),
        pytest.param(
            {"claims": [HOLD_A]},
            vmi("", refs='[{"claim":"hold-a"}]'),
            ["metadata.name: a VM that names held claims", "generateName is not supported"],
            id="held-claims-need-a-name",
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
    assert world.writer.patches == []


def test_every_refusal_is_joined_into_one_message() -> None:
    world = World(claims=[HOLD_A])
    refs = '[{"claim":"ghost"},{"claimTemplate":{"className":"nope","count":1}}]'
    admission = world.admit(vmi(refs=refs))
    assert not admission.allowed
    parts = admission.message.removeprefix(WHO).split("; ")
    assert [p.split(": ")[1] for p in parts if p.startswith(ANNOTATION)] == ["item 1", "item 2"]
    assert world.writer.patches == []


# -- admission --------------------------------------------------------------------------------


def test_admits_with_one_gpus_entry_per_unit_and_attaches_each_held_claim() -> None:
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
    assert world.writer.patches == [
        attachment_write("hold-a", "7"),
        attachment_write("hold-b", "9"),
    ]


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


def test_template_references_only_write_nothing() -> None:
    world = World()
    admission = world.admit(vmi("", refs='[{"claimTemplate":{"className":"a10","count":1}}]'))
    assert admission.allowed, admission.message
    assert len(admission.patch) == 1
    assert world.writer.patches == []


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
    ],
)
def test_a_claim_attached_to_no_live_vmi_is_taken_over(attachment: Obj) -> None:
    world = World(claims=[claim("hold-a", attachment=attachment)])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert admission.allowed, admission.message
    # The UID of an earlier attachment is cleared; the claims controller records the new one.
    assert world.writer.patches == [attachment_write("hold-a", "7")]


def test_a_claim_attached_to_a_vmi_being_deleted_is_refused_until_that_vmi_is_gone() -> None:
    """The VMI being deleted may still hold the GPU through its launcher pod."""
    world = World(
        claims=[claim("hold-a", attachment={"vmi": "other", "uid": "u-o"})],
        vmis_=[vmi("other", '[{"claim":"hold-a"}]', uid="u-o", deleting=True)],
    )
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert "attached to VM other, which is being deleted" in admission.message
    assert world.writer.patches == []

    gone = World(claims=[claim("hold-a", attachment={"vmi": "other", "uid": "u-o"})])
    assert gone.admit(vmi(refs='[{"claim":"hold-a"}]')).allowed


# -- dry run ----------------------------------------------------------------------------------


def test_a_dry_run_is_judged_alike_and_writes_nothing() -> None:
    obj = vmi(refs='[{"claim":"hold-a"},{"claim":"hold-b"}]')
    real_world = World(claims=[HOLD_A, HOLD_B])
    real = real_world.admit(obj)
    dry_world = World(claims=[HOLD_A, HOLD_B])
    dry = dry_world.admit(obj, dry_run=True)
    assert dry.allowed
    assert dry.patch == real.patch
    assert dry_world.writer.patches == []
    assert len(real_world.writer.patches) == 2


def test_a_dry_run_is_refused_alike() -> None:
    world = World(claims=[HOLD_A])
    admission = world.admit(vmi(refs='[{"claim":"ghost"}]'), dry_run=True)
    assert not admission.allowed
    assert "no such GPUClaim" in admission.message
    assert world.writer.patches == []


# -- failed attachment ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "said"),
    [
        pytest.param(errors.ConflictError(409, "Conflict", "modified"), "changed", id="conflict"),
        pytest.param(errors.NotFoundError(404, "NotFound", "gone"), "was deleted", id="gone"),
    ],
)
def test_a_failed_attachment_refuses_the_vmi_with_retry(error: Exception, said: str) -> None:
    world = World(claims=[HOLD_A], failures={"hold-a": error})
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert (admission.code, admission.reason) == (409, "Conflict")
    assert admission.message.startswith(WHO + "claim hold-a: could not record its attachment")
    assert f"the claim {said} meanwhile" in admission.message
    assert "retry" in admission.message
    assert admission.patch == []


def test_any_other_api_error_refuses_with_retry() -> None:
    error = errors.ForbiddenError(403, "Forbidden", "no RBAC")
    world = World(claims=[HOLD_A], failures={"hold-a": error})
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert (admission.code, admission.reason) == (500, "InternalError")
    assert "403 Forbidden" in admission.message
    assert "retry shortly" in admission.message


def test_a_failure_on_the_second_claim_refuses_after_the_first_was_written() -> None:
    conflict = errors.ConflictError(409, "Conflict", "modified")
    world = World(claims=[HOLD_A, HOLD_B], failures={"hold-b": conflict})
    admission = world.admit(vmi(refs='[{"claim":"hold-a"},{"claim":"hold-b"}]'))
    assert not admission.allowed
    assert "claim hold-b" in admission.message
    # hold-a stays attached by name; the claims controller clears it (the VMI never appears).
    # A conflict is retried on a fresh read (the cache may lag the operator's own writes).
    assert [p[1] for p in world.writer.patches] == ["hold-a", "hold-b", "hold-b", "hold-b"]
    assert world.writer.gets == ["hold-b", "hold-b"]


def test_a_conflict_from_a_stale_cache_is_retried_with_the_fresh_version() -> None:
    class OnceStale(FakeWriter):
        def patch(
            self,
            kind: Any,
            name: str,
            patch: Any,
            namespace: str | None = None,
            *,
            subresource: str | None = None,
        ) -> Obj:
            if not self.gets:
                self.patches.append((kind, name, copy.deepcopy(patch), namespace, subresource))
                raise errors.ConflictError(409, "Conflict", "stale")
            return super().patch(kind, name, patch, namespace, subresource=subresource)

    world = World(claims=[HOLD_A])
    world.writer.__class__ = OnceStale
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert admission.allowed, admission.message
    versions = [p[2]["metadata"]["resourceVersion"] for p in world.writer.patches]
    assert versions[-1] == "fresh" and len(versions) == 2


def test_a_claim_attached_to_another_vm_meanwhile_is_not_retried() -> None:
    conflict = errors.ConflictError(409, "Conflict", "modified")
    world = World(claims=[HOLD_A], failures={"hold-a": conflict})
    world.writer.live["hold-a"] = {
        "metadata": {"name": "hold-a", "resourceVersion": "9"},
        "status": {"attachment": {"vmi": "other"}},
    }
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert len(world.writer.patches) == 1


def test_an_unexpected_error_propagates_to_the_server_which_refuses() -> None:
    world = World(claims=[HOLD_A], failures={"hold-a": RuntimeError("connection reset")})
    handler = admitting.app(
        {vmis.PATH: world.webhook}, ready=lambda: True, registry=CollectorRegistry()
    )
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request(vmi(refs='[{"claim":"hold-a"}]')).raw,
        }
    ).encode()
    status, review = _call(handler, body)
    assert status.startswith("200")
    assert review["response"]["allowed"] is False
    assert review["response"]["status"]["code"] == 500


# -- guards of the attachment write -----------------------------------------------------------


def test_a_claim_being_attached_to_a_vmi_not_yet_cached_is_refused_with_retry() -> None:
    world = World(claims=[claim("hold-a", attachment={"vmi": "racer"})])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert (admission.code, admission.reason) == (409, "Conflict")
    assert admission.message.startswith(
        WHO + f"{ANNOTATION}: item 1: claim hold-a: the claim is being attached to VM racer"
    )
    assert "retry shortly" in admission.message
    assert world.writer.patches == []


def test_a_vmi_name_already_taken_by_a_live_vmi_writes_nothing() -> None:
    world = World(claims=[HOLD_A], vmis_=[vmi("vm1", uid="u-1")])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert not admission.allowed
    assert admission.code == 409
    assert f"metadata.name: a VirtualMachineInstance vm1 already exists in namespace {NS}" in (
        admission.message
    )
    assert world.writer.patches == []


def test_a_vmi_restarting_under_the_same_name_is_admitted() -> None:
    old = vmi("vm1", '[{"claim":"hold-a"}]', uid="u-old", deleting=True)
    world = World(claims=[claim("hold-a", attachment={"vmi": "vm1", "uid": "u-old"})], vmis_=[old])
    admission = world.admit(vmi(refs='[{"claim":"hold-a"}]'))
    assert admission.allowed, admission.message
    assert world.writer.patches == [attachment_write("hold-a", "7")]


# -- the server --------------------------------------------------------------


def _call(handler: Any, body: bytes) -> tuple[str, Any]:
    response = handler(serving.Request("POST", vmis.PATH, body))
    return str(response.status), json.loads(response.body)
