"""The assume cache: claim states counted ahead of the watch, as kube-scheduler's cache
assumes a pod before its binding lands.

A controller that writes a claim's status first *assumes* the new state: the ledger
(:mod:`gpuoperator.ledger`) counts it at once, so no other decision hands out the same
units while the write is in flight, and readers of the claim see it instead of the cache's
older copy (the next pass does not plan a claim bound a moment ago). The write-back
(:mod:`gpuoperator.claim_status`) settles every assumption by its write's outcome.

The states of one claim's assumption (:class:`State`), and what leaves each:

===========  ===================================  ============================================
state        entered by                           left for
===========  ===================================  ============================================
(none)       --                                   *in flight*: :meth:`Assumptions.assume`
in flight    the state is about to be written     *confirmed*: the write landed
             (its resourceVersion the             (:meth:`~Assumptions.confirm`); *none*: it
             precondition)                        was refused (409 by someone else, 404, 4xx:
                                                  forgotten), or the watch delivered a version
                                                  above the precondition (superseded)
unknown      the write's outcome is unknown       *none*: superseded as above, or its deadline
             (timeout, 5xx, connection cut:       passed (:meth:`~Assumptions.expired`:
             :meth:`~Assumptions.expire_at`)      forgotten)
confirmed    the write landed                     *none*: the watch delivered the written
                                                  version or a newer one (superseded)
===========  ===================================  ============================================

**Releasing.** An assumption only ever *adds* holds until its write is confirmed. While it
is in flight or unknown (*unconfirmed*), the stored version's hold stays counted when the
assumed state releases or moves it (a node refusal unbinding a claim, a move):
:meth:`Assumptions.releases` says so, and the ledger keeps that hold
(``capacity.Ledger.keep_released``). The stored claim still holds those units, and if the
write never lands it keeps them, so they must not be handed out meanwhile. And no decision
is taken on an unconfirmed state (:meth:`Assumptions.unconfirmed`): a write based on it would
carry the precondition of the stored version, not of the assumed one, so a bind planned on
an unconfirmed release could land straight on the old binding and move the claim without a
stored version that released its first node.

**Superseded** only by a *newer* version from the watch: one whose resourceVersion is above
the version the assumption rests on (in flight, unknown) or at least the version written
(confirmed). Older versions — a relist served from a lagging cache, the event of a write
before ours — never roll a recorded bind back. resourceVersions are compared as integers
(etcd revisions); one that is not a number always counts as newer (the watch is then
trusted).

An :class:`Assumptions` is not thread-safe: its owner (the ledger) serialises every call
under its lock, together with the ledger updates each state change implies.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuoperator.model import claims, migrations
from gpuoperator.runtime.indexing import Key, key_of
from gpuoperator.runtime.versions import resource_version

Obj = dict[str, Any]


class State(enum.Enum):
    """Where one claim's assumption stands (see the module docstring)."""

    IN_FLIGHT = "InFlight"
    UNKNOWN = "Unknown"
    CONFIRMED = "Confirmed"


@dataclass
class _Assumed:
    """A claim state counted ahead of the watch. ``version`` is the resourceVersion it
    rests on: the precondition while unconfirmed, the stored version once confirmed.
    ``deadline`` (monotonic) is set when the write's outcome is unknown."""

    claim: Obj
    version: int | None
    confirmed: bool
    deadline: float | None = None

    @property
    def state(self) -> State:
        if self.confirmed:
            return State.CONFIRMED
        return State.IN_FLIGHT if self.deadline is None else State.UNKNOWN


class Assumptions:
    """The claims counted ahead of the watch, by claim key (see the module docstring)."""

    def __init__(self) -> None:
        self._by_key: dict[Key, _Assumed] = {}

    def assume(self, claim: Obj) -> None:
        """``claim`` is about to be written (its ``metadata.resourceVersion`` the write's
        precondition): *in flight*."""
        self._by_key[key_of(claim)] = _Assumed(claim, resource_version(claim), False)

    def confirm(self, written: Obj) -> None:
        """The write landed as ``written`` (the server's reply): *confirmed* until the watch
        delivers this version or a newer one. The caller has checked that the watch has not
        delivered it yet (else it :meth:`forget`\\ s the assumption instead)."""
        self._by_key[key_of(written)] = _Assumed(written, resource_version(written), True)

    def expire_at(self, key: Key, deadline: float) -> None:
        """The write's outcome is unknown: an *in-flight* assumption becomes *unknown*, and
        is forgotten at ``deadline`` (monotonic) unless the watch supersedes it first."""
        assumed = self._by_key.get(key)
        if assumed is not None:
            assumed.deadline = deadline

    def forget(self, key: Key) -> bool:
        """Drop the claim's assumption (refused, superseded, expired, deleted); whether
        there was one."""
        return self._by_key.pop(key, None) is not None

    def expired(self, now: float) -> list[Key]:
        """The keys of the *unknown* assumptions whose deadline is ``now`` or earlier (the
        caller forgets each)."""
        return [
            key for key, a in self._by_key.items() if a.deadline is not None and a.deadline <= now
        ]

    def next_deadline(self, select: Callable[[Key], bool]) -> float | None:
        """The earliest deadline of the *unknown* assumptions whose key ``select`` accepts
        (``None`` when none has one)."""
        deadlines = [
            a.deadline for k, a in self._by_key.items() if a.deadline is not None and select(k)
        ]
        return min(deadlines) if deadlines else None

    # ---- reads ------------------------------------------------------------------------
    def state(self, key: Key) -> State | None:
        """Where the claim's assumption stands (``None``: it has none)."""
        assumed = self._by_key.get(key)
        return assumed.state if assumed is not None else None

    def claim(self, key: Key) -> Obj | None:
        """The assumed state of the claim (``None``: it has none)."""
        assumed = self._by_key.get(key)
        return assumed.claim if assumed is not None else None

    def counted(self, key: Key, observed: Obj) -> Obj:
        """The state of the claim to count: its assumed state, else ``observed`` (the
        watch's)."""
        assumed = self._by_key.get(key)
        return assumed.claim if assumed is not None else observed

    def keys(self) -> set[Key]:
        return set(self._by_key)

    def unconfirmed(self, key: Key) -> bool:
        """Whether the claim's assumption is *in flight* or *unknown*: decide nothing on it."""
        assumed = self._by_key.get(key)
        return assumed is not None and not assumed.confirmed

    def superseded_by(self, key: Key, version: int | None) -> bool:
        """Whether the watch's version ``version`` of the claim is newer than its assumption
        (always, when it has none)."""
        assumed = self._by_key.get(key)
        if assumed is None or version is None or assumed.version is None:
            return True
        return version >= assumed.version if assumed.confirmed else version > assumed.version

    def releases(self, key: Key, observed: Obj | None) -> bool:
        """Whether the holds of ``observed`` (the stored version) must stay counted beside
        the assumed state: the assumption is unconfirmed, ``observed`` is bound, and the
        assumed state does not hold on that same node (it releases or moves the hold) or
        drops or changes its transient hold (``model.migrations``: a migration that ended or
        moved the claim)."""
        assumed = self._by_key.get(key)
        if assumed is None or assumed.confirmed or observed is None:
            return False
        if not claims.is_bound(observed):
            return False
        if not claims.is_bound_to(assumed.claim, claims.node_name(observed)):
            return True
        transient = migrations.transient_hold(observed)
        return transient is not None and migrations.transient_hold(assumed.claim) != transient
