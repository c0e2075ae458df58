"""Events: one object per repeated decision within the window, its count bumped; sent in the
background, and a send that fails never reaches the caller."""

from __future__ import annotations

import threading
from typing import Any

from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Kind, Obj
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.recording import Recorder

CLAIM: Obj = {"metadata": {"name": "hold", "namespace": "t", "uid": "u1", "resourceVersion": "4"}}


class Api:
    """What the recorder calls of a client, recorded; ``fail`` is raised by the next call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def _call(self, what: str, body: Any) -> None:
        with self.lock:
            self.calls.append((what, body))
            fail, self.fail = self.fail, None
        if fail is not None:
            raise fail

    def create(self, kind: Kind, obj: Obj) -> Obj:
        self._call("create", obj)
        return obj

    def patch(self, kind: Kind, name: str, patch: Obj, *_: Any, **__: Any) -> Obj:
        self._call("patch", (name, patch))
        return patch


def recorder(api: Api, clock: FakeClock) -> Recorder:
    return Recorder(api, api_version="example.io/v1", dedupe_window=60.0, clock=clock)


def test_a_repeated_event_within_the_window_bumps_the_count_of_the_first() -> None:
    api, clock = Api(), FakeClock()
    rec = recorder(api, clock)
    rec.event(CLAIM, "Warning", "NoCapacity", "no node fits", kind="GPUClaim")
    clock.advance(30)
    rec.event(CLAIM, "Warning", "NoCapacity", "no node fits", kind="GPUClaim")
    assert rec.flush()
    (what, body), (again, (name, patch)) = api.calls
    assert (what, again) == ("create", "patch")
    assert body["metadata"] == {"name": name, "namespace": "t"}
    assert body["involvedObject"] == {
        "apiVersion": "example.io/v1",
        "kind": "GPUClaim",
        "name": "hold",
        "uid": "u1",
        "namespace": "t",
        "resourceVersion": "4",
    }
    assert patch["count"] == 2


def test_past_the_window_or_with_another_message_an_event_is_new() -> None:
    api, clock = Api(), FakeClock()
    rec = recorder(api, clock)
    rec.event(CLAIM, "Normal", "Bound", "bound to n1", kind="GPUClaim")
    rec.event(CLAIM, "Normal", "Bound", "bound to n2", kind="GPUClaim")
    clock.advance(61)
    rec.event(CLAIM, "Normal", "Bound", "bound to n1", kind="GPUClaim")
    assert rec.flush()
    assert [what for what, _ in api.calls] == ["create", "create", "create"]


def test_a_failed_send_is_not_raised_and_an_event_object_gone_is_created_again() -> None:
    api, clock = Api(), FakeClock()
    rec = recorder(api, clock)
    rec.event(CLAIM, "Normal", "Bound", "bound", kind="GPUClaim")
    assert rec.flush()
    api.fail = errors.NotFoundError(404, "NotFound", "events not found")
    rec.event(CLAIM, "Normal", "Bound", "bound", kind="GPUClaim")  # its patch meets a 404
    assert rec.flush()
    rec.event(CLAIM, "Normal", "Bound", "bound", kind="GPUClaim")
    assert rec.flush()
    assert [what for what, _ in api.calls] == ["create", "patch", "create"]
