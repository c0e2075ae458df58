"""Bounded echo: what a message or a log line may repeat of a tenant's input.

A refusal names the value it refuses, but a tenant controls that value: a 2.9 MB name
must not come back as a 2.9 MB refusal or a 5.8 MB log line. Every name or value a
webhook's message or log line repeats goes through :func:`clip` (strings) or
:func:`shown` (any JSON value, rendered as the tenant wrote it); a whole message through
:func:`clip` with :data:`MAX_MESSAGE`. A cut value ends with an ellipsis, so a reader
knows it was cut.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Final

#: The most characters of one name or value repeated in a message.
MAX_VALUE: Final = 80
#: The most characters of one whole message (an admission refusal, a 400 body).
MAX_MESSAGE: Final = 2048
ELLIPSIS: Final = "…"


def clip(value: str, limit: int = MAX_VALUE) -> str:
    """``value`` itself when it has at most ``limit`` characters, else its first
    ``limit - 1`` characters and an ellipsis."""
    if limit < 1:
        raise ValueError(f"limit: {limit!r} is not ≥ 1")
    return value if len(value) <= limit else value[: limit - 1] + ELLIPSIS


def shown(value: Any, limit: int = MAX_VALUE) -> str:
    """A JSON value as the tenant wrote it (``"x"`` with quotes, ``5``, ``null``),
    clipped. Values JSON cannot render (NaN is rendered as NaN) fall back to ``repr``."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # the rest would be cut anyway: do not render megabytes
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return clip(text, limit)
