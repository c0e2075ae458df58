"""What a handler sees and returns, and the routing of paths to handlers.

A handler is a plain function from a complete :class:`Request` to a :class:`Response`: the
server reads the whole request before calling it and writes the answer after, so no
handler ever waits on a peer. :func:`app` dispatches on the exact path.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

#: How much of a traceback a log line carries (its innermost frames, where the error is).
MAX_TRACEBACK: int = 4000
#: How much of one traceback line is kept.
MAX_TRACEBACK_LINE: int = 300


# -- requests and responses -------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A complete HTTP request, as a handler sees it."""

    method: str
    path: str
    body: bytes = b""
    #: Header names in lower case; repeated headers joined with ", ".
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The peer's address (the source that per-source limits count).
    peer: str = ""
    query: str = ""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]
App = Callable[[Request], Response]


def text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """The traceback of ``exc`` as one string of at most ``limit`` characters. Each line is
    cut to :data:`MAX_TRACEBACK_LINE` (an error's message may repeat tenant input), then
    the end (the innermost frames and the error) is kept and the start cut with an
    ellipsis."""
    lines = [
        line if len(line) <= MAX_TRACEBACK_LINE else line[: MAX_TRACEBACK_LINE - 2] + "…\n"
        for chunk in traceback.format_exception(exc)
        for line in chunk.splitlines(keepends=True)
    ]
    full = "".join(lines)
    return full if len(full) <= limit else "…" + full[-(limit - 1) :]


def app(routes: dict[str, Handler]) -> App:
    """Dispatch on the exact path; an unknown path is a 404, a handler error a logged 500
    (handlers that must never answer 5xx, the webhooks, catch their own errors)."""

    def dispatch(request: Request) -> Response:
        handler = routes.get(request.path)
        if handler is None:
            return text(404, "not found")
        try:
            return handler(request)
        except Exception as exc:
            log.error(
                "request handler failed",
                path=request.path,
                reason=type(exc).__name__,
                traceback=bounded_traceback(exc),
            )
            return text(500, "internal error")

    return dispatch
