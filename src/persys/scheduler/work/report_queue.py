"""The reports of one update stream, persisted in order by their own task.

An agent's heartbeats and reports share one StreamUpdates call. Persisting a report waits on the
store (status writes) and sometimes on the event bus; a heartbeat's acknowledgement must not
wait behind that, or a replica that is merely slow to write looks dead to its agents, which then
leave it (issue #31: "acknowledged nothing for 6.0s"). So heartbeats are answered on receipt and
reports go here: one task per stream takes them in arrival order (a partial report builds on the
previous one, so order matters). The queue is bounded; past `MAX_QUEUED` the stream's reader
waits (the old back-pressure), which takes minutes of a stalled store at one report per 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
MAX_QUEUED = 64  # reports per stream awaiting persistence (about two minutes of them)


class ReportQueue(Generic[T]):
    def __init__(self, persist: Callable[[T], Awaitable[None]], max_queued: int = MAX_QUEUED) -> None:
        self._persist = persist
        self._queue: asyncio.Queue[T] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    async def put(self, report: T) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="report-queue")
        await self._queue.put(report)

    def raise_failure(self) -> None:
        """Re-raise the error that stopped persisting (the stream then ends with its status)."""
        if self._failure is not None:
            raise self._failure

    async def _run(self) -> None:
        while True:
            report = await self._queue.get()
            try:
                await self._persist(report)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # handed to the stream, which maps it to a status
                self._failure = err
                return
            finally:
                self._queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued report is persisted (the agent closed the stream), then
        re-raise a failure if persisting stopped."""
        if self._task is not None and not self._task.done():
            done = asyncio.ensure_future(self._queue.join())
            await asyncio.wait({done, self._task}, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
        self.raise_failure()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
