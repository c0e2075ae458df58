"""Fairness by source address: the handler queues (round-robin, a new source first, the
heaviest source refused when full) and each source's turns (at most so many of its
connections handshaking or being answered at once)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass

from gpuoperator.runtime.serving import routing


@dataclass(eq=False)
class Job:
    """A complete request waiting for its handler, and where its answer goes."""

    source: str
    request: routing.Request
    answer: asyncio.Future[routing.Response]


class FairQueue:
    """Requests waiting for a handler, at most ``capacity``, served round-robin by source
    address (one request of each source with requests waiting, in turn), so however many
    requests one source queues, another's waits for one request of each source only.

    A source with no request waiting and none served in the current round is *new*: its
    request is served before the round goes on (new sources in their order of arrival),
    then the source joins the end of the round. So a source that sends a request at a
    time (the API server's, as a rule) waits for no other source's requests, and gains
    that at most once per round: a source queueing many, or sending one again as soon as
    one is answered, is served in the round like the others.

    When it is full, the request refused is the newest of the source with the most
    requests waiting (the arriving one when its source has as many): a flood refuses
    its own requests, never those of a source that queues fewer.
    """

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        #: The new sources' waiting requests (never empty), in order of arrival.
        self._new: dict[str, collections.deque[Job]] = {}
        #: The other sources' waiting requests; the dict's order is the round-robin turn. A
        #: source served stays here until its turn comes round, maybe with none waiting.
        self._old: dict[str, collections.deque[Job]] = {}
        self._size = 0
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return self._size

    def _queue(self, source: str) -> collections.deque[Job] | None:
        queue = self._new.get(source)
        return self._old.get(source) if queue is None else queue

    def waiting(self, source: str) -> int:
        queue = self._queue(source)
        return 0 if queue is None else len(queue)

    def push(self, job: Job) -> Job | None:
        """Queue ``job``; return the job refused to make room (maybe ``job``), or None."""
        refused: Job | None = None
        if self._size >= self.capacity:
            heaviest = max((*self._new.values(), *self._old.values()), key=len)
            if self.waiting(job.source) >= len(heaviest):
                return job
            refused = heaviest.pop()
            self._size -= 1
            if not heaviest:
                self._new.pop(refused.source, None)
        queue = self._queue(job.source)
        if queue is None:
            queue = self._new[job.source] = collections.deque()
        queue.append(job)
        self._size += 1
        self._ready.set()
        return refused

    def discard(self, job: Job) -> None:
        """Forget ``job`` (its connection stopped waiting for it)."""
        queue = self._queue(job.source)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(job)
            self._size -= 1
        if not queue:
            self._new.pop(job.source, None)

    async def get(self) -> Job:
        """The next job: a new source's, else the next in round-robin order; waits for one."""
        while not self._size:
            self._old.clear()  # every source's turn has come: all are new again
            self._ready.clear()
            await self._ready.wait()
        if self._new:
            source = next(iter(self._new))
            queue = self._new.pop(source)
        else:
            while True:  # a source with none waiting when its turn comes leaves the round
                source = next(iter(self._old))
                queue = self._old.pop(source)
                if queue:
                    break
        job = queue.popleft()
        self._size -= 1
        self._old[source] = queue  # to the end of the round
        return job


class Turns:
    """The turns of one source address: at most ``limit`` of its connections handshake or
    have a request in progress at once (from the request's first byte to its answer
    written); the others wait, first come first served, their requests not yet parsed.

    A flood from one address therefore puts at most ``limit`` requests at a time before
    the event loop, however many connections it holds: every other source's handshake,
    request and answer waits behind that many of the flood's steps, not behind all of
    them. Invariant: ``active <= limit``; a waiter is granted its turn (``active`` counted
    for it) before it is woken, so a waiter cancelled after its grant gives the turn back.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def idle(self) -> bool:
        return not self.active and not self._waiters

    def free(self) -> bool:
        """A turn is free now (``acquire`` will not wait)."""
        return self.active < self.limit and not self._waiters

    async def acquire(self) -> None:
        """Take a turn, waiting for one; the caller must ``release`` it."""
        if self.free():
            self.active += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted, then cancelled before it ran: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a turn back: to the oldest waiter, or to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on: ``active`` stays
                return
        self.active -= 1
