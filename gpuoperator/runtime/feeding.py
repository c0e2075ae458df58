"""Feeds: change notices that are not API objects, wired to controllers as informers are."""

from __future__ import annotations

import threading

import structlog

from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.informing import Handlers

log = structlog.get_logger(__name__)


class Feed:
    """A source of change notices that are not API objects (the ledger's figures, for
    instance), wired to controllers like an informer: each notice reaches every handler's
    ``on_add``, in the thread that publishes it, and handlers must be quick (map the notice
    to keys and enqueue them)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[Handlers] = []
        self._lock = threading.Lock()

    def add_handlers(self, handlers: Handlers) -> None:
        with self._lock:
            self._handlers.append(handlers)

    def publish(self, notice: Obj) -> None:
        with self._lock:
            handlers = list(self._handlers)
        for h in handlers:
            if h.on_add is None:
                continue
            try:
                h.on_add(notice)
            except Exception:
                log.exception("feed handler failed", feed=self.name, reason="HandlerError")
