"""Handing complete requests to their handlers: on the event loop for the paths answered
inline, on the handler threads for the others, each through its own fair queue
(:class:`fairness.FairQueue`), with the 429 for a full queue and the 503 for an answer
not ready in time."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import h11

from gpuoperator.model import echo
from gpuoperator.runtime.serving import fairness, metrics
from gpuoperator.runtime.serving.limits import Limits
from gpuoperator.runtime.serving.routing import App, Request, Response, bounded_traceback, text


class Dispatcher:
    """The handler queues of one server and the tasks that serve them. ``run`` starts the
    tasks on the server's loop; ``answer`` waits for a request's answer; ``shutdown``
    ends the handler threads."""

    def __init__(
        self,
        name: str,
        handler: App,
        limits: Limits,
        inline: Collection[str],
        meters: metrics.Metrics,
        log: Any,
    ) -> None:
        self.name = name
        self._handler = handler
        self.limits = limits
        #: Paths answered on the event loop (small bodies only; see the package docstring).
        self._inline = frozenset(inline)
        self._meters = meters
        self._log = log
        self._executor = ThreadPoolExecutor(limits.workers, thread_name_prefix=f"http-{name}")
        #: Requests waiting for a handler on the event loop, and for a pool thread.
        self.loop_queue = fairness.FairQueue("loop", limits.max_queued)
        self.pool_queue = fairness.FairQueue("pool", limits.max_queued)
        #: (queue, source) pairs whose requests are being refused with 429 (logged once).
        self._throttled: set[tuple[str, str]] = set()

    def run(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[None]]:
        """Start serving both queues on ``loop`` (the caller cancels the tasks)."""
        for lane in (self.loop_queue, self.pool_queue):
            self._meters.queued.labels(self.name, lane.name).set_function(partial(len, lane))
        return [
            loop.create_task(self._run_inline(self.loop_queue)),
            loop.create_task(self._run_pooled(loop, self.pool_queue)),
        ]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def answer(
        self, head: h11.Request, body: bytes, source: str, loop: asyncio.AbstractEventLoop
    ) -> Response:
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in head.headers:
            key = name.decode("latin-1")
            text_value = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text_value}" if key in headers else text_value
        request = Request(
            method=head.method.decode("latin-1"),
            path=path,
            body=body,
            headers=headers,
            peer=source,
            query=query,
        )
        inline = path in self._inline and len(body) <= self.limits.small_body
        lane = self.loop_queue if inline else self.pool_queue
        job = fairness.Job(source, request, loop.create_future())
        refused = lane.push(job)
        if refused is not None:
            self._throttle(lane, refused)
        try:
            async with asyncio.timeout(self.limits.handler_timeout):
                return await job.answer
        except TimeoutError:
            lane.discard(job)
            self._log.warning(
                "request not answered in time",
                path=path,
                reason="HandlerTimeout",
                seconds=self.limits.handler_timeout,
            )
            return text(503, "the server did not answer in time; retry shortly")
        except BaseException:
            lane.discard(job)  # evicted or stopping: nobody waits for the answer any more
            raise

    def _throttle(self, lane: fairness.FairQueue, job: fairness.Job) -> None:
        """Answer ``job`` 429: its queue is full and its source has the most waiting."""
        limits = self.limits
        self._meters.throttled.labels(self.name, lane.name).inc()
        key = (lane.name, job.source)
        if key not in self._throttled:
            self._throttled.add(key)
            self._log.info(
                "handler queue full; the requests of the source with the most waiting are "
                "answered 429",
                peer=job.source,
                queue=lane.name,
                waiting=lane.waiting(job.source),
                limit=lane.capacity,
                reason="QueueFull",
            )
        refusal = Response(
            429,
            (
                f"too many requests are waiting for this server's handlers (the limit is "
                f"{lane.capacity}; {lane.waiting(job.source)} of them from "
                f"{echo.clip(job.source, 64)}); retry after {limits.retry_after}s\n"
            ).encode(),
            headers=(("Retry-After", str(limits.retry_after)),),
        )
        hold = min(limits.throttle_hold, limits.handler_timeout / 2)
        asyncio.get_running_loop().call_later(hold, settle, job.answer, refusal)

    def _dequeued(self, lane: fairness.FairQueue, job: fairness.Job) -> None:
        key = (lane.name, job.source)
        if key in self._throttled and not lane.waiting(job.source):
            self._throttled.discard(key)
            self._log.info(
                "source's requests queue again", peer=job.source, queue=lane.name, reason="Drained"
            )

    async def _run_inline(self, lane: fairness.FairQueue) -> None:
        """Answer the event loop's queue, one request at a time, in its round-robin order,
        letting the loop read and write between two."""
        while True:
            job = await lane.get()
            self._dequeued(lane, job)
            if job.answer.done():
                continue
            try:
                response = self._handler(job.request)
            except Exception as exc:  # a handler not wrapped by app(): still an answer
                response = self._failed(job.request.path, exc)
            if not job.answer.done():
                job.answer.set_result(response)
            await asyncio.sleep(0)

    async def _run_pooled(self, loop: asyncio.AbstractEventLoop, lane: fairness.FairQueue) -> None:
        """Hand the pool's queue to the handler threads, the next request in round-robin
        order whenever a thread is free."""
        free = asyncio.Semaphore(self.limits.workers)
        while True:
            await free.acquire()
            job = await lane.get()
            self._dequeued(lane, job)
            if job.answer.done():
                free.release()
                continue
            running = loop.run_in_executor(self._executor, self._handler, job.request)
            running.add_done_callback(partial(self._pooled_done, job, free))

    def _pooled_done(
        self, job: fairness.Job, free: asyncio.Semaphore, running: asyncio.Future[Response]
    ) -> None:
        free.release()
        if job.answer.done():
            return
        if running.cancelled():
            job.answer.set_result(text(503, "the server is stopping; retry shortly"))
            return
        exc = running.exception()
        if exc is None:
            job.answer.set_result(running.result())
        else:  # a handler not wrapped by app(): still an answer
            job.answer.set_result(
                self._failed(
                    job.request.path, exc if isinstance(exc, Exception) else Exception(exc)
                )
            )

    def _failed(self, path: str, exc: Exception) -> Response:
        """The answer to a request whose handler raised: logged with a bounded traceback."""
        self._log.error(
            "request handler failed",
            path=path,
            reason=type(exc).__name__,
            traceback=bounded_traceback(exc),
        )
        return text(500, "internal error")


def settle(answer: asyncio.Future[Response], response: Response) -> None:
    if not answer.done():
        answer.set_result(response)
