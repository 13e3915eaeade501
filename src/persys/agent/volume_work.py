"""The steps the scheduler hands this node for its local volumes (in heartbeat answers, until
the volume's record shows them done): carried out one at a time in the background, each
outcome kept until a report takes it to the scheduler. A step just finished or failed is not
started again for RETRY_S, though the answers keep naming it until the record changes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.volume_attach import VolumeAttacher

log = logging.getLogger(__name__)
RETRY_S = 10.0
MAX_QUEUED = 64  # steps waiting here at most (the scheduler names the rest again later)

TaskKey = tuple[str, str, str]  # (volume, op, snapshot)


def _key(t: pb.VolumeTask) -> TaskKey:
    return t.volume_id, t.op, t.snapshot


class VolumeWork:
    def __init__(self, attacher: VolumeAttacher, wake: Callable[[], None]) -> None:
        self.attacher = attacher
        self.wake = wake  # have the next report go out (it carries the results)
        self._queue: dict[TaskKey, pb.VolumeTask] = {}
        self._not_before: dict[TaskKey, float] = {}
        self._results: list[pb.VolumeTaskResult] = []
        self._runner: asyncio.Task[None] | None = None

    def offer(self, tasks: Iterable[pb.VolumeTask]) -> None:
        """Steps named by a heartbeat answer: queue those not queued, running or resting."""
        now = time.monotonic()
        for t in tasks:
            k = _key(t)
            if k in self._queue or self._not_before.get(k, 0.0) > now or len(self._queue) >= MAX_QUEUED:
                continue
            if t.op == "delete" and self.attacher.holds(t.volume_id):
                continue  # its instance is being removed here: asked again by the next answer, no rest
            self._queue[k] = t
        if self._queue and (self._runner is None or self._runner.done()):
            self._runner = asyncio.create_task(self._run(), name="agent-volume-work")

    async def _run(self) -> None:
        while self._queue:
            k, task = next(iter(self._queue.items()))
            result = await self.attacher.carry_out(task)
            del self._queue[k]
            self._not_before[k] = time.monotonic() + RETRY_S
            if result.ok:
                log.info("volume %s: %s%s done", task.volume_id, task.op, f" {task.snapshot}" if task.snapshot else "")
            else:
                log.warning("volume %s: %s failed: %s", task.volume_id, task.op, result.reason)
            self._results.append(result)
            self.wake()
        now = time.monotonic()
        self._not_before = {k: t for k, t in self._not_before.items() if t > now}

    def take_results(self) -> list[pb.VolumeTaskResult]:
        out, self._results = self._results, []
        return out

    def put_back(self, results: list[pb.VolumeTaskResult]) -> None:
        """Results whose report did not go out: sent with the next one."""
        self._results[:0] = results

    async def stop(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
