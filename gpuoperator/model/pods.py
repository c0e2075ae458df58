"""A pod's use of extended resources (DESIGN.md §5 "Capacity"), counted as kube-scheduler
counts it, so the operator's free units agree with what the scheduler will admit.

For each resource: iterate the init containers in order; a restartable init container
(``restartPolicy: Always``, a sidecar) keeps running, so it adds to a running sidecar total
and to the pod's steady state; a regular init container runs alone next to the sidecars
started before it, so its peak is its request plus that running total. The pod's usage is
``max(Σ regular containers + Σ sidecars, max over init containers of their peak) + overhead``
(kube-scheduler's ``PodRequests``, with the sidecar's own peak being the running total).

Quantities of extended resources are whole numbers (the API server refuses fractions), so
a quantity that is not a non-negative integer after its suffix (``"1.5"``, ``"500m"``,
``"-1"``, garbage) is invalid and counts as 0: it cannot occur on an admitted pod, and a
guess would be worse than nothing. Native resources (CPU, memory) are not counted at all.

A pod that has terminated (``Succeeded``/``Failed``) uses nothing. A pod being deleted still
uses its units until it is gone, as it does for the scheduler. Which of a pod's units a claim
already holds is decided by ownership, never by a label a tenant can set (DESIGN.md §5, §10):
:func:`launcher_vmi` names the VMI controlling a virt-launcher pod, and the ledger
(:mod:`gpuoperator.model.capacity`) subtracts only the units that VMI's Bound claims hold on
the pod's node. A migration target is an ordinary pod for accounting: its claims are bound
to the source node, and its units on the target are real.

Pods are the slim dicts of :func:`gpuoperator.model.slimming.slim_pod` (whole pods work
too). Every function is pure and idempotent.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Iterable
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims, slimming

Obj = dict[str, Any]

SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
RESTART_ALWAYS: Final = "Always"

_INT64_MAX: Final = 2**63 - 1
# resource.Quantity's grammar: a signed decimal, then an exponent or a suffix.
_QUANTITY: Final = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]))?"
)
_SUFFIX: Final[dict[str, decimal.Decimal]] = {
    "": decimal.Decimal(1),
    "m": decimal.Decimal("0.001"),
    **{s: decimal.Decimal(10) ** (3 * i) for i, s in enumerate("kMGTPE", start=1)},
    **{s + "i": decimal.Decimal(2) ** (10 * i) for i, s in enumerate("KMGTPE", start=1)},
}
# Enough digits for any int64 times any suffix; exponents beyond int64 are refused first.
_CONTEXT: Final = decimal.Context(prec=60)
_MAX_EXPONENT: Final = 19


def parse_count(quantity: Any) -> int:
    """An extended-resource quantity as a whole number of units; 0 when invalid.

    Accepts ints and quantity strings (``"2"``, ``"0"``, ``"1k"``, ``"2000m"``, ``"1e3"``,
    ``"2Ki"``). Fractions, negative numbers, values beyond int64, booleans and anything
    unparseable are invalid for an extended resource and count as 0.
    """
    if isinstance(quantity, bool):
        return 0
    if isinstance(quantity, int):
        return quantity if 0 <= quantity <= _INT64_MAX else 0
    if not isinstance(quantity, str):
        return 0
    match = _QUANTITY.fullmatch(quantity.strip())
    if match is None:
        return 0
    number, exponent, suffix = match.groups()
    if exponent is not None and abs(int(exponent)) > _MAX_EXPONENT:
        return 0
    try:
        value = _CONTEXT.multiply(decimal.Decimal(number), _SUFFIX[suffix or ""])
        if exponent is not None:
            value = _CONTEXT.scaleb(value, int(exponent))
    except ArithmeticError:
        return 0
    if value < 0 or value > _INT64_MAX or value != value.to_integral_value():
        return 0
    return int(value)


def _requests(container: Obj) -> dict[str, int]:
    """A container's requests of extended resources; a limit without a request counts as the
    request (the API server defaults it so for extended resources, as slim_pod does)."""
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    out: dict[str, int] = {}
    for resource, quantity in merged.items():
        if slimming.is_extended(resource):
            units = parse_count(quantity)
            if units:
                out[resource] = units
    return out


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for resource, units in more.items():
        into[resource] = into.get(resource, 0) + units


def _max(into: dict[str, int], other: dict[str, int]) -> None:
    for resource, units in other.items():
        into[resource] = max(into.get(resource, 0), units)


def requests(pod: Obj) -> dict[str, int]:
    """The pod's effective request of each extended resource by kube-scheduler's rule (see
    the module docstring), whatever its phase or labels. Resources at 0 are left out."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in _containers(spec.get("containers")):
        _add(total, _requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in _containers(spec.get("initContainers")):
        own = _requests(container)
        if container.get("restartPolicy") == RESTART_ALWAYS:
            _add(total, own)
            _add(sidecars, own)
            peak = dict(sidecars)
        else:
            peak = dict(own)
            _add(peak, sidecars)
        _max(init_peak, peak)
    _max(total, init_peak)
    overhead = _requests({"resources": {"requests": spec.get("overhead") or {}}})
    _add(total, overhead)
    return {resource: units for resource, units in total.items() if units}


def _containers(items: Any) -> Iterable[Obj]:
    if not isinstance(items, list):
        return ()
    return (c for c in items if isinstance(c, dict))


def is_terminated(pod: Obj) -> bool:
    """Whether the pod has finished (phase ``Succeeded`` or ``Failed``): it uses nothing."""
    return (pod.get("status") or {}).get("phase") in (SUCCEEDED, FAILED)


def launcher_vmi(pod: Obj) -> claims.Key | None:
    """``(namespace, VMI UID)`` of the VMI that controls this virt-launcher pod, the one
    whose claims may account for its units; ``None`` for every other pod.

    A pod qualifies only when it carries KubeVirt's ``kubevirt.io=virt-launcher`` label, is
    not a migration target (``kubevirt.io/migrationJobUID``) and has a controller
    ownerReference to a ``kubevirt.io`` VirtualMachineInstance with a UID. The claims label
    plays no part: anyone who can create a pod can set it.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(names.KUBEVIRT_LABEL) != names.VIRT_LAUNCHER or names.MIGRATION_LABEL in labels:
        return None
    owner = claims.controlling_vmi(pod)
    if owner is None or not owner.uid:
        return None
    return (str(meta.get("namespace") or ""), owner.uid)


def pod_usage(pod: Obj) -> dict[str, int]:
    """The units of each extended resource the pod takes on its node: nothing once it has
    terminated, else :func:`requests` (whatever its labels; what claims cover is the
    ledger's to subtract)."""
    if is_terminated(pod):
        return {}
    return requests(pod)


def node_name(pod: Obj) -> str:
    """The node the pod is bound to (``spec.nodeName``), ``""`` while unscheduled."""
    return str((pod.get("spec") or {}).get("nodeName") or "")
