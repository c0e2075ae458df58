"""Fairness by source: waiting requests are served round-robin by source, a new source
first but only once a round; a turn granted to a cancelled waiter is passed on."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

from gpuoperator.runtime import serving
from gpuoperator.runtime.serving import fairness
from harness.http_peers import answer_of, gated_server, queued
from harness.waiting import wait_for


def test_waiting_requests_are_served_round_robin_by_source_a_new_source_first() -> None:
    with gated_server(serving.Limits(workers=1)) as gated:

        def send(source: str, who: str) -> None:
            gated.send(source, f"GET /slow HTTP/1.1\r\nHost: x\r\nX-Who: {who}\r\n\r\n".encode())

        send("127.0.0.2", "a1")
        assert gated.gate.entered.acquire(timeout=5)
        for n, (source, who) in enumerate(
            [("127.0.0.2", "a2"), ("127.0.0.2", "a3"), ("127.0.0.2", "a4"), ("127.0.0.1", "b1")],
            start=1,
        ):
            send(source, who)
            wait_for(f"{n} queued", partial(queued, gated.registry, "pool"), until=float(n).__eq__)
        gated.gate.release.set()
        for sock in gated.socks:
            assert answer_of(sock).startswith(b"HTTP/1.1 200")
        # First come first served would answer b1 last, after every request of a; b, a
        # source with none waiting, goes before a's round.
        assert gated.gate.order == ["a1", "b1", "a2", "a3", "a4"]


def test_a_new_source_goes_first_once_per_round_not_every_time_it_is_answered() -> None:
    async def order() -> list[str]:
        lane = fairness.FairQueue("test", 10)
        loop = asyncio.get_running_loop()

        def push(source: str, name: str) -> None:
            request = serving.Request("GET", "/", headers={"x-who": name})
            assert lane.push(fairness.Job(source, request, loop.create_future())) is None

        async def next_one() -> str:
            return (await lane.get()).request.headers["x-who"]

        served = []
        for name in ("a1", "a2", "a3"):
            push("a", name)
        served.append(await next_one())
        push("b", "b1")  # new: before a's round goes on
        served.append(await next_one())
        push("b", "b2")  # b was just served: it waits for its turn in the round
        served += [await next_one() for _ in range(3)]
        return served

    assert asyncio.run(order()) == ["a1", "b1", "a2", "b2", "a3"]


def test_a_turn_granted_to_a_waiter_cancelled_before_it_ran_is_passed_on() -> None:
    async def scenario() -> tuple[int, bool]:
        turns = fairness.Turns(1)
        await turns.acquire()
        cancelled = asyncio.ensure_future(turns.acquire())
        after = asyncio.ensure_future(turns.acquire())
        await asyncio.sleep(0)  # one step of the loop: both wait
        assert turns.waiting == 2
        turns.release()  # granted to the first waiter...
        cancelled.cancel()  # ...which is cancelled before it runs: the turn goes on
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        await after
        active = turns.active
        turns.release()
        return active, turns.idle()

    assert asyncio.run(scenario()) == (1, True)
