"""Kubernetes resource quantities as the operator reads them: whole units of extended
resources (docs/design.md §5 "Capacity").

* :func:`is_extended` — which resources are counted at all: extended ones (``domain/name``);
  native ones (CPU, memory) never are.
* :func:`parse_count` — a quantity as whole units. Quantities of extended resources are whole
  numbers (the API server refuses fractions), so a quantity that is not a non-negative
  integer after its suffix (``"1.5"``, ``"500m"``, ``"-1"``, garbage) is invalid and counts
  as 0: it cannot occur on an admitted pod, and a guess would be worse than nothing.
* :func:`requested` — a container's requested quantities: **a limit without a request counts
  as the request**, as the API server defaults it for extended resources. The pod cache's
  slim copies (:mod:`gpuoperator.model.slimming`) and the pod accounting
  (:mod:`gpuoperator.model.pods`) both read requests through it.

Every function is pure and idempotent.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Mapping
from typing import Any, Final

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


def parse_whole(quantity: Any) -> int | None:
    """A quantity as a whole number of units; ``None`` when it is not a non-negative whole
    number.

    Accepts ints and quantity strings (``"2"``, ``"0"``, ``"0.0"``, ``"1k"``, ``"2000m"``,
    ``"1e3"``, ``"2Ki"``). Fractions (``"1.5"``, ``"500m"``), negative numbers, values beyond
    int64, booleans, floats and anything unparseable are ``None``.
    """
    if isinstance(quantity, bool):
        return None
    if isinstance(quantity, int):
        return quantity if 0 <= quantity <= _INT64_MAX else None
    if not isinstance(quantity, str):
        return None
    match = _QUANTITY.fullmatch(quantity.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        value = _CONTEXT.multiply(decimal.Decimal(number), _SUFFIX[suffix or ""])
        if value.is_zero():
            return 0  # zero whatever its exponent
        if exponent is not None and abs(int(exponent)) > _MAX_EXPONENT:
            return None
        if exponent is not None:
            value = _CONTEXT.scaleb(value, int(exponent))
    except ArithmeticError:
        return None
    if value < 0 or value > _INT64_MAX or value != value.to_integral_value():
        return None
    return int(value)


def parse_count(quantity: Any) -> int:
    """An extended-resource quantity as a whole number of units; 0 when invalid
    (:func:`parse_whole` is ``None``): an invalid quantity cannot occur on an admitted pod."""
    return parse_whole(quantity) or 0


def is_extended(resource: str) -> bool:
    """An extended resource name has a domain (``nvidia.com/GA102GL_A10``); native ones
    (cpu, memory, hugepages-*, ephemeral-storage) do not."""
    return "/" in resource


def requested(resources: Any) -> dict[str, Any]:
    """The quantities a container's ``resources`` requests, by resource name: its
    ``requests``, and each ``limits`` entry without a request (a limit counts as the request;
    the API server defaults it so for extended resources). Quantities are not parsed."""
    if not isinstance(resources, Mapping):
        return {}
    limits = resources.get("limits")
    merged = dict(limits) if isinstance(limits, Mapping) else {}
    requests = resources.get("requests")
    if isinstance(requests, Mapping):
        merged.update(requests)
    return merged
