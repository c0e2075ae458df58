"""Orders (docs/design.md §5 "Ordering a claim", §3 "Budgets and entitlement"): the refusals of
one GPUClaim order, decided once for the order webhook, the VMI webhook's claim templates and
the binder's re-check at bind time (:func:`binding_refusal`).

An order is refused, in this order, when:

0. ``spec.count`` is not a whole number from 1 to 2**31 - 1 (:func:`count_refusal`: never read
   as 0, whatever the CRD schema refused first); the count checks below are then skipped;

1. its class does not exist (``spec.className``);
2. ``spec.count`` is above the class's effective maxCount (:func:`classes.effective_max_count`);
3. ``spec.count`` is above the class's published ``status.maxFreePerNode``: it cannot fit on
   any node now (skipped when the class's figures are not known yet);
4. a budget would be exceeded (:func:`budget_refusals`; the messages name ``spec.count``);
5. the class is ``vgpu`` and the namespace lacks the vGPU entitlement
   (:func:`entitlement_refusal`).

The maxCount and entitlement refusals read the same wherever they are made
(:func:`max_count_refusal`, :func:`entitlement_refusal`; each caller puts the field first).

Every message names the field, the value and what is allowed, in words a tenant understands.
All applicable refusals are returned (a tenant fixes them at once), not only the first.

Budgets: every ``ResourceQuota`` of the namespace that has a budget key must hold on its own;
the keys that concern a claim are its class's ``<class>.gpuclass.cozystack.io/devices`` and the
total ``gpuclass.cozystack.io/devices`` (keys of other classes and every other key are not
read). Usage is the sum of ``spec.count`` over the namespace's GPUClaims that exist, a claim
being deleted included until it is gone (:func:`usage`): held and template claims alike,
bound or not (a hold is charged whether or not its VM runs, and as long as it holds units: a
claim being deleted keeps its node until its finalizers are gone, so releasing it must not
free budget for a new order first). Usage is attributed through the class each claim names,
never through resource names (classes may share one).

Choices where docs/design.md is silent:

* ``spec.hard`` values are Kubernetes quantities; a budget counts whole units, so a value
  that is not a non-negative whole number (``"1.5"``, ``"500m"``, garbage) is read as a budget
  of 0, and the message says the value is invalid: failing closed is the safe reading of a
  hoster's typo, and the message tells the tenant why.
* A quota's ``spec.scopes``/``scopeSelector`` are ignored: scopes select pods, never claims.
* The claim being judged is excluded from "the others" by namespace/name, so re-checking an
  existing claim does not count it twice.
* At bind time (:func:`binding_refusal`, the binder's one check before planning) the vGPU
  entitlement and the budgets are re-checked: a template claim never met the order webhook,
  a namespace can lose its entitlement label after ordering, and two orders can pass the
  webhook at once. Capacity is the binder's own decision against nodes, and the rest cannot
  change for an existing claim (its spec is immutable, its class is protected by a
  finalizer). To settle two orders that passed the webhook at once, the budget re-check
  (:func:`order_refusals_for_binding`) counts only the claims that are bound or were created
  before this one: the older order keeps its budget and the younger waits, instead of each
  waiting on the other forever.

Every function is pure and idempotent: the same objects give the same refusals.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import (
    capacity,
    claims,
    conditions,
    echo,
    objects,
    quantities,
    quota,
    tenants,
)
from gpuoperator.model import classes as gpuclasses

Obj = dict[str, Any]

#: The largest ``spec.count`` (the CRD declares it ``int32``).
MAX_COUNT: Final = 2**31 - 1
_COUNT_ALLOWED: Final = f"allowed: a whole number from 1 to {MAX_COUNT}"
#: At most this many class names are listed after "known:" (admission messages stay short).
MAX_KNOWN_LISTED: Final = 20

# -- reading claims --------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def ordered_class(claim: Mapping[str, Any]) -> str:
    """The class a claim orders (``spec.className``), ``""`` when absent."""
    return str(_spec(claim).get("className") or "")


def ordered_count(claim: Mapping[str, Any]) -> int:
    """The units a claim orders (``spec.count``); 0 when absent or not a whole number."""
    return quantities.parse_count(_spec(claim).get("count"))


def count_refusal(claim: Mapping[str, Any]) -> str | None:
    """Why ``spec.count`` is not a count an order may carry, ``None`` when it is one: a
    JSON integer from 1 to :data:`MAX_COUNT` (the CRD's ``int32``, ``minimum: 1``).
    Anything else is refused, not read as 0: a float (``5.0``, ``1e30``), a boolean, a
    string, ``null``, a missing count, 0, a negative number or one beyond int32."""
    spec = _spec(claim)
    if "count" not in spec:
        return f"spec.count is required ({_COUNT_ALLOWED})"
    value = spec["count"]
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT:
        return None
    return f"spec.count: {echo.shown(value)} is not a valid count ({_COUNT_ALLOWED})"


def is_template_claim(claim: Mapping[str, Any]) -> bool:
    """Whether the operator made the claim from a VM's claim template (label
    ``gpu.cozystack.io/template-claim: "true"``): such claims skip the order checks."""
    labels = _meta(claim).get("labels")
    return isinstance(labels, Mapping) and labels.get(names.TEMPLATE_CLAIM_LABEL) == names.TRUE


def usage(claims: Iterable[Mapping[str, Any]], class_name: str | None = None) -> int:
    """The sum of ``spec.count`` over ``claims`` (of class ``class_name`` if given): every
    claim that exists is charged, held and template claims alike, bound or not, and a claim
    being deleted (``metadata.deletionTimestamp``) until it is gone."""
    return sum(
        ordered_count(c) for c in claims if class_name is None or ordered_class(c) == class_name
    )


def _same(claim_key: tuple[str, str], other: Mapping[str, Any]) -> bool:
    """Whether ``other`` is the claim itself. A claim being created may carry no namespace
    (the request names it) or no name yet (``generateName``): no name matches nothing."""
    namespace, name = claim_key
    other_namespace, other_name = claims.key(other)
    return bool(name) and name == other_name and (not namespace or namespace == other_namespace)


_NEVER: Final = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def creation_order(claim: Mapping[str, Any]) -> tuple[datetime.datetime, str, str]:
    """The claim's place in the order of ordering: ``metadata.creationTimestamp``, then
    namespace and name (timestamps have one-second resolution, so ties are common). A claim
    without a readable creation time sorts last."""
    namespace, name = claims.key(claim)
    return (
        conditions.parse_stamp(_meta(claim).get("creationTimestamp")) or _NEVER,
        namespace,
        name,
    )


def _precedes(other: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Whether ``other`` was ordered before ``claim`` (:func:`creation_order`)."""
    return creation_order(other) < creation_order(claim)


# -- budgets ---------------------------------------------------------------------------------


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _held(n: int, leaving: int = 0) -> str:
    held = f"{n} {'is' if n == 1 else 'are'} held"
    if leaving:
        held += f" ({leaving} by claims being deleted, charged until they are gone)"
    return held


def _ordered(n: int) -> str:
    return f"{n} {'was' if n == 1 else 'were'} ordered"


def budget_refusals(
    claim: Mapping[str, Any],
    quotas: Iterable[Mapping[str, Any]],
    namespace_claims: Iterable[Mapping[str, Any]],
) -> list[str]:
    """The budgets ``claim`` would exceed, one message per quota and key.

    ``quotas`` are the ResourceQuotas of the claim's namespace and ``namespace_claims`` its
    GPUClaims (the claim itself may be among them: it is not counted twice). For each quota
    (sorted by name) the claim's class key, then the total key, is checked when present:
    refused when the other claims' usage (:func:`usage`) plus ``spec.count`` exceeds the limit.
    Usage follows each claim's ``spec.className``, so no class object is needed.
    """
    own_key = claims.key(claim)
    own_class = ordered_class(claim)
    ordered = ordered_count(claim)
    others = [c for c in namespace_claims if not _same(own_key, c)]
    leaving = [c for c in others if claims.is_deleting(c)]
    refusals: list[str] = []
    for rq in sorted(quotas, key=objects.key):
        hard = _spec(rq).get("hard")
        if not isinstance(hard, Mapping):
            continue
        rq_namespace, rq_name = objects.key(rq)
        where = f"{rq_namespace or own_key[0]}/{rq_name}"
        for key in (quota.class_key(own_class), quota.TOTAL_KEY):
            parsed = quota.parse_key(key)
            if key not in hard or parsed is None:
                continue
            used = usage(others, parsed[1])
            held = _held(used, usage(leaving, parsed[1]))
            raw = hard[key]
            limit = quantities.parse_whole(raw)
            if limit is None:
                refusals.append(
                    f"spec.count: budget exceeded: ResourceQuota {where} has an invalid value "
                    f"{echo.clip(repr(raw))} for "
                    f"{key} (a whole number of GPUs is allowed), so it allows 0; "
                    f"{held}, {_ordered(ordered)}"
                )
            elif used + ordered > limit:
                refusals.append(
                    f"spec.count: budget exceeded: ResourceQuota {where} allows {limit} of {key}, "
                    f"{held}, {_ordered(ordered)}"
                )
    return refusals


# -- the refusals every caller shares ----------------------------------------------------------


def max_count_refusal(cls: Obj, count: int) -> str | None:
    """Why ``count`` units are more than one claim of ``cls`` may order (its effective
    maxCount, :func:`classes.effective_max_count`); ``None`` when they are not. The caller
    names the field first (``spec.count``, a claim template's ``count``)."""
    max_count = gpuclasses.effective_max_count(cls)
    if max_count is None or count <= max_count:
        return None
    return (
        f"class {echo.clip(gpuclasses.name(cls))} allows at most "
        f"{_plural(max_count, 'GPU', 'GPUs')} per claim, {_ordered(count)}"
    )


def entitlement_refusal(
    cls: Obj, namespace: Mapping[str, Any] | None, namespace_name: str
) -> str | None:
    """Why the namespace ``namespace_name`` (its object ``namespace``; ``None``: unknown, not
    entitled) may not use ``cls``: a ``vgpu`` class needs the namespace's vGPU entitlement
    label; ``None`` when it may. The caller names the field first."""
    if not gpuclasses.is_vgpu(cls) or tenants.vgpu_entitled(namespace):
        return None
    return (
        f"class {echo.clip(gpuclasses.name(cls))} is a vGPU class; namespace {namespace_name} "
        f"is not entitled to vGPU (label {names.VGPU_ENTITLED_LABEL}={names.TRUE})"
    )


# -- the order -------------------------------------------------------------------------------


def _known_text(known_classes: Iterable[str] | None) -> str:
    if known_classes is None:
        return ""
    known = sorted(set(known_classes))
    if not known:
        return " (no class exists yet)"
    listed = ", ".join(known[:MAX_KNOWN_LISTED])
    more = len(known) - MAX_KNOWN_LISTED
    return f" (known: {listed}{f' and {more} more' if more > 0 else ''})"


def order_refusals(
    claim: Mapping[str, Any],
    cls: Obj | None,
    namespace: Mapping[str, Any] | None,
    quotas: Iterable[Mapping[str, Any]],
    namespace_claims: Iterable[Mapping[str, Any]],
    figures: capacity.ClassFigures | None,
    known_classes: Iterable[str] | None = None,
) -> list[str]:
    """Why the order ``claim`` is refused (docs/design.md §5), in the module docstring's order;
    ``[]`` when it is acceptable.

    ``cls`` is the claim's GPUClass (``None``: it does not exist), ``namespace`` the claim's
    Namespace (``None``: unknown, which is not entitled), ``figures`` the class's published
    status (``None``: not known yet, so the maxFreePerNode check is skipped), and
    ``known_classes`` the class names to list when the class does not exist. Template claims
    are not judged here: the caller skips them (they wait for capacity instead).
    """
    wanted = echo.clip(ordered_class(claim))
    ordered = ordered_count(claim)
    refusals: list[str] = []
    bad_count = count_refusal(claim)
    if bad_count is not None:
        refusals.append(bad_count)
    if cls is None:
        refusals.append(
            f"spec.className: class {wanted} does not exist{_known_text(known_classes)}; "
            "the classes are listed by kubectl get gpuclasses"
        )
    elif bad_count is None:
        too_many = max_count_refusal(cls, ordered)
        if too_many is not None:
            refusals.append(f"spec.count: {too_many}")
        if figures is not None and ordered > figures.max_room:
            most = figures.max_free_per_node
            room = (
                "has no free GPU on any node"
                if most <= 0
                else f"has at most {_plural(most, 'free GPU', 'free GPUs')} on one node"
            )
            if figures.max_reclaimable_per_node:
                taking = figures.max_reclaimable_per_node
                room += (
                    f" ({_plural(taking, 'GPU', 'GPUs')} counting the idle preemptible holds"
                    " it may take back)"
                )
            refusals.append(f"spec.count: class {wanted} {room}, {_ordered(ordered)}")
    if bad_count is None:
        refusals.extend(budget_refusals(claim, quotas, namespace_claims))
    namespace_name = str(_meta(namespace or {}).get("name") or claims.key(claim)[0])
    not_entitled = None if cls is None else entitlement_refusal(cls, namespace, namespace_name)
    if not_entitled is not None:
        refusals.append(f"spec.className: {not_entitled}")
    return refusals


def order_refusals_for_binding(
    claim: Mapping[str, Any],
    quotas: Iterable[Mapping[str, Any]],
    namespace_claims: Sequence[Mapping[str, Any]],
) -> list[str]:
    """The binder's re-check at bind time: budgets only (two orders can pass the webhook at
    once). Capacity is the binder's own check against nodes and maxFreePerNode is a figure of
    the moment of ordering, so neither is re-checked.

    Counts only the other claims that are bound or were ordered before ``claim`` (see the
    module docstring): of two racing orders the older binds and the younger waits.
    Template claims are re-checked too: they are charged like any claim.
    """
    earlier = [c for c in namespace_claims if claims.is_bound(c) or _precedes(c, claim)]
    return budget_refusals(claim, quotas, earlier)


class RefusalReason(enum.StrEnum):
    """Why the binder leaves a claim waiting before planning; the values are the ``Bound``
    condition's reasons."""

    NOT_ENTITLED = "NotEntitled"
    BUDGET_EXCEEDED = "BudgetExceeded"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A claim refused at bind time: the condition reason and a message a tenant reads."""

    reason: RefusalReason
    message: str


def binding_refusal(
    claim: Mapping[str, Any],
    cls: Obj,
    namespace: Mapping[str, Any] | None,
    quotas: Iterable[Mapping[str, Any]],
    namespace_claims: Sequence[Mapping[str, Any]],
) -> Refusal | None:
    """Why the binder must not bind ``claim`` of class ``cls`` now (see the module
    docstring), ``None`` when it may: the namespace (``namespace``; ``None``: unknown) lacks
    the vGPU entitlement (:func:`entitlement_refusal`, the order webhook's message), else a
    budget would be exceeded (:func:`order_refusals_for_binding`, all of them in one
    message). A caller without quotas may pass no claims: nothing is added up then."""
    namespace_name = claims.key(claim)[0]
    not_entitled = entitlement_refusal(cls, namespace, namespace_name)
    if not_entitled is not None:
        return Refusal(RefusalReason.NOT_ENTITLED, not_entitled)
    over = order_refusals_for_binding(claim, quotas, namespace_claims)
    if over:
        return Refusal(RefusalReason.BUDGET_EXCEEDED, "; ".join(over))
    return None
