"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's
``tools/leaderelection`` does it.

What this does NOT guarantee (read this first):

* **No fencing by the lease itself.** Holding the Lease does not stop anybody else from
  writing: a replica that is paused (GC, a stalled node, a slow request) can still believe it
  leads after another one took over. The runtime fences every controller write with
  ``LeaderElector.is_leader()``, which turns False as soon as a renew is overdue
  (``renew_deadline`` after the last successful one), i.e. before any other candidate may
  take over (``lease_duration`` after it last saw the record change). Writes already in
  flight when leadership is lost are not recalled.
* **Tolerant to clock skew between replicas, not to clock skew rate.** A candidate judges
  validity only on its own monotonic clock, from the moment it observed the record change;
  ``renewTime`` and ``acquireTime`` in the record are informative and never compared with
  the local clock. The gap ``lease_duration - renew_deadline`` is the margin for clocks
  ticking at different rates and for the time a write takes to land.
* **Identities must be unique per process** (``unique_identity()``): two live processes with
  one identity both "renew" the same Lease and both lead.

How one attempt (``try_acquire_or_renew``) works: get the Lease; create it with us as holder
when absent; when the record differs from the last one observed, remember it and the local
monotonic time; fail while another identity holds it and ``observed_time +
leaseDurationSeconds`` lies ahead; otherwise write us as holder (acquireTime and
leaseTransitions kept when we already held it, else acquireTime=now and transitions+1) with
the resourceVersion as precondition, so of two racing candidates exactly one wins (409 for
the other). ``holderIdentity == ""`` (a released Lease) is free.

``run()`` loops: acquire (every ``retry_period`` with jitter 1.2), ``on_started_leading()``,
renew every ``retry_period``; leadership is lost when no renew succeeded within
``renew_deadline``, or (stricter than client-go) at once when an attempt sees another valid
holder. Every ``on_started_leading()`` is followed by exactly one ``on_stopped_leading()``.

**Stopping hands over safely** (client-go's ``ReleaseOnCancel`` warns that everything the
lease guards must have finished before the release, or two processes act at once). On stop:
fence (``is_leader()`` turns False, so no new write leaves), call ``on_stopped_leading()``
(it stops the controllers and waits for their in-flight writes), and only then release. A
callback that returns ``False`` says work may still be running: the Lease is then kept and
expires on its own, ``lease_duration`` after the last renew, so the next leader starts only
once nothing of this replica can still be writing. ``lease_remaining()`` is the time left
until then; the client cuts each fenced write's timeout to it.

The record and the stores that keep it (the Kubernetes Lease) are in ``leases``; this module
is the elector: its configuration, its loop and its metrics.
"""

from __future__ import annotations

import dataclasses
import math
import random
import socket
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Final

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from gpuoperator.runtime import clock as clocks
from gpuoperator.runtime import errors
from gpuoperator.runtime.leases import LeaderElectionRecord, LeaseStore

#: As client-go's ``JitterFactor``: acquire retries wait ``retry_period * (1 + rand * 1.2)``.
JITTER_FACTOR: Final = 1.2

# Reasons, as logged with ``lost leadership`` and ``became leader``.
REASON_RENEW_DEADLINE: Final = "RenewDeadlineExceeded"
REASON_OTHER_HOLDER: Final = "AnotherHolderObserved"
REASON_STOPPED: Final = "Stopped"
REASON_ERROR: Final = "Error"
REASON_NOT_DRAINED: Final = "NotDrained"


# --- Configuration ---------------------------------------------------------------------------


def unique_identity(base: str | None = None) -> str:
    """An identity unique to this process: ``<base or hostname>_<random hex>``.

    A restarted pod keeps its name, so the name alone would let the new process "renew" the
    Lease its predecessor held; the suffix makes it a new candidate like any other.
    """
    return f"{base or socket.gethostname()}_{uuid.uuid4().hex}"


@dataclasses.dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives, who we are, and the timing (seconds).

    Validated at construction as client-go's ``NewLeaderElector`` does:
    ``lease_duration > renew_deadline > 1.2 * retry_period > 0`` and a non-empty identity.
    ``lease_duration`` must also be whole seconds, because the record carries
    ``leaseDurationSeconds`` as an integer and the fence relies on other candidates waiting
    at least ``lease_duration``. A bad value raises ``ValueError`` naming the field.

    ``release_on_cancel``: on stop, write an empty holder so another replica takes over at
    its next attempt instead of after ``lease_duration``.
    """

    namespace: str
    _: dataclasses.KW_ONLY
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        for field in ("namespace", "name", "identity"):
            if not getattr(self, field):
                raise ValueError(f"{field} must not be empty")
        for field in ("lease_duration", "renew_deadline", "retry_period"):
            value = getattr(self, field)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{field} must be a finite number greater than zero, not {value}")
        if self.lease_duration != int(self.lease_duration):
            raise ValueError(
                f"lease_duration must be whole seconds (leaseDurationSeconds is an integer), "
                f"not {self.lease_duration}"
            )
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(
                f"lease_duration ({self.lease_duration}) must be greater than renew_deadline "
                f"({self.renew_deadline})"
            )
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"renew_deadline ({self.renew_deadline}) must be greater than "
                f"{JITTER_FACTOR} * retry_period ({self.retry_period})"
            )

    @property
    def key(self) -> str:
        """``namespace/name`` of the Lease, as logged and used as the metrics label."""
        return f"{self.namespace}/{self.name}"


# --- Metrics ---------------------------------------------------------------------------------


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.is_leader = Gauge(
            "gpuoperator_leader_is_leader",
            "1 while this replica leads (holds the Lease and renews it in time), else 0",
            ["lease"],
            registry=registry,
        )
        self.transitions = Counter(
            "gpuoperator_leader_transitions",
            "Times this replica became leader or stopped leading",
            ["lease"],
            registry=registry,
        )


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def _metrics(registry: CollectorRegistry) -> _Metrics:
    """One set of collectors per registry, however many electors are built on it."""
    with _METRICS_LOCK:
        found = _METRICS.get(registry)
        if found is None:
            found = _METRICS[registry] = _Metrics(registry)
        return found


# --- The elector -----------------------------------------------------------------------------


class LeaderElector:
    """One candidate for one Lease.

    ``run(stop)`` is the loop; ``try_acquire_or_renew()`` one attempt of it. Both belong to a
    single thread (the one that owns the store's client). ``is_leader()`` and ``leader()``
    may be called from any thread.

    Callbacks run on the elector's thread and must return promptly (start or stop the
    controllers' threads and return): renews do not happen while they run.
    ``on_stopped_leading`` runs after the fence and before a release; it returns ``False``
    when what it stopped may still be writing (then the Lease is left to expire).
    ``on_started_leading`` and ``on_stopped_leading`` strictly alternate, starting with
    ``on_started_leading``. ``on_new_leader(identity)`` is told every change of the observed
    holder, including us and ``""`` (released); its exceptions are logged and dropped.

    ``wait(seconds) -> bool`` pauses between attempts and returns True when the elector should
    stop; it defaults to ``stop.wait``. Tests on a ``FakeClock`` pass one that advances the
    clock instead. ``jitter()`` returns a number in [0, 1) (default ``random.random``).
    """

    def __init__(
        self,
        config: LeaderElectionConfig,
        store: LeaseStore,
        *,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], bool | None],
        on_new_leader: Callable[[str], None] | None = None,
        clock: clocks.Clock = clocks.SYSTEM,
        registry: CollectorRegistry | None = None,
        wait: Callable[[float], bool] | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._config = config
        self._store = store
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock = clock
        self._wait = wait
        self._jitter = jitter
        self._log = structlog.get_logger(__name__).bind(lease=config.key, identity=config.identity)
        metrics = _metrics(registry if registry is not None else REGISTRY)
        self._gauge = metrics.is_leader.labels(lease=config.key)
        self._transitions = metrics.transitions.labels(lease=config.key)
        self._gauge.set(0)

        # Guarded by _lock (read by is_leader() from other threads).
        self._lock = threading.Lock()
        self._observed: LeaderElectionRecord | None = None
        self._observed_time = 0.0  # local monotonic time the observed record last changed
        self._resource_version: str | None = None
        self._renewed_at: float | None = None  # monotonic start of the last successful write
        # Only the elector's thread touches these.
        self._reported_leader: str | None = None
        self._acquired_because = ""

    @property
    def config(self) -> LeaderElectionConfig:
        return self._config

    # -- queries (any thread) --

    def is_leader(self) -> bool:
        """True only while we hold the Lease and our last successful renew started less than
        ``renew_deadline`` ago (local monotonic time). The fence every controller write
        checks: it turns False the moment leadership is in doubt, before the renew loop
        notices and well before another candidate may take over."""
        with self._lock:
            return self._leading_locked()

    def lease_remaining(self) -> float:
        """Seconds until another candidate may take the Lease from us (``lease_duration``
        after our last successful renew started, local monotonic time); 0 when we do not
        lead. A write that must land while we lead has to end before then."""
        with self._lock:
            if not self._leading_locked():
                return 0.0
            assert self._renewed_at is not None
            left = self._renewed_at + self._config.lease_duration - self._clock.monotonic()
        return max(0.0, left)

    def _leading_locked(self) -> bool:
        if self._renewed_at is None or self._observed is None:
            return False
        if self._observed.holder_identity != self._config.identity:
            return False
        return self._clock.monotonic() - self._renewed_at < self._config.renew_deadline

    def leader(self) -> str:
        """The holder we last observed ("" when released or not yet observed)."""
        with self._lock:
            return self._observed.holder_identity if self._observed else ""

    # -- one attempt --

    def try_acquire_or_renew(self) -> bool:
        """One attempt to acquire or renew the Lease; True when we hold it afterwards.

        API and connection errors fail the attempt (logged), they do not raise.
        """
        started = self._clock.monotonic()
        now = self._clock.now()
        cfg = self._config
        ours = LeaderElectionRecord(
            holder_identity=cfg.identity,
            lease_duration_seconds=int(cfg.lease_duration),
            acquire_time=now,
            renew_time=now,
            lease_transitions=0,
        )
        try:
            got = self._store.get(cfg.namespace, cfg.name)
            if got is None:
                version = self._store.create(cfg.namespace, cfg.name, ours)
                self._acquired_because = "LeaseCreated"
                self._wrote(ours, version, started)
                return True
        except (errors.ApiError, OSError) as exc:
            self._attempt_failed(exc)
            return False

        current, version = got
        self._observe(current, version)
        holder = current.holder_identity
        if holder and holder != cfg.identity and self._observed_valid():
            return False
        if holder == cfg.identity:
            ours = dataclasses.replace(
                ours,
                acquire_time=current.acquire_time or now,
                lease_transitions=current.lease_transitions,
            )
            because = "AlreadyHolder"
        else:
            ours = dataclasses.replace(ours, lease_transitions=current.lease_transitions + 1)
            because = "LeaseExpired" if holder else "LeaseReleased"
        try:
            new_version = self._store.update(cfg.namespace, cfg.name, ours, version)
        except (errors.ApiError, OSError) as exc:
            self._attempt_failed(exc)
            return False
        self._acquired_because = because
        self._wrote(ours, new_version, started)
        return True

    def release(self) -> bool:
        """Give the Lease up if we hold it, as client-go's ``release()``: holder "",
        leaseDurationSeconds 1, acquireTime = renewTime = now, transitions kept; conditional
        on the resourceVersion we last saw, so it never clobbers a new holder. Fences first.
        True when released (or there was nothing to release)."""
        with self._lock:
            self._renewed_at = None
            observed, version = self._observed, self._resource_version
        if observed is None or version is None or observed.holder_identity != self._config.identity:
            return True
        now = self._clock.now()
        released = LeaderElectionRecord(
            holder_identity="",
            lease_duration_seconds=1,
            acquire_time=now,
            renew_time=now,
            lease_transitions=observed.lease_transitions,
        )
        try:
            new_version = self._store.update(
                self._config.namespace, self._config.name, released, version
            )
        except (errors.ApiError, OSError) as exc:
            self._log.warning(
                "lease release failed",
                holder=observed.holder_identity,
                reason=_reason(exc),
                error=str(exc),
            )
            return False
        self._wrote(released, new_version, None)
        self._log.info("released lease", holder="", reason=REASON_STOPPED)
        return True

    # -- the loop --

    def run(self, stop: threading.Event) -> None:
        """Acquire, lead, and on loss go back to acquiring, until ``stop`` is set.

        When ``stop`` is set while leading: fence, call ``on_stopped_leading``, release (if
        ``release_on_cancel`` and the callback did not return ``False``) and return. An
        unexpected exception (a bug, not an API error) fences, calls
        ``on_stopped_leading`` if we were leading, and propagates.
        """
        wait = self._wait if self._wait is not None else stop.wait

        def pause(seconds: float) -> bool:
            return bool(wait(max(0.0, seconds))) or stop.is_set()

        while not stop.is_set():
            if not self._acquire(pause):
                return
            self._lead(pause)

    def _acquire(self, pause: Callable[[float], bool]) -> bool:
        """Attempt until we hold the Lease (True) or we are told to stop (False).

        While another holder's lease runs, the next attempt comes after exactly
        ``retry_period``, or at the lease's expiry if that is sooner: a renew is seen at most
        one period late and an expired lease is taken at once, so a dead leader is replaced
        within ``lease_duration + retry_period``. Otherwise (a free lease lost to a faster
        candidate, an API error) the wait is jittered as client-go's, to spread contenders.
        """
        period = self._config.retry_period
        while True:
            if self.try_acquire_or_renew():
                return True
            expiry = self._until_observed_expiry()
            if expiry is not None:
                delay = min(period, expiry)
            else:
                delay = period * (1.0 + self._jitter() * JITTER_FACTOR)
            if pause(delay):
                return False

    def _until_observed_expiry(self) -> float | None:
        """Seconds until another holder's observed lease expires (None if none runs)."""
        if not self._other_holder_valid():
            return None
        with self._lock:
            if self._observed is None:
                return None
            expires = self._observed_time + self._observed.lease_duration_seconds
        return max(0.0, expires - self._clock.monotonic())

    def _lead(self, pause: Callable[[float], bool]) -> None:
        """From ``on_started_leading`` to ``on_stopped_leading``: renew until lost or stop."""
        reason: str | None = REASON_ERROR
        try:
            self._started_leading()
            while True:
                if pause(self._until_next_renew()):
                    reason = REASON_STOPPED
                    break
                reason = self._renew()
                if reason is not None:
                    break
        finally:
            self._stopped_leading(reason or REASON_ERROR)

    def _until_next_renew(self) -> float:
        """``retry_period``, shortened so the loop wakes up at the renew deadline."""
        with self._lock:
            renewed_at = self._renewed_at
        if renewed_at is None:
            return 0.0
        remaining = renewed_at + self._config.renew_deadline - self._clock.monotonic()
        return max(0.0, min(self._config.retry_period, remaining))

    def _renew(self) -> str | None:
        """One renew step while leading: None if we still lead, else why we do not."""
        if self._renew_overdue():
            return REASON_RENEW_DEADLINE
        if self.try_acquire_or_renew():
            return None
        if self._other_holder_valid():
            return REASON_OTHER_HOLDER
        if self._renew_overdue():
            return REASON_RENEW_DEADLINE
        return None

    def _renew_overdue(self) -> bool:
        with self._lock:
            renewed_at = self._renewed_at
        return (
            renewed_at is None
            or self._clock.monotonic() - renewed_at >= self._config.renew_deadline
        )

    def _other_holder_valid(self) -> bool:
        with self._lock:
            observed = self._observed
        if observed is None:
            return False
        holder = observed.holder_identity
        return bool(holder) and holder != self._config.identity and self._observed_valid()

    # -- state changes --

    def _observed_valid(self) -> bool:
        """Whether the observed record's lease runs on, by our own monotonic clock."""
        with self._lock:
            if self._observed is None:
                return False
            expires = self._observed_time + self._observed.lease_duration_seconds
        return expires > self._clock.monotonic()

    def _observe(self, record: LeaderElectionRecord, version: str) -> None:
        """Remember the record read; restart its validity clock only if it changed."""
        with self._lock:
            if record != self._observed:
                self._observed = record
                self._observed_time = self._clock.monotonic()
            self._resource_version = version
        self._report_leader(record.holder_identity)

    def _wrote(self, record: LeaderElectionRecord, version: str, started: float | None) -> None:
        """Remember a record we wrote; ``started`` (when we hold it) marks a renew."""
        with self._lock:
            self._observed = record
            self._observed_time = self._clock.monotonic()
            self._resource_version = version
            self._renewed_at = started
        self._report_leader(record.holder_identity)

    def _report_leader(self, holder: str) -> None:
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        self._log.info("new leader observed", holder=holder, reason="HolderChanged")
        if self._on_new_leader is None:
            return
        try:
            self._on_new_leader(holder)
        except Exception as exc:  # a reporting hook must not break the election
            self._log.exception("on_new_leader failed", holder=holder, error=str(exc))

    def _attempt_failed(self, exc: Exception) -> None:
        if isinstance(exc, errors.ConflictError | errors.AlreadyExistsError):
            # Another candidate wrote first: the next attempt reads what it wrote.
            self._log.debug("lease attempt lost a race", reason=_reason(exc), error=str(exc))
        else:
            self._log.warning("lease attempt failed", reason=_reason(exc), error=str(exc))

    def _started_leading(self) -> None:
        self._log.info("became leader", holder=self._config.identity, reason=self._acquired_because)
        self._gauge.set(1)
        self._transitions.inc()
        self._on_started_leading()

    def _stopped_leading(self, reason: str) -> None:
        with self._lock:
            self._renewed_at = None  # fence before anything else
        holder = self.leader()
        self._gauge.set(0)
        self._transitions.inc()
        if reason == REASON_STOPPED:
            self._log.info("lost leadership", holder=holder, reason=reason)
        else:
            self._log.warning("lost leadership", holder=holder, reason=reason)
        # What the lease guards stops first; the release (if any) comes after it.
        drained = self._on_stopped_leading()
        if reason != REASON_STOPPED or not self._config.release_on_cancel:
            return
        if drained is False:
            self._log.warning(
                "lease left to expire: work it guards may still be running",
                holder=holder,
                reason=REASON_NOT_DRAINED,
            )
            return
        self.release()


def _reason(exc: Exception) -> str:
    return exc.reason if isinstance(exc, errors.ApiError) else type(exc).__name__
