"""Tallies of claims, as the claim metrics report them: how many claims each class has per
phase and ``Bound`` reason, and how long the oldest claim of each class has been pending.

Choices where docs/design.md is silent:

* A claim with no phase yet (the binder has not decided it) is counted as ``Pending``: it
  waits for a node like any Pending claim (:data:`claims.WAITING_PHASES`).
* The reason is the ``Bound`` condition's reason (``NoCapacity``, ``BudgetExceeded``,
  ``Bound``...); empty (:data:`NO_REASON`) while the claim has no such condition yet, which
  Prometheus reads as no ``reason`` label.
* The oldest pending claim is the oldest claim that waits for a node
  (:func:`binding.is_waiting`: phase ``Pending``, ``Lost`` or none yet, not being deleted),
  aged from its ``metadata.creationTimestamp``. A claim that lost its node therefore counts
  from its creation too: its tenant has been without the GPUs it was promised since the
  node went, and an old hold that cannot rebind is at once older than any threshold. A
  creation time that cannot be read leaves the claim out of the age (it is still counted);
  a creation time ahead of ``now`` (clock skew) ages as 0.

Pure and idempotent: the same claims and time give the same tally.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuoperator.model import binding, claims, conditions, orders

Obj = dict[str, Any]

#: The reason of a claim whose ``Bound`` condition is not set yet.
NO_REASON: Final = ""


@dataclass(frozen=True)
class ClaimTally:
    #: (class, phase, reason) -> number of claims; only combinations that occur
    counts: Mapping[tuple[str, str, str], int]
    #: class -> seconds since the creation of its oldest pending claim; only classes that
    #: have one
    oldest_pending: Mapping[str, float]


def phase(claim: Mapping[str, Any]) -> str:
    """The claim's ``status.phase``; ``Pending`` when it has none yet."""
    return claims.phase(claim) or claims.Phase.PENDING


def reason(claim: Mapping[str, Any]) -> str:
    """The reason of the claim's ``Bound`` condition; :data:`NO_REASON` without one."""
    found = conditions.find((claim.get("status") or {}).get("conditions"), claims.BOUND_CONDITION)
    return str((found or {}).get("reason") or NO_REASON)


def of_claims(claims: Iterable[Obj], now: datetime.datetime) -> ClaimTally:
    """Count ``claims`` by class, phase and reason, and age each class's oldest pending
    claim at ``now`` (an aware datetime)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    oldest: dict[str, float] = {}
    for claim in claims:
        cls = orders.ordered_class(claim)
        counts[(cls, phase(claim), reason(claim))] += 1
        if not binding.is_waiting(claim):
            continue
        created = conditions.parse_stamp((claim.get("metadata") or {}).get("creationTimestamp"))
        if created is None:
            continue
        age = max(0.0, (now - created).total_seconds())
        oldest[cls] = max(age, oldest.get(cls, 0.0))
    return ClaimTally(dict(counts), oldest)
