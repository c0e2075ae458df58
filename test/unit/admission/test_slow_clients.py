"""Slow clients hold nothing up: with 200 idle sockets (never starting TLS), 50 slowloris
connections (a header byte every half second) and 20 half-sent bodies held open, good
reviews are still answered, each within the answer deadline, none failing.

The figures (p50/p99 of the good requests, failures, how many abusive connections were
still open at the end) are printed; the test asserts only that none failed. Abusive
connections come from 127.0.0.2-4 (within the per-source limit, so they really are held),
good ones from 127.0.0.1, as the API server's would come from its own address.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from harness import abuse
from harness.webhook_world import ORDER_PATH, World, body, order

GOOD_REQUESTS = 200
CLIENTS = 2
ANSWER_DEADLINE = 5.0  # half the API server's webhook timeout


def test_good_reviews_are_answered_while_slow_clients_hold_connections(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    data = body(order())
    abusers = abuse.Abusers(
        world.target,
        idle=200,
        slowloris=50,
        half_bodies=20,
        path=ORDER_PATH,
        sources=("127.0.0.2", "127.0.0.3", "127.0.0.4"),
    )
    times: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        for _ in range(n):
            try:
                answer = abuse.post(world.target, ORDER_PATH, data, timeout=ANSWER_DEADLINE)
                ok = answer.status == 200 and json.loads(answer.body)["response"]["allowed"]
                with lock:
                    if ok:
                        times.append(answer.seconds)
                    else:
                        failures.append(f"{answer.status} {answer.body[:200]!r}")
            except OSError as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")

    try:
        held_at_start = abusers.held
        start = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(GOOD_REQUESTS // CLIENTS,))
            for _ in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.perf_counter() - start
        still_trickling = len(abusers.slow)
    finally:
        abusers.close()
    with capsys.disabled():
        print(
            f"\nslow clients: {held_at_start} abusive connections held "
            f"(setup failures {abusers.setup_failures}, slowloris still open at the end "
            f"{still_trickling}/50); {len(times)} good reviews in {elapsed:.2f}s from "
            f"{CLIENTS} clients on fresh TLS connections: "
            f"p50 {abuse.percentile(times, 50) * 1000:.1f} ms, "
            f"p99 {abuse.percentile(times, 99) * 1000:.1f} ms, "
            f"max {max(times, default=0) * 1000:.1f} ms, failures {len(failures)}"
        )
    assert abusers.setup_failures == 0 and held_at_start == 270
    assert failures == [], failures[:5]
    assert len(times) == GOOD_REQUESTS
