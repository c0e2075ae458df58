"""What a component needs of the API client and of the Event recorder, one verb each.

A controller names the verbs it uses (a ``Protocol`` of its own that inherits those it
needs), not the whole ``client.Client``: its signature says what it may do to the cluster,
and a test hands it any object with those methods, checked by the type checker, with no cast.
``client.Client`` and ``recording.Recorder`` satisfy every protocol here; the signatures are
theirs, trimmed to the parameters components pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gpuoperator.runtime.client import Kind, Obj

if TYPE_CHECKING:  # the recorder itself asks for protocols of this module
    from gpuoperator.runtime.recording import EventType


class Gets(Protocol):
    """Live reads of one object (a cache may lag: these ask the API server)."""

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        """The object; raises ``errors.NotFoundError`` when there is none."""
        ...

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, ``None`` when there is none."""
        ...


class Lists(Protocol):
    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> tuple[list[Obj], str]:
        """Every object (live, page by page), each through ``transform``, and the list's
        resourceVersion."""
        ...


class Creates(Protocol):
    def create(self, kind: Kind, obj: Obj) -> Obj:
        """Create ``obj``; raises ``errors.AlreadyExistsError`` when its name is taken."""
        ...


class Replaces(Protocol):
    def replace(self, kind: Kind, obj: Obj) -> Obj:
        """Replace ``obj`` under its resourceVersion."""
        ...


class ReplacesStatus(Protocol):
    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        """Replace the status of ``obj`` under its resourceVersion."""
        ...


class Patches(Protocol):
    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """Merge-patch the object (or its ``subresource``); a ``metadata.resourceVersion``
        in ``patch`` makes it conditional."""
        ...


class Deletes(Protocol):
    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Delete the object, only if it still has ``uid`` and ``resource_version`` when
        they are given."""
        ...


class RecordsEvents(Protocol):
    def event(
        self,
        obj: Obj,
        type_: EventType,
        reason: str,
        message: str,
        *,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        """Record an Event about ``obj`` (cached objects carry no ``kind``: name it)."""
        ...
