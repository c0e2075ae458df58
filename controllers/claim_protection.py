"""Claim protection: a claim serving a VMI that is not yet gone is not removed until the VMI
is gone (docs/design.md §2 GPUClaim finalizer, §10).

Every claim carries the finalizer ``gpu.cozystack.io/claim-protection`` (as a PVC carries
``kubernetes.io/pvc-protection``). It is set at admission where it can be (the
MutatingAdmissionPolicy of ``config/policy``, in the API server; template claims are created
with it), sparing a write per claim; this controller adds it to any claim that came without
(the policy is not installed, or the cluster predates it), and the binder binds only claims
that carry it. When a claim is being deleted, the finalizer is removed
once the VMI it serves (``model.claims.user``: a template claim's owner, a held claim's
attachment) is no longer a live user (``model.claims.is_live_user``): it no longer exists,
or has another UID than the one recorded. A VMI being deleted is still a user — its launcher
pod may hold the GPU during the VM's graceful shutdown — so the claim, and the units it
holds, stay until the VMI is gone. Until then an Event says why (once per state: a VMI
that changes while it is being deleted does not repeat it). One exception
(``model.claims.protects``): a VMI deleted with foreground propagation waits for its template
claims (their ownerReference blocks its deletion), so once none of its pods is left, they are
released rather than wait for each other.

The cache keeps a slim copy of each claim (``model.slimming.slim_claim``): a finalizer write
starts from the API server's copy, under the resourceVersion the cache showed.

Before releasing a claim whose user the cache no longer shows, the VMI is read from the API
server: a cache behind a VMI created a moment ago must not release that VMI's claim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import structlog

from gpuoperator import names
from gpuoperator.caches import Caches, own_key
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from gpuoperator.model import claims, pods
from gpuoperator.runtime import managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key

log = structlog.get_logger(__name__)

NAME = "claim-protection"
FINALIZER = names.CLAIM_PROTECTION_FINALIZER

HELD = "DeletionHeld"


class ApiAccess(protocols.Gets, protocols.Replaces, Protocol):
    """What claim protection asks of the API server: a live read, and the claim replaced
    without its finalizer."""


class ManagerAccess(managing.Controls, Protocol):
    """What ``register`` uses of the manager: its fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


class ClaimProtection:
    def __init__(
        self, caches: Caches, writer: ApiAccess, recorder: protocols.RecordsEvents
    ) -> None:
        self.caches = caches
        self.writer = writer
        self.recorder = recorder
        #: claim key -> the hold last reported (log line and Event only when it changes)
        self._held: dict[Key, str] = {}
        self._lock = threading.Lock()

    def reconcile(self, key: Key) -> Result | None:
        claim = self.caches.claims.store.get(key)
        if claim is None or not (claim.get("metadata") or {}).get("deletionTimestamp"):
            self._forget(key)
        if claim is None:
            return None
        meta = claim["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if not meta.get("deletionTimestamp"):
            if FINALIZER not in finalizers:
                self._write_finalizers(claim, lambda found: [*found, FINALIZER])
            return None
        if FINALIZER not in finalizers:
            return None
        user = claims.user(claim)
        if user is not None:
            vmi = self.caches.vmis.store.get((key[0], user.name))
            if not claims.is_live_user(user, vmi):
                vmi = self.writer.get_or_none(VirtualMachineInstance, user.name, key[0])
            if claims.protects(user, vmi, pods_left=self._pods_left(key[0], vmi)):
                assert vmi is not None
                deleting = bool((vmi.get("metadata") or {}).get("deletionTimestamp"))
                how = "is being deleted" if deleting else "still exists"
                message = (
                    f"deletion waits for VM instance {user.name}, which uses this claim and "
                    f"{how}; the claim is removed once that VM instance is gone"
                )
                if self._report(key, message):
                    log.info("claim deletion held", reason="UsedByLiveVMI", vmi=user.name)
                    self.recorder.event(claim, "Normal", HELD, message, kind=names.GPU_CLAIM)
                else:
                    log.debug("claim deletion still held", reason="UsedByLiveVMI", vmi=user.name)
                return None  # the VMI's deletion enqueues this claim again
        if not self._write_finalizers(claim, lambda found: [f for f in found if f != FINALIZER]):
            return None
        self._forget(key)
        log.info("claim released", reason="NoLiveVMI", vmi=user.name if user else None)
        return None

    def _write_finalizers(self, claim: Obj, change: Callable[[list[str]], list[str]]) -> bool:
        """Write ``change`` of the claim's finalizers; ``False`` when the claim changed since
        the cached copy this was decided on (its next event decides again).

        The cache keeps only the finalizer this controller owns, and neither the tenant's
        labels and annotations (``model.slimming``): the write is the API server's copy with
        the finalizers changed, under that copy's resourceVersion, and only while that copy
        is the one the cache showed."""
        meta = claim["metadata"]
        stored = self.writer.get_or_none(GPUClaim, meta["name"], meta["namespace"])
        stored_meta = (stored or {}).get("metadata") or {}
        if stored is None or stored_meta.get("resourceVersion") != meta.get("resourceVersion"):
            log.info("claim changed since the cache saw it; judging again", reason="Changed")
            return False
        found = [str(f) for f in stored_meta.get("finalizers") or []]
        self.writer.replace(
            GPUClaim, {**stored, "metadata": {**stored_meta, "finalizers": change(found)}}
        )
        return True

    def _report(self, key: Key, message: str) -> bool:
        """Whether ``message`` is news for the claim (then it is remembered)."""
        with self._lock:
            news = self._held.get(key) != message
            self._held[key] = message
        return news

    def _forget(self, key: Key) -> None:
        with self._lock:
            self._held.pop(key, None)

    def _pods_left(self, namespace: str, vmi: Obj | None) -> bool:
        """Whether a pod the VMI controls has not terminated yet."""
        meta = (vmi or {}).get("metadata") or {}
        uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
        return bool(uid) and any(
            not pods.is_terminated(p)
            and (owner := claims.controlling_vmi(p)) is not None
            and owner.uid == uid
            for p in self.caches.pods_of_vmi(namespace, name)
        )


def claims_of_vmi(caches: Caches, vmi: Obj) -> list[Key]:
    """The claims that serve a VMI of this name: attached to it or owned by it."""
    return _claims_serving(caches, vmi["metadata"].get("namespace", ""), vmi["metadata"]["name"])


def claims_of_pod(caches: Caches, pod: Obj) -> list[Key]:
    """The claims that serve the VMI controlling ``pod`` (none for a pod no VMI controls).

    A VMI deleted in the foreground releases its claims once its pods are gone
    (``model.claims.protects``), and nothing else need change when they go: neither the VMI
    (KubeVirt may not write the status of a VMI being deleted) nor the claims (the garbage
    collector may have marked them before the pods went). So a pod's change wakes them."""
    owner = claims.controlling_vmi(pod)
    if owner is None:
        return []
    return _claims_serving(caches, str(pod["metadata"].get("namespace") or ""), owner.name)


def _claims_serving(caches: Caches, namespace: str, vmi_name: str) -> list[Key]:
    found = []
    for c in caches.claims_of_vmi(namespace, vmi_name):
        user = claims.user(c)
        if user is not None and user.name == vmi_name:
            found.append(claims.key(c))
    return sorted(found)


def register(
    manager: ManagerAccess, caches: Caches, recorder: protocols.RecordsEvents, workers: int = 2
) -> Controller[Key]:
    controller = manager.controller(
        NAME,
        ClaimProtection(caches, manager.writer, recorder),
        workers=workers,
        seed=lambda: list(caches.claims.store),
    )
    manager.add_controller(
        controller,
        [
            (caches.claims, own_key),
            (caches.vmis, lambda vmi: claims_of_vmi(caches, vmi)),
            (caches.pods, lambda pod: claims_of_pod(caches, pod)),
        ],
    )
    return controller
