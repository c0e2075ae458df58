"""GPU-hours (docs/design.md §5 "GPU-hours"): the unit-seconds a claim has held, split into
**idle** (Bound, its VM not running) and **in use** (Bound, its VM instance running), kept in
the claim's own status so that every replica, and every leader after the next, reads the
same totals.

``status.usage`` of a GPUClaim::

    idleUnitSeconds: 5400      # closed intervals, in unit-seconds (seconds * spec.count)
    inUseUnitSeconds: 1800
    state: Idle | InUse        # the open interval (absent: the claim holds nothing now)
    since: 2026-01-01T02:00:00Z  # when that state began (absent state: when the hold ended)

The totals at time ``t`` are the closed sums plus the open interval ``(t - since) *
count`` added to its state (:func:`totals`). Only a change of state is written
(:func:`advance`): the open interval is closed at the moment of the write and the next one
opened at that same moment, so nothing is counted twice and nothing is lost; a leader that
takes over later reads the open interval from the status and goes on counting from
``since``. The sum idle + in use is the time the claim was Bound, exactly; where the split
lies between the two depends on when the change is written (a VM that started while no
replica led is counted idle until the new leader writes the change, seconds later).

Choices where docs/design.md is silent:

* **In use** means the VM instance the claim serves (``model.claims``: a template claim's
  owner, a held claim's attachment, by UID once recorded) has a running launcher pod: phase
  ``Scheduled`` (the pod runs on the node and holds the GPU; KubeVirt's handler then moves it
  to ``Running``) or ``Running``, a VMI being deleted included (its pod may still hold the
  GPU).
* **Held** means phase ``Bound`` with a node, a claim being deleted included: its units stay
  held until the claim is gone.
* Moments are whole seconds (the precision of the API's timestamps); a ``since`` in the
  future (a clock step) counts as now, so totals never go back.

**Sums per namespace and class** (the ``namespace`` setting of the GPU-hours series, for
metrics that must not name claims): a process adds up what each claim accrued while it
watched (:func:`accrued` between two readings of the claim's totals, never negative), so a
sum never drops when a claim goes, and starts again from zero when the process does, as any
process's counter (Prometheus reads that as a reset and loses nothing but the restart's
gap). A claim first seen after the process started is counted in full when its hold began
since then (:func:`bound_since`): all its hours are new; any other claim first seen is
counted from that sight on.

Every function is pure and idempotent.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims, conditions, orders

Obj = dict[str, Any]

#: VMI phases in which the launcher pod runs on its node (and so holds the GPU).
RUNNING_PHASES: Final = frozenset({names.VMI_SCHEDULED, names.VMI_RUNNING})


class State(enum.StrEnum):
    IDLE = "Idle"
    IN_USE = "InUse"


@dataclasses.dataclass(frozen=True)
class Usage:
    """A claim's ``status.usage``: closed unit-seconds and the open interval."""

    idle: int = 0
    in_use: int = 0
    state: State | None = None
    #: when ``state`` began (with no state: when the last hold ended)
    since: datetime.datetime | None = None


@dataclasses.dataclass(frozen=True)
class Totals:
    """Unit-seconds up to a moment."""

    idle: float
    in_use: float

    @property
    def held(self) -> float:
        return self.idle + self.in_use


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _second(moment: datetime.datetime) -> datetime.datetime:
    return moment.astimezone(datetime.UTC).replace(microsecond=0)


def read(claim: Mapping[str, Any]) -> Usage:
    """The claim's ``status.usage`` (unreadable parts read as absent)."""
    found = _mapping(_mapping(claim.get("status")).get("usage"))
    try:
        state: State | None = State(str(found.get("state")))
    except ValueError:
        state = None
    since = conditions.parse_stamp(found.get("since"))
    if since is None:
        state = None
    return Usage(
        _whole(found.get("idleUnitSeconds")), _whole(found.get("inUseUnitSeconds")), state, since
    )


def to_status(usage: Usage) -> Obj:
    """``usage`` as ``status.usage``."""
    out: Obj = {"idleUnitSeconds": usage.idle, "inUseUnitSeconds": usage.in_use}
    if usage.state is not None:
        out["state"] = usage.state.value
    if usage.since is not None:
        out["since"] = conditions.stamp(usage.since)
    return out


def served_vmi_name(claim: Mapping[str, Any]) -> str:
    """The name of the VM instance the claim serves (``claims.user``: its owner for a
    template claim, else its attachment; ``""``: none)."""
    ref = claims.user(claim)
    return ref.name if ref is not None else ""


def state_of(claim: Mapping[str, Any], vmi: Mapping[str, Any] | None) -> State | None:
    """What the claim's units are doing now: ``None`` when it holds none (not Bound), else
    in use when ``vmi`` (the cached VMI named by :func:`served_vmi_name`) is the live VM
    instance it serves (``claims.serves_live_vmi``) and its launcher pod runs, else idle."""
    if not claims.is_bound(claim):
        return None
    phase = _mapping((vmi or {}).get("status")).get("phase")
    if phase in RUNNING_PHASES and claims.serves_live_vmi(claim, vmi):
        return State.IN_USE
    return State.IDLE


def _open_seconds(usage: Usage, now: datetime.datetime) -> float:
    if usage.state is None or usage.since is None:
        return 0.0
    return max(0.0, (now - usage.since).total_seconds())


def advance(
    usage: Usage,
    state: State | None,
    count: int,
    now: datetime.datetime,
    bound_time: datetime.datetime | None = None,
) -> Usage:
    """The usage after the claim's units turned to ``state`` at ``now`` (``usage`` itself
    when the state did not change): the open interval is closed at ``now``, in whole
    seconds, and the next one opened there.

    A hold that starts (no state before) starts at ``bound_time`` (``status.boundTime``)
    when that lies between the last change and ``now``: the time between the binding and
    this write, or all of it for a claim bound before its usage was first recorded, is
    held time too."""
    if state == usage.state:
        return usage
    moment = _second(now)
    closed = int(_open_seconds(usage, moment)) * max(count, 0)
    idle = usage.idle + (closed if usage.state is State.IDLE else 0)
    in_use = usage.in_use + (closed if usage.state is State.IN_USE else 0)
    start = moment
    if usage.state is None and state is not None and bound_time is not None:
        start = min(moment, max(_second(bound_time), usage.since or _second(bound_time)))
    return Usage(idle, in_use, state, start)


def totals(usage: Usage, count: int, now: datetime.datetime) -> Totals:
    """Unit-seconds idle and in use up to ``now``."""
    running = _open_seconds(usage, now) * max(count, 0)
    return Totals(
        usage.idle + (running if usage.state is State.IDLE else 0.0),
        usage.in_use + (running if usage.state is State.IN_USE else 0.0),
    )


def transition(
    claim: Mapping[str, Any], vmi: Mapping[str, Any] | None, now: datetime.datetime
) -> tuple[Usage, Usage, State | None] | None:
    """``(recorded usage, usage to record, state)`` of ``claim`` at ``now``, ``vmi`` being
    the cached VM instance :func:`served_vmi_name` names (None: none); None when the
    recorded usage still says what its units do. The one rule for both writers of
    ``status.usage``: the GPU-hours controller, and the binder, which records the hold's
    first interval in the binding itself (one write per bound claim less)."""
    state = state_of(claim, vmi)
    usage = read(claim)
    if state == usage.state:
        return None
    bound_time = conditions.parse_stamp(_mapping(claim.get("status")).get("boundTime"))
    return usage, advance(usage, state, orders.ordered_count(claim), now, bound_time), state


def accrued(before: Totals | None, after: Totals) -> Totals:
    """Unit-seconds a claim accrued from the reading ``before`` (``None``: none, so all of
    ``after``) to ``after``, per state; never negative (a reading from a cache behind a write
    that closed an interval may be ahead of the next one)."""
    if before is None:
        return after
    return Totals(max(0.0, after.idle - before.idle), max(0.0, after.in_use - before.in_use))


def highest(before: Totals | None, after: Totals) -> Totals:
    """The higher of two readings of one claim's totals, per state: what has been counted."""
    if before is None:
        return after
    return Totals(max(before.idle, after.idle), max(before.in_use, after.in_use))


def bound_since(claim: Mapping[str, Any], moment: datetime.datetime) -> bool:
    """Whether the claim's hold began at or after ``moment`` (``status.boundTime``)."""
    bound = conditions.parse_stamp(_mapping(claim.get("status")).get("boundTime"))
    return bound is not None and bound >= _second(moment)
