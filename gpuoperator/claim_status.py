"""Writing a claim's status: the one write-back of every controller that decides where a
claim is bound (the binder binds, loses and parks claims; placement moves them and records
node refusals; draining moves holds off cordoned nodes) and of GPU-hours' usage counts.
The statuses written are the model's (:mod:`gpuoperator.model.claim_states`); this module
only writes them and keeps the ledger's assumptions in step with each outcome. It is
part of the core, below the controllers that share it.

:meth:`ClaimStatus.write` does, in this order:

1. **assume** the new state into the ledger (``Ledger.assume``, the assume cache of
   :mod:`gpuoperator.assumptions`), so the units it takes are counted before the write
   leaves and no other decision gives them away meanwhile;
2. **write** it through the status subresource with the claim's resourceVersion as the
   precondition (through the fenced writer: a replica that stopped leading sends nothing);
3. settle the assumption by the outcome:

   * written: ``Ledger.confirm`` with the stored object;
   * 409: the server is asked whether the status it holds is this very write (the client
     retries a write whose first attempt may have landed, and the retry then meets its own
     result as a conflict). If so it counts as written; otherwise someone else changed the
     claim first: ``forget``, and the caller decides again on the fresh state;
   * 404 (the claim is gone) and other refusals (4xx, a fence before anything was sent):
     ``forget``;
   * unknown (5xx, timeout, connection cut, a fence between retries): the assumption is
     kept for :data:`ASSUME_TTL` seconds or until the watch delivers a newer version, then
     the exception propagates (the reconcile is retried with backoff);

4. **announce** a written change: one log line (with the reason) and one Event on the claim,
   when the caller says the change is worth telling; otherwise a debug line.

:meth:`ClaimStatus.record` is the write of a status that keeps the claim's phase and node
(GPU-hours): steps 2 and 4 only, never assumed (see there why that is safe).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import requests
import structlog
from prometheus_client import CollectorRegistry, Counter

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from gpuoperator.ledger import Ledger
from gpuoperator.model import claims, conditions
from gpuoperator.runtime import errors, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.indexing import key_of
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.runtime.recording import EventType

log = structlog.get_logger(__name__)

#: Seconds an assumption whose write has an unknown outcome is kept (longer than the API
#: server's own request timeout, 60 s by default, so a write still running there lands first).
ASSUME_TTL: Final = 90.0


class Outcome(enum.Enum):
    WRITTEN = "Written"
    #: someone else changed the claim first (409): decide again on the fresh state
    CHANGED = "Changed"
    #: the claim is gone (404)
    GONE = "Gone"


@dataclass(frozen=True)
class Written:
    outcome: Outcome
    #: the stored claim when written
    claim: Obj | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.WRITTEN


@dataclass(frozen=True)
class Announcement:
    """How a written change is told: ``log`` is the log event (at ``level``, with
    ``reason`` and ``fields``); ``event`` the Event type on the claim (``None``: none)."""

    log: str
    reason: str
    message: str
    event: EventType | None = "Normal"
    level: str = "info"
    fields: Mapping[str, Any] = field(default_factory=dict)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.writes = Counter(
            "gpuoperator_claim_status_writes_total",
            "Claim status writes by outcome (Written, Changed, Gone, Refused, Unknown)",
            ["outcome"],
            registry=registry,
        )


_metrics = per_registry(_Metrics)


def _key_text(claim: Obj) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def signature(status: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What identifies one status write: phase, node, bound time, the ``Bound`` condition's
    status, reason and message, the refused nodes and the transient hold (a write of this
    module sets them all; another writer's status differs in at least one)."""
    status = status or {}
    bound = conditions.find(status.get("conditions"), claims.BOUND_CONDITION) or {}
    return (
        status.get("phase"),
        status.get("nodeName"),
        status.get("boundTime"),
        bound.get("status"),
        bound.get("reason"),
        bound.get("message"),
        repr(status.get("refusedNodes")),
        repr(status.get("migration")),
    )


def unknown_outcome(exc: BaseException) -> bool:
    """Whether a failed write may still have landed (5xx, a cut connection or timeout, a
    fence between retries)."""
    if isinstance(exc, errors.NotLeaderError):
        return exc.sent
    if isinstance(exc, errors.ApiError):
        return exc.code >= 500
    return isinstance(exc, requests.RequestException | OSError)


class ApiAccess(protocols.Gets, protocols.ReplacesStatus, Protocol):
    """Writes a claim's status, and reads it back after a 409 (did our write land?)."""


class ClaimStatus:
    """Claim status writes with the ledger kept ahead of the watch (module docstring)."""

    def __init__(
        self,
        writer: ApiAccess,
        ledger: Ledger,
        recorder: protocols.RecordsEvents,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.writer = writer
        self.ledger = ledger
        self.recorder = recorder
        self._metrics = _metrics(registry)

    def assume(self, claim: Obj, status: Obj) -> Obj:
        """Step 1 alone: count ``claim`` with ``status`` now; returns the object to
        :meth:`send`. (A caller writing several claims at once assumes all first.)"""
        intended = {**claim, "status": status}
        self.ledger.assume(intended)
        return intended

    def write(self, claim: Obj, status: Obj, announce: Announcement | None = None) -> Written:
        """Assume, write and settle ``claim`` with ``status``; announce it if written."""
        return self.send(self.assume(claim, status), announce)

    def send(self, intended: Obj, announce: Announcement | None = None) -> Written:
        """Steps 2 to 4 for an object :meth:`assume` returned."""
        key = key_of(intended)
        try:
            stored = self.writer.replace_status(GPUClaim, intended)
        except errors.ConflictError:
            landed = self._landed(intended)
            if landed.outcome is not Outcome.WRITTEN:
                self.ledger.forget(key)
                self._metrics.writes.labels(landed.outcome.value).inc()
                log.debug(
                    "claim changed meanwhile; deciding again",
                    reason="Conflict",
                    claim=_key_text(intended),
                )
                return landed
            assert landed.claim is not None
            stored = landed.claim
        except errors.NotFoundError:
            self.ledger.forget(key)
            self._metrics.writes.labels(Outcome.GONE.value).inc()
            return Written(Outcome.GONE)
        except BaseException as exc:
            if unknown_outcome(exc):
                self.ledger.expire_after(key, ASSUME_TTL)
                self._metrics.writes.labels("Unknown").inc()
            else:
                self.ledger.forget(key)
                self._metrics.writes.labels("Refused").inc()
            raise
        self.ledger.confirm(stored)
        self._metrics.writes.labels(Outcome.WRITTEN.value).inc()
        self._announce(stored, announce)
        return Written(Outcome.WRITTEN, stored)

    def record(self, claim: Obj, status: Obj, announce: Announcement | None = None) -> Written:
        """Write a status that changes nothing the ledger counts — the claim's phase and
        node stay as ``claim`` has them (GPU-hours, a report) — with ``claim``'s
        resourceVersion as the precondition, through the fenced writer, and **without**
        assuming it: it hands no units out, so it needs no decision lock, and it never
        overwrites another decision's assumption. A decision in flight on the same claim
        meets a 409 and decides again (the watch's newer version supersedes its
        assumption). Base ``claim`` on the watch's copy, not on an assumed state.
        A conflict is returned as ``CHANGED`` (the caller looks again)."""
        old = claim.get("status") or {}
        if (old.get("phase"), old.get("nodeName")) != (status.get("phase"), status.get("nodeName")):
            raise ValueError("record() keeps a claim's phase and node; binding writes use write()")
        intended = {**claim, "status": status}
        try:
            stored = self.writer.replace_status(GPUClaim, intended)
        except errors.ConflictError:
            self._metrics.writes.labels(Outcome.CHANGED.value).inc()
            return Written(Outcome.CHANGED)
        except errors.NotFoundError:
            self._metrics.writes.labels(Outcome.GONE.value).inc()
            return Written(Outcome.GONE)
        except BaseException as exc:
            self._metrics.writes.labels("Unknown" if unknown_outcome(exc) else "Refused").inc()
            raise
        self._metrics.writes.labels(Outcome.WRITTEN.value).inc()
        self._announce(stored, announce)
        return Written(Outcome.WRITTEN, stored)

    def _landed(self, intended: Obj) -> Written:
        """After a 409: whether the stored status is this write's (it landed on an earlier
        attempt). A failed read leaves the outcome unknown: keep the assumption, raise."""
        key = key_of(intended)
        try:
            current = self.writer.get(GPUClaim, key[1], key[0])
        except errors.NotFoundError:
            return Written(Outcome.GONE)
        except BaseException:
            self.ledger.expire_after(key, ASSUME_TTL)
            raise
        same_object = (current.get("metadata") or {}).get("uid") == (
            intended.get("metadata") or {}
        ).get("uid")
        if same_object and signature(current.get("status")) == signature(intended.get("status")):
            log.debug("own write found landed after a conflict", claim=_key_text(intended))
            return Written(Outcome.WRITTEN, current)
        return Written(Outcome.CHANGED)

    def _announce(self, stored: Obj, announce: Announcement | None) -> None:
        if announce is None:
            log.debug("claim status written", claim=_key_text(stored))
            return
        getattr(log, announce.level)(
            announce.log, reason=announce.reason, claim=_key_text(stored), **announce.fields
        )
        if announce.event is not None:
            self.recorder.event(
                stored, announce.event, announce.reason, announce.message, kind=names.GPU_CLAIM
            )
