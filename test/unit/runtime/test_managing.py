"""The manager's leadership steps without an API server: hooks run before any controller
starts, and stopping waits for in-flight reconciles and says whether they all ended."""

from __future__ import annotations

import threading
from typing import Any

import pykube
import pytest
from prometheus_client import CollectorRegistry

from gpuoperator.runtime.client import Client
from gpuoperator.runtime.controlling import Result
from gpuoperator.runtime.managing import Manager, ManagerOptions

Key = tuple[str, str]
DOC: dict[str, Any] = {
    "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
    "users": [{"name": "u", "user": {}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


def manager(shutdown_timeout: float = 8.0) -> Manager:
    return Manager(
        Client(lambda: pykube.KubeConfig(DOC)),
        ManagerOptions(
            namespace="ns",
            identity="me",
            leader_election=False,
            health_address=None,
            metrics_address=None,
            shutdown_timeout=shutdown_timeout,
        ),
        registry=CollectorRegistry(),
    )


class Blocking:
    """A reconcile that runs until ``release`` is set."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()

    def reconcile(self, _key: Key) -> Result | None:
        self.running.set()
        assert self.release.wait(10)
        return None


def test_leading_hooks_run_before_any_controller_starts() -> None:
    m = manager()
    order: list[str] = []
    seeded = threading.Event()

    def seed() -> list[Key]:
        order.append("seed")
        seeded.set()
        return []

    m.on_leading(lambda: order.append("hook"))
    m.add_controller(m.controller("c", Blocking(), seed=seed), [])
    stop = threading.Event()
    runner = threading.Thread(target=m.run, args=(stop,))
    runner.start()
    try:
        assert seeded.wait(10)
    finally:
        stop.set()
        runner.join(10)
    assert order == ["hook", "seed"]


def test_stopping_waits_for_in_flight_reconciles_and_says_when_one_did_not_end() -> None:
    m = manager(shutdown_timeout=0.4)
    stuck = Blocking()
    controller = m.controller("stuck", stuck, seed=lambda: [("", "a")])
    m.add_controller(controller, [])
    controller.start()
    assert stuck.running.wait(10)
    try:
        assert m._stop_leading() is False
    finally:
        stuck.release.set()
        for worker in [t for t in threading.enumerate() if t.name.startswith("stuck-")]:
            worker.join(10)


def test_stopping_reports_drained_when_every_reconcile_ended() -> None:
    m = manager()
    done = Blocking()
    done.release.set()
    controller = m.controller("quick", done, seed=lambda: [("", "a")])
    m.add_controller(controller, [])
    controller.start()
    assert done.running.wait(10)
    assert m._stop_leading() is True


def test_leader_election_needs_a_lease_name() -> None:
    """The runtime knows no product names: the caller names the Lease it campaigns for."""
    with pytest.raises(ValueError, match="lease_name"):
        Manager(
            Client(lambda: pykube.KubeConfig(DOC)),
            ManagerOptions(namespace="ns", identity="me", health_address=None),
            registry=CollectorRegistry(),
        )


class StaleAfterSync:
    """An informer as ``ready()`` sees it: synced, and stale for ``stale`` seconds."""

    def __init__(self, stale: float, crashed: bool = False) -> None:
        self.stale, self._crashed = stale, crashed

    def has_synced(self) -> bool:
        return True

    def stale_for(self) -> float:
        return self.stale

    def crashed(self) -> bool:
        return self._crashed

    def current(self) -> bool:
        return not self._crashed and self.stale < 10.0


def test_a_replica_is_not_ready_while_a_synced_cache_is_stale_or_its_informer_died() -> None:
    m = manager()
    m._informers["claims"] = StaleAfterSync(0.0)  # type: ignore[assignment]
    assert m.ready() == (True, [])
    m._informers["claims"] = StaleAfterSync(3.0)  # type: ignore[assignment]
    assert m.ready() == (True, []), "a relist shorter than stale_after keeps it ready"
    m._informers["claims"] = StaleAfterSync(12.0)  # type: ignore[assignment]
    assert m.ready() == (False, ["claims (stale 12s)"])
    m._informers["claims"] = StaleAfterSync(0.0, crashed=True)  # type: ignore[assignment]
    assert m.ready() == (False, ["claims (informer died)"])
