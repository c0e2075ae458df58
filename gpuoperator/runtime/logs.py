"""Structured logs: JSON lines by default (for log pipelines), console for humans.

Every reconcile binds ``controller``, ``key`` and ``reconcile_id`` into the context (see
``controlling``), so each line a reconcile writes carries them; decisions add ``reason``.
Errors are logged with their reason and message, never as a bare traceback. In JSON an
exception is a structured list of frames (file, line, function) without the frames' local
variables: those would put request bodies, tokens and whole objects into the log.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

Format = Literal["json", "console"]


def configure(fmt: Format = "json", level: str = "info") -> None:
    """Configure structlog and route the standard library's logging through it."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"--log-level: {level!r} is not one of debug, info, warning, error")
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if fmt == "json":
        shared.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer()
    structlog.configure(
        # A line below the level is dropped before any processor runs (stdlib would drop it
        # only after the whole chain: a routine reconcile's debug line cost as much as an
        # info line).
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processor=renderer)
    )
    # No line carries the caller's file and line: the standard library's walk up the stack
    # to find them, for every record, is skipped.
    logging._srcfile = None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # Chatty libraries: their per-request lines add nothing at info level.
    for name in ("urllib3",):
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
