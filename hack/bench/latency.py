"""Latency under a steady stream: objects created at a fixed rate (open loop: each at its
own time, whatever the ones before it took), and the time from each one's create answered
to the moment a watch saw it done (a claim Bound, a pod scheduled).

The suite streams orders to the operator and pods of the same shape to a kube-scheduler
on their own pool at the same rate for the same time, one after the other, and prints the
two p50s and p99s side by side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping


def due(i: int, rate: float) -> float:
    """Seconds after the stream's start at which object ``i`` is created."""
    return i / rate


def stream(
    total: int,
    rate: float,
    create: Callable[[int], str],
    threads: int = 4,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, float]:
    """Create ``total`` objects at ``rate`` per second from ``threads`` threads (enough that
    a slow create does not hold back the next one); ``create(i)`` returns the object's
    name. Returns each name's create-answered time on ``clock``."""
    start = clock()
    created: dict[str, float] = {}
    lock = threading.Lock()
    counter = iter(range(total))
    failures: list[BaseException] = []

    def worker() -> None:
        while not failures:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            wait = start + due(i, rate) - clock()
            if wait > 0:
                sleep(wait)  # the stream's own pace (open loop)
            try:
                name = create(i)
            except BaseException as exc:
                failures.append(exc)
                return
            at = clock()
            with lock:
                created[name] = at

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failures:
        raise failures[0]
    return created


def latencies(created: Mapping[str, float], done: Mapping[str, float]) -> list[float]:
    """Seconds from created to done for each object that got done. An object seen done
    before its create was answered (the watch can be faster than the answer) counts 0."""
    return [max(0.0, done[n] - t) for n, t in created.items() if n in done]


def achieved_rate(created: Mapping[str, float]) -> float:
    """Creates per second the stream achieved, first to last."""
    times = sorted(created.values())
    if len(times) < 2 or times[-1] == times[0]:
        return float("nan")
    return (len(times) - 1) / (times[-1] - times[0])
