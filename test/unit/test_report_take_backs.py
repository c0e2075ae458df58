"""``gpuoperator status`` beside preemptible classes: for a guaranteed class whose oldest
waiting order fits nowhere, the take-back the preemption rules choose (idle spot holds
first, a running spot VM only when they are not enough), or that nothing would do; no
section when nothing waits or no class is preemptible."""

from __future__ import annotations

import datetime

from gpuoperator import names, report
from gpuoperator.ledger import Ledger
from gpuoperator.model import claim_states
from gpuoperator.runtime.clock import FakeClock
from harness import objects

NOW = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
HEADER = "TAKE-BACKS (guaranteed orders that fit only on preemptible units)"
PROTECTED = [names.CLAIM_PROTECTION_FINALIZER]
Obj = objects.Obj


def _bound(name: str, cls: str, count: int, at: str, attached: Obj | None = None) -> Obj:
    claim = objects.claim(name, class_name=cls, count=count, finalizers=PROTECTED)
    claim["status"] = {**claim_states.bound(claim, "n1", NOW), "boundTime": at}
    if attached is not None:
        claim["status"]["attachment"] = attached
    return claim


def _report(order_count: int, *, spot: bool = True) -> str:
    guaranteed = objects.gpuclass("a10")
    spot_class = objects.gpuclass("a10-spot", preemptible=spot)
    idle = _bound("idle", "a10-spot", 2, "2026-01-01T10:00:00Z")
    running = _bound(
        "serving", "a10-spot", 2, "2026-01-01T09:00:00Z", attached={"vmi": "vm1", "uid": "uid-vm1"}
    )
    order = objects.claim(
        "order", class_name="a10", count=order_count, finalizers=PROTECTED, phase="Pending"
    )
    vm = objects.vmi("vm1", phase="Running")
    ledger = Ledger()
    ledger.load(
        nodes=[objects.node("n1", 4)],
        classes=[guaranteed, spot_class],
        claims=[idle, running, order],
        pods=[],
    )
    classes = {"a10": guaranteed, "a10-spot": spot_class}
    return report.catalog(ledger, classes, {(objects.NS, "vm1"): vm}, clock=FakeClock(NOW))


def _rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    assert HEADER in lines, text
    return [line.split() for line in lines[lines.index(HEADER) + 2 :]]


def test_an_order_that_idle_spot_holds_make_room_for_takes_only_those() -> None:
    rows = _rows(_report(2))
    assert rows == [["a10", f"{objects.NS}/order", "n1", f"{objects.NS}/idle", "(idle)", "2", "0"]]


def test_an_order_that_needs_a_running_spot_vm_says_it_stops_one() -> None:
    rows = _rows(_report(4))
    assert rows == [
        [
            "a10",
            f"{objects.NS}/order",
            "n1",
            f"{objects.NS}/idle",
            "(idle),",
            f"{objects.NS}/serving",
            "(VM",
            "running)",
            "4",
            "1",
        ]
    ]


def test_an_order_no_take_back_makes_fit_is_said_to_fit_nowhere() -> None:
    rows = _rows(_report(5))
    assert rows == [
        ["a10", f"{objects.NS}/order", "-", "nothing", "would", "make", "it", "fit", "-", "-"]
    ]


def test_without_a_preemptible_class_there_is_no_take_back_section() -> None:
    assert HEADER not in _report(2, spot=False).splitlines()
