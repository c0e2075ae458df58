"""A world for the controllers of VMs on claims (template claims, claim protection,
attachments, placement and its node rejections), on in-memory caches.

Real ``Store``s (through the real shared-cache registration) and a real ``Ledger``; the
API server is the harness's fake (``harness.offline.FakeApi``): it keeps objects, applies
merge patches, honours resourceVersion and UID preconditions, and records every call.
"""

from __future__ import annotations

import copy
import datetime
import functools
from typing import Any

import pykube

from controllers import attachments, claim_protection, placement, template_claims
from gpuoperator import claim_status, names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.ledger import Ledger
from gpuoperator.model import references, slimming, vmi_admission
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.controlling import Result
from gpuoperator.settings import Settings
from harness import objects
from harness.offline import FakeApi, FakeRecorder, offline_caches

Obj = dict[str, Any]
NS = "tenant-a"
A10 = "nvidia.com/GA102GL_A10"
VMI_UID = "uid-vm1"
GATE = names.PLACEMENT_GATE
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


# -- objects ----------------------------------------------------------------------------------

TEMPLATE = objects.TEMPLATE
A10_CLASS = objects.gpuclass()
vmi = functools.partial(
    objects.vmi, refs=[{"claim": "hold-a"}, {"claimTemplate": TEMPLATE}], uid=VMI_UID
)
claim = functools.partial(
    objects.claim,
    rv="11",
    generation=1,
    finalizers=[names.CLAIM_PROTECTION_FINALIZER],
    created="2026-01-01T00:00:00Z",
)
launcher_pod = objects.launcher_pod


def gpu_node(name: str) -> Obj:
    return objects.node(name, 4, labels={"kubernetes.io/hostname": name})


# -- a world ----------------------------------------------------------------------------------


class World:
    def __init__(self, *, gpu_for_vms: bool = True) -> None:
        self.caches = offline_caches()
        self.api = FakeApi()
        self.recorder = FakeRecorder()
        self.clock = FakeClock(START)
        self.settings = Settings.model_validate({"gpuForVMs": gpu_for_vms, "refusalTTL": "10m"})
        self.inventory = Ledger()
        self.inventory.apply_class(A10_CLASS)
        self.inventory.apply_node(gpu_node("n1"))
        self.inventory.apply_node(gpu_node("n2"))
        self.caches.classes.store.put(A10_CLASS)

    @property
    def writer(self) -> FakeApi:
        return self.api

    @property
    def events(self) -> FakeRecorder:
        return self.recorder

    def put_claim(self, obj: Obj) -> Obj:
        """The claim as the API server and the caches (and so the inventory) have it."""
        stored = self.api.add(GPUClaim, obj)
        cached = slimming.slim_claim(stored)
        self.caches.claims.store.put(cached)
        self.inventory.apply_claim(cached)
        return stored

    def sync_claim(self, name: str) -> Obj:
        """Deliver the API server's current claim to the cache, as a watch would."""
        stored = copy.deepcopy(self.api.objects[("GPUClaim", NS, name)])
        cached = slimming.slim_claim(stored)
        self.caches.claims.store.put(cached)
        self.inventory.apply_claim(cached)
        return stored

    def put_vmi(self, obj: Obj) -> Obj:
        stored = self.api.add(VirtualMachineInstance, obj)
        self.caches.vmis.store.put(slimming.slim_vmi(stored))
        return stored

    def put_pod(self, obj: Obj) -> Obj:
        stored = self.api.add(pykube.Pod, obj)
        self.caches.pods.store.put(slimming.slim_pod(stored))
        return stored

    def template_claims(self) -> template_claims.TemplateClaims:
        return template_claims.TemplateClaims(
            self.caches, self.inventory, self.writer, self.events, self.settings
        )

    def admitted_vmi(self, **kwargs: Any) -> Obj:
        """The test VMI as the VMI webhook admitted it: its held claim hold-a exists, and its
        gpus entries are the webhook's for its references."""
        if self.caches.claims.store.get((NS, "hold-a")) is None:
            self.put_claim(claim("hold-a"))
        obj = vmi(**kwargs)
        refs = references.from_object(obj)
        claims = {c["metadata"]["name"]: c for c in self.caches.claims.store.values()}
        entries = vmi_admission.gpu_entries(refs, {"a10": A10_CLASS}, claims)
        obj["spec"] = {"domain": {"devices": {"gpus": entries}}}
        return self.put_vmi(obj)

    def attachments(self, grace: float = 30.0) -> attachments.Attachments:
        return attachments.Attachments(
            self.caches, self.writer, self.events, self.settings, clock=self.clock, grace=grace
        )

    def protection(self) -> claim_protection.ClaimProtection:
        return claim_protection.ClaimProtection(self.caches, self.writer, self.events)

    def placement(self) -> placement.Placement:
        statuses = claim_status.ClaimStatus(self.api, self.inventory, self.recorder)
        return placement.Placement(
            self.caches,
            self.inventory,
            self.writer,
            statuses,
            self.events,
            self.settings,
            clock=self.clock,
        )


def free_units(world: World, node: str) -> int:
    """The inventory's free units of class a10 on ``node``."""
    view = world.inventory.node(node)
    assert view is not None
    [entry] = [c for c in view.classes if c["name"] == "a10"]
    return entry["free"]


def requeue(result: Result | None) -> float | None:
    return None if result is None else result.requeue_after


# -- a VM's set of claims -------------------------------------------------------------------


def bound_set(world: World, hold_node: str = "n1", template_node: str = "n1") -> None:
    world.put_vmi(vmi())
    world.put_claim(
        claim("hold-a", phase="Bound", node=hold_node, attached={"vmi": "vm1", "uid": VMI_UID})
    )
    world.put_claim(
        claim("vm1-gpu-1", count=2, phase="Bound", node=template_node, owner_uid=VMI_UID)
    )


POD = (NS, "virt-launcher-vm1-abcde")
OURS = {"vmi": "vm1", "uid": VMI_UID}
