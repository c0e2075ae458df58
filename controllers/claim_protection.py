"""Claim protection: a claim attached to a live VMI is not removed until the VMI is gone.

Every claim carries the finalizer ``gpu.cozystack.io/claim-protection`` (as a PVC carries
``kubernetes.io/pvc-protection``). When a claim is being deleted, the finalizer is removed
once no live VMI is attached to it: no ``status.attachment``, or the attached VMI no longer
exists, has another UID, or is itself being deleted. Until then the claim — and the units it
holds — stay, and an Event says why.
"""

from __future__ import annotations

import structlog

from gpuoperator import names
from gpuoperator.caches import BY_NAMESPACE, Caches, own_key
from gpuoperator.runtime.client import Client, Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.informing import Key
from gpuoperator.runtime.kinds import GPUClaim
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder

log = structlog.get_logger(__name__)

NAME = "claim-protection"
FINALIZER = names.CLAIM_PROTECTION_FINALIZER


def live_attachment(claim: Obj, vmi: Obj | None) -> bool:
    """Whether the VMI the claim is attached to still runs (pure)."""
    attachment = (claim.get("status") or {}).get("attachment") or {}
    if not attachment.get("vmi") or vmi is None:
        return False
    meta = vmi.get("metadata") or {}
    if attachment.get("uid") and meta.get("uid") != attachment["uid"]:
        return False
    return not meta.get("deletionTimestamp")


class ClaimProtection:
    def __init__(self, caches: Caches, writer: Client, recorder: Recorder) -> None:
        self.caches = caches
        self.writer = writer
        self.recorder = recorder

    def reconcile(self, key: Key) -> Result | None:
        claim = self.caches.claims.store.get(key)
        if claim is None:
            return None
        meta = claim["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if not meta.get("deletionTimestamp"):
            if FINALIZER not in finalizers:
                self.writer.replace(
                    GPUClaim,
                    {**claim, "metadata": {**meta, "finalizers": [*finalizers, FINALIZER]}},
                )
            return None
        if FINALIZER not in finalizers:
            return None
        vmi_name = ((claim.get("status") or {}).get("attachment") or {}).get("vmi")
        vmi = self.caches.vmis.store.get((key[0], vmi_name)) if vmi_name else None
        if live_attachment(claim, vmi):
            message = f"deletion waits for VM {vmi_name}, which is attached and still exists"
            log.info("claim deletion held", reason="AttachedToLiveVM", vmi=vmi_name)
            self.recorder.event(claim, "Normal", "DeletionHeld", message, kind=names.GPU_CLAIM)
            return None  # the VMI's deletion enqueues this claim again
        self.writer.replace(
            GPUClaim,
            {
                **claim,
                "metadata": {**meta, "finalizers": [f for f in finalizers if f != FINALIZER]},
            },
        )
        log.info("claim released", reason="NoLiveVM")
        return None


def register(
    manager: Manager, caches: Caches, recorder: Recorder, workers: int = 2
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        ClaimProtection(caches, manager.writer, recorder),
        workers=workers,
        seed=lambda: list(caches.claims.store),
    )

    def attached_claims(vmi: Obj) -> list[Key]:
        ns, name = vmi["metadata"].get("namespace", ""), vmi["metadata"]["name"]
        return [
            (ns, c["metadata"]["name"])
            for c in caches.claims.store.by_index(BY_NAMESPACE, ns)
            if ((c.get("status") or {}).get("attachment") or {}).get("vmi") == name
        ]

    manager.add_controller(controller, [(caches.claims, own_key), (caches.vmis, attached_claims)])
    return controller
