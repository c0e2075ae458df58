"""JSON patches (RFC 6902) as the webhooks write them. Pure."""

from __future__ import annotations


def json_pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` inside a part are escaped."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)
