"""Status conditions (metav1.Condition): set one, keeping its lastTransitionTime while its
status does not change, so a reconcile that decides the same thing writes nothing new."""

from __future__ import annotations

import datetime
from typing import Any

Obj = dict[str, Any]


def stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(value: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp (``2024-05-01T10:00:00Z``, the inverse of :func:`stamp`) as an
    aware datetime (naive ones read as UTC); ``None`` when it cannot be read."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def find(conditions: list[Obj] | None, type_: str) -> Obj | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[Obj] | None, type_: str) -> bool:
    found = find(conditions, type_)
    return found is not None and found.get("status") == "True"


def set_condition(
    conditions: list[Obj] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime.datetime,
    observed_generation: int | None = None,
) -> list[Obj]:
    """A new list with ``type_`` set; other conditions kept as they are, order stable."""
    value = "True" if status else "False"
    old = find(conditions, type_)
    since = old["lastTransitionTime"] if old and old.get("status") == value else stamp(now)
    new: Obj = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    out = [c for c in conditions or [] if c.get("type") != type_]
    out.append(new)
    return sorted(out, key=lambda c: str(c.get("type")))
