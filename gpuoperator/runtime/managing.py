"""The manager: caches, leader election, controllers and servers of one replica.

Lifecycle of ``Manager.run``:

1. serve ``/healthz`` (alive: every informer's thread runs) and ``/readyz`` (ready only while
   every cache has synced and is current, ``Informer.current``), the
   metrics endpoint (HTTPS, each scrape authorised through TokenReview and
   SubjectAccessReview) and any extra servers (webhooks run on every replica);
2. start every informer and wait for the first lists (progress is logged);
3. campaign for the Lease; while this replica leads, its controllers run; when it stops
   leading they stop (in-flight reconciles finish, writes are fenced from that moment, and
   each write's attempt ends before another replica may take the Lease:
   ``LeaderElector.lease_remaining``);
4. on ``stop`` (SIGTERM): fence, stop the controllers and wait for their in-flight
   reconciles (all at once, within half of ``shutdown_timeout``), and only then release the
   Lease so another replica takes over at once — if a reconcile is still running, the Lease
   is kept and expires on its own instead; then stop the caches and servers.

Why a leader killed mid-bind (SIGKILL) or stopped (SIGTERM) never lets two replicas hand out
the same units: writes leave only while ``is_leader()`` holds, each attempt's timeout ends
before the Lease could pass to another replica, a released Lease is released only after
every write ended, and a kept Lease is taken only ``lease_duration`` after its last renew.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuoperator.runtime import servercerts, serving
from gpuoperator.runtime.authorizing import Authorizer
from gpuoperator.runtime.client import Client, Kind, Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Reconciler
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.informing import Handlers, Informer, InformerOptions
from gpuoperator.runtime.leading import LeaderElectionConfig, LeaderElector
from gpuoperator.runtime.leases import KubeLeaseStore

log = structlog.get_logger(__name__)

Mapper = Callable[[Obj], Iterable[Key]]


class Source(Protocol):
    """What wakes a controller: an ``Informer`` (API objects) or a ``Feed`` (notices such
    as the ledger's changes); each event is mapped to keys by the watch's ``Mapper``."""

    def add_handlers(self, handlers: Handlers) -> None: ...


# What a ``register`` function uses of the manager, one facet each: a component's own
# ``Protocol`` inherits those it needs (and names the writer it takes, typed by what it
# writes), so a test wires it onto any object with those members, with no cast.
# ``Manager`` satisfies every facet here.


class Informs(Protocol):
    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        """The shared informer ``name`` (default: the kind's endpoint), created once."""
        ...


class Controls(Protocol):
    def controller(
        self,
        name: str,
        reconciler: Reconciler[Key],
        *,
        workers: int = ...,
        seed: Callable[[], Iterable[Key]] = ...,
    ) -> Controller[Key]:
        """A controller on the manager's clock and registry."""
        ...

    def add_controller(
        self, controller: Controller[Key], watches: Iterable[tuple[Source, Mapper]]
    ) -> None:
        """Run ``controller`` while leading, woken by ``watches``."""
        ...


class Clocked(Protocol):
    @property
    def clock(self) -> Clock: ...


class Measured(Protocol):
    @property
    def registry(self) -> CollectorRegistry: ...


class Leads(Protocol):
    def is_leader(self) -> bool: ...


@dataclass
class ManagerOptions:
    namespace: str
    identity: str
    leader_election: bool = True
    #: The Lease leader election takes (required with ``leader_election``).
    lease_name: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    health_address: str | None = ":8081"
    metrics_address: str | None = ":8443"
    metrics_tls: tuple[Path, Path] | None = None
    metrics_insecure: bool = False
    sync_timeout: float = 300.0
    shutdown_timeout: float = 8.0
    extra_servers: list[serving.Server] = field(default_factory=list)


class Manager:
    def __init__(
        self,
        client: Client,
        options: ManagerOptions,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Clock = SYSTEM,
    ) -> None:
        if options.leader_election and not options.lease_name:
            raise ValueError("lease_name must not be empty with leader_election")
        self.client = client
        self.options = options
        self.registry = registry
        self.clock = clock
        self._informers: dict[str, Informer] = {}
        self._controllers: list[Controller[Any]] = []
        self._leading_hooks: list[Callable[[], None]] = []
        self._gates: list[tuple[str, Callable[[], bool]]] = []
        self._leading = threading.Event()
        self._elector: LeaderElector | None = None
        self._servers: list[serving.Server] = []
        self._log = log.bind(identity=options.identity)
        #: Writes on behalf of controllers go through this view: refused once we stop leading.
        self.writer = client.fenced(self.is_leader, remaining=self._lease_remaining)
        self._writers: dict[str, Client] = {}

    def writer_for(self, component: str) -> Client:
        """The fenced writer of one component, with a client-side QPS/burst bucket of its own
        (``Client.own_limit``): the binder's writes do not queue behind Events or status
        figures, as each kube-controller-manager controller has its own client. One view per
        name, created once."""
        if component not in self._writers:
            self._writers[component] = self.client.own_limit().fenced(
                self.is_leader, remaining=self._lease_remaining
            )
        return self._writers[component]

    # ---- wiring -------------------------------------------------------------------
    def informer(
        self, kind: Kind, options: InformerOptions | None = None, name: str | None = None
    ) -> Informer:
        """The shared informer ``name`` (default: the kind's endpoint), created once."""
        name = name or kind.endpoint
        if name not in self._informers:
            self._informers[name] = Informer(
                self.client, kind, options, name=name, clock=self.clock, registry=self.registry
            )
        return self._informers[name]

    def controller(
        self,
        name: str,
        reconciler: Reconciler[Key],
        *,
        workers: int = 2,
        seed: Callable[[], Iterable[Key]] = tuple,
    ) -> Controller[Key]:
        """A controller on this manager's clock and registry (add it with
        ``add_controller``)."""
        return Controller(
            name, reconciler, workers=workers, seed=seed, clock=self.clock, registry=self.registry
        )

    def add_controller(
        self, controller: Controller[Key], watches: Iterable[tuple[Source, Mapper]]
    ) -> None:
        """Run ``controller`` while leading, woken by ``watches``: every way it is woken is
        one ``(source, mapper)`` entry here; each event is mapped to keys."""

        def enqueue(mapper: Mapper) -> Handlers:
            def on_obj(obj: Obj) -> None:
                for key in mapper(obj):
                    controller.enqueue(key)

            def on_update(old: Obj, new: Obj) -> None:
                keys = set(mapper(old)) | set(mapper(new))
                for key in keys:
                    controller.enqueue(key)

            return Handlers(on_add=on_obj, on_update=on_update, on_delete=on_obj)

        for informer, mapper in watches:
            informer.add_handlers(enqueue(mapper))
        self._controllers.append(controller)

    def on_leading(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` each time this replica becomes leader, before any controller starts
        (in the elector's thread: keep it short). A hook that raises is logged and the
        controllers start anyway."""
        self._leading_hooks.append(hook)

    # ---- state --------------------------------------------------------------------
    def is_leader(self) -> bool:
        if not self.options.leader_election:
            return self._leading.is_set()
        return self._elector is not None and self._elector.is_leader()

    def _lease_remaining(self) -> float:
        """Seconds this replica may still write (unbounded without leader election)."""
        if not self.options.leader_election:
            return float("inf")
        return self._elector.lease_remaining() if self._elector is not None else 0.0

    def add_readiness_gate(self, name: str, check: Callable[[], bool]) -> None:
        """``/readyz`` (and the webhooks) also wait for ``check``, e.g. a serving
        certificate; the caches' sync and the campaign for the Lease do not."""
        self._gates.append((name, check))

    def caches_synced(self) -> tuple[bool, list[str]]:
        waiting = [n for n, i in self._informers.items() if not i.has_synced()]
        return not waiting, waiting

    def ready(self) -> tuple[bool, list[str]]:
        """Ready: every cache synced and current (not stale for long, its thread alive:
        ``Informer.current``) and every readiness gate open; else what is missing."""
        _, waiting = self.caches_synced()
        waiting += [
            f"{n} (stale {i.stale_for():.0f}s)" if not i.crashed() else f"{n} (informer died)"
            for n, i in self._informers.items()
            if i.has_synced() and not i.current()
        ]
        waiting += [name for name, check in self._gates if not check()]
        return not waiting, waiting

    # ---- run ----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        o = self.options
        try:
            if o.health_address:
                self._serve(
                    serving.Server(
                        "health",
                        o.health_address,
                        self._health_app(),
                        limits=serving.Limits(
                            max_connections=128, max_connections_per_source=64, workers=1
                        ),
                        registry=self.registry,
                    )
                )
            if o.metrics_address:
                self._serve(self._metrics_server())
            for server in o.extra_servers:
                self._serve(server)
            self._start_caches(stop)
            if stop.is_set():
                return
            if o.leader_election:
                self._campaign(stop)
            else:
                self._start_leading()
                stop.wait()
        finally:
            self._shutdown()

    def _serve(self, server: serving.Server) -> None:
        server.start()
        self._servers.append(server)

    def _start_caches(self, stop: threading.Event) -> None:
        """Start every informer and wait for the first lists.

        The cyclic garbage collector is off meanwhile: the lists decode hundreds of
        thousands of acyclic dicts, and each collection would walk the growing caches again
        (half of a 40,000-pod sync's CPU). Once synced, what the caches hold is moved to
        the collector's permanent generation (``gc.freeze``), so later collections walk
        only what changed since; reference counting still frees replaced objects."""
        start = time.monotonic()
        gc.disable()
        try:
            self._sync(start, stop)
        finally:
            gc.enable()
            gc.freeze()

    def _sync(self, start: float, stop: threading.Event) -> None:
        for informer in self._informers.values():
            informer.start()
        deadline = start + self.options.sync_timeout
        next_report = start + 5.0
        while not stop.is_set():
            ok, waiting = self.caches_synced()
            now = time.monotonic()
            if ok:
                self._log.info(
                    "caches synced", seconds=round(now - start, 2), informers=len(self._informers)
                )
                return
            if now > deadline:
                raise TimeoutError(
                    f"caches not synced after {self.options.sync_timeout:.0f}s: "
                    + ", ".join(waiting)
                )
            if now >= next_report:
                self._log.info("waiting for caches", waiting=waiting, seconds=round(now - start))
                next_report = now + 5.0
            stop.wait(0.05)

    def _campaign(self, stop: threading.Event) -> None:
        o = self.options
        config = LeaderElectionConfig(
            namespace=o.namespace,
            name=o.lease_name,
            identity=o.identity,
            lease_duration=o.lease_duration,
            renew_deadline=o.renew_deadline,
            retry_period=o.retry_period,
        )
        # The elector owns its own HTTP client (a pykube session is not thread-safe).
        api = self.client.dedicated_http(timeout=o.renew_deadline / 2)
        self._elector = LeaderElector(
            config,
            KubeLeaseStore(api),
            clock=self.clock,
            on_started_leading=self._start_leading,
            on_stopped_leading=self._stop_leading,
            registry=self.registry,
        )
        self._elector.run(stop)

    def _start_leading(self) -> None:
        self._leading.set()
        for hook in self._leading_hooks:
            try:
                hook()
            except Exception as exc:
                self._log.exception(
                    "leading hook failed; starting the controllers anyway",
                    reason=type(exc).__name__,
                    error=str(exc),
                )
        self._log.info("starting controllers", controllers=[c.name for c in self._controllers])
        for c in self._controllers:
            c.start()

    def _stop_leading(self) -> bool:
        """Stop every controller at once and wait (half of ``shutdown_timeout`` in all)
        for their in-flight reconciles; True when all of them ended."""
        self._leading.clear()
        budget = self.options.shutdown_timeout / 2
        results: dict[str, bool] = {}

        def stop(c: Controller[Any]) -> None:
            results[c.name] = c.stop(budget)

        threads = [
            threading.Thread(target=stop, args=(c,), name=f"stop-{c.name}", daemon=True)
            for c in self._controllers
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + budget + 0.5
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        running = sorted(c.name for c in self._controllers if not results.get(c.name, False))
        if running:
            self._log.warning(
                "controllers still running after the shutdown budget",
                controllers=running,
                reason="NotDrained",
            )
        return not running

    def _shutdown(self) -> None:
        start = time.monotonic()
        if self._leading.is_set():
            self._stop_leading()
        for informer in self._informers.values():
            informer.stop(timeout=0)
        deadline = time.monotonic() + 1.0
        for informer in self._informers.values():
            informer.stop(timeout=max(0.0, deadline - time.monotonic()))
        for server in reversed(self._servers):
            server.stop()
        self._log.info("stopped", seconds=round(time.monotonic() - start, 2))

    # ---- endpoints ----------------------------------------------------------------
    def _health_app(self) -> serving.App:
        def healthz(_request: serving.Request) -> serving.Response:
            dead = [n for n, i in self._informers.items() if i.crashed()]
            if dead:  # a cache nothing follows any more: restart the replica
                return serving.text(503, "informer died: " + ", ".join(dead))
            return serving.text(200, "ok")

        def readyz(_request: serving.Request) -> serving.Response:
            ok, waiting = self.ready()
            if ok:
                return serving.text(200, "ok")
            return serving.text(503, "not ready, waiting for: " + ", ".join(waiting))

        return serving.app({"/healthz": healthz, "/readyz": readyz})

    def _metrics_server(self) -> serving.Server:
        o = self.options
        authorizer = None if o.metrics_insecure else Authorizer(self.client, clock=self.clock)

        def metrics(request: serving.Request) -> serving.Response:
            if authorizer is not None:
                decision = authorizer.authorize(
                    request.headers.get("authorization"), "/metrics", source=request.peer
                )
                if decision.status != 200:
                    log.debug(
                        "scrape refused",
                        status=decision.status,
                        reason=decision.reason,
                        peer=request.peer,
                    )
                    headers = (
                        (("WWW-Authenticate", 'Bearer realm="gpuoperator"'),)
                        if decision.status == 401
                        else (("Retry-After", "1"),)
                        if decision.status in (429, 503)
                        else ()
                    )
                    return serving.Response(
                        decision.status, (decision.message + "\n").encode(), headers=headers
                    )
            return serving.Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

        tls = None if o.metrics_insecure else (o.metrics_tls or servercerts.self_signed())
        return serving.Server(
            "metrics",
            o.metrics_address or ":8443",
            serving.app({"/metrics": metrics}),
            tls=tls,
            limits=serving.Limits(max_connections=256, max_connections_per_source=32, workers=2),
            registry=self.registry,
        )
