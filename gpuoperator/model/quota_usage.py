"""Budget usage shown in ResourceQuota status (docs/design.md §3): what ``status.used`` of a
quota's GPU budget keys should say, so ``kubectl describe quota`` prints it beside ``Hard``.

For every budget key in ``spec.hard`` (:func:`quota.parse_key`: the per-class
``<class>.gpuclass.cozystack.io/devices`` and the total ``gpuclass.cozystack.io/devices``) the
used value is the budget usage the order webhook and the binder judge by
(:func:`orders.usage`: ``spec.count`` summed over the namespace's claims that exist, a claim
being deleted included until it is gone, held and template claims alike, bound or not).
Nothing else is read or written: every other key of ``status.used`` is Kubernetes' own (the
quota controller and quota admission keep them), and a budget key no longer in ``spec.hard``
is removed by the quota controller itself (it masks ``used`` to the hard keys).

Values are written as whole-number quantity strings (``"3"``); a stored value that already
means the same number (``"3"``, ``3``) is not rewritten.

Every function is pure and idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuoperator.model import orders, quantities, quota

Obj = dict[str, Any]


def budget_keys(rq: Mapping[str, Any]) -> list[str]:
    """The budget keys of a ResourceQuota's ``spec.hard``, sorted."""
    hard = (rq.get("spec") or {}).get("hard")
    if not isinstance(hard, Mapping):
        return []
    return sorted(str(k) for k in hard if quota.parse_key(str(k)) is not None)


def desired_used(
    rq: Mapping[str, Any], namespace_claims: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """``{budget key: used}`` for every budget key of ``rq``'s ``spec.hard``, given the
    GPUClaims of the quota's namespace."""
    claims = list(namespace_claims)
    used: dict[str, str] = {}
    for key in budget_keys(rq):
        parsed = quota.parse_key(key)
        assert parsed is not None
        used[key] = str(orders.usage(claims, parsed[1]))
    return used


def _same(stored: Any, wanted: str) -> bool:
    if stored is None:
        return False
    if str(stored).strip() == wanted:
        return True
    return quantities.parse_whole(stored) == int(wanted)


def used_patch(
    rq: Mapping[str, Any], namespace_claims: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """The budget keys whose ``status.used`` differs from :func:`desired_used`, with the
    value to write (empty: the status already says it). The caller merge-patches exactly
    these keys into ``status.used``."""
    current = (rq.get("status") or {}).get("used")
    current = current if isinstance(current, Mapping) else {}
    return {
        key: value
        for key, value in desired_used(rq, namespace_claims).items()
        if not _same(current.get(key), value)
    }
