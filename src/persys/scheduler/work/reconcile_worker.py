"""The reconcile worker: it drains a de-duplicating queue of workload ids in batches, applies
each workload's plan (decide/reconcile.py decides; `write` commits), then places what needs a node in
one engine pass and commits the placements concurrently (work/placer.py). A worker that
ends unexpectedly is restarted (after a doubling delay when it keeps failing) and says so in
health. Reads the replica through the narrow `WorkerShell` protocol."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from persys.scheduler.decide import step
from persys.scheduler.decide.effects import Need
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.rules import failures
from persys.scheduler.work.placer import Placer
from persys.scheduler.work.shell import Shell, interpreter_for
from persys.scheduler.work.worker_watch import WorkerWatch
from persys.store.base import StoreUnavailable

log = logging.getLogger(__name__)
FROZEN_PAUSE_SECONDS = 0.2
STORE_RETRY_SECONDS = 1.0


class WorkerShell(Shell, Protocol):
    worker_watch: WorkerWatch

    @property
    def is_active(self) -> bool: ...
    @property
    def active_tasks(self) -> list[asyncio.Task[Any]]: ...
    def runs_on(self, inst: str, node_id: str) -> bool: ...
    def enqueue_all(self) -> None: ...


class ReconcileWorker:
    def __init__(self, shell: WorkerShell, placer: Placer) -> None:
        self.s = shell
        self.placer = placer
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        self.backlog_low = asyncio.Event()  # the backlog is short enough for bulk applies
        self.interpreter = interpreter_for(shell)

    def enqueue(self, wid: str) -> None:
        if wid not in self.queued:
            self.queued.add(wid)
            self.queue.put_nowait(wid)

    async def admit(self) -> None:
        """Hold a bulk apply while this (active) replica's reconcile backlog is long, for at most
        a while: taking work faster than it is placed only grows memory and latency, and a
        saturated replica answers heartbeats and reports late."""
        if not self.s.is_active or len(self.queued) <= self.s.config.max_backlog:
            return
        self.backlog_low.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.backlog_low.wait(), self.s.config.admission_wait_seconds)

    async def _batch(self) -> list[str]:
        batch = [await self.queue.get()]
        while len(batch) < self.s.config.batch_size and not self.queue.empty():
            batch.append(self.queue.get_nowait())
        for wid in batch:
            self.queued.discard(wid)
        if len(self.queued) <= self.s.config.max_backlog:
            self.backlog_low.set()
        return batch

    async def run(self, delay: float = 0.0) -> None:
        """Drain the queue in batches. `delay`: wait that long first (a restart after repeated
        failures backs off)."""
        if delay > 0:
            log.warning("restarting the reconcile worker in %.1f s", delay)
            await asyncio.sleep(delay)
        while True:
            # Yield once per batch: a queue that is never empty (a write refused at once, e.g. by
            # the leader fence of a replica being deposed, requeues its workload) would otherwise
            # hold the loop forever, and the cancel that deposes this worker could never land.
            await asyncio.sleep(0)
            batch = await self._batch()
            if self.s.guard.mode != Mode.NORMAL:
                # Frozen: decide nothing. Everything is re-enqueued when the mode returns to normal.
                await asyncio.sleep(FROZEN_PAUSE_SECONDS)
                continue
            needs: list[Need] = []
            m = self.s.metrics
            for wid in batch:
                try:
                    with m.reconcile_seconds.time():
                        needs += await self.reconcile(wid)
                    m.reconciles.inc(("ok",))
                except StoreUnavailable as err:
                    m.reconciles.inc(("store_unavailable",))
                    log.warning("store unavailable while reconciling %s: %s", wid, err)
                    await asyncio.sleep(STORE_RETRY_SECONDS)
                    self.enqueue(wid)
                except Exception as err:
                    m.reconciles.inc(("error",))
                    log.exception("reconcile of %s failed", wid)
                    await self.placer.mark_failed(wid, None, failures.INTERNAL_ERROR, err)
            if needs:
                await self.placer.place_isolated(needs)

    def start(self, delay: float = 0.0) -> asyncio.Task[None]:
        task = asyncio.create_task(self.run(delay), name="reconcile-worker")
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The worker only ends when cancelled (deposed, stopping). Should it end otherwise, say
        so in health and start another: one bug must not stop all scheduling."""
        active = self.s.active_tasks
        if task.cancelled() or task not in active:
            return
        err = task.exception()
        why = failures.describe(err) if err is not None else "returned"
        log.error("reconcile worker ended unexpectedly (%s); restarting it", why, exc_info=err)
        self.s.worker_watch.failed(why, self.s.clock())
        active.remove(task)
        if self.s.is_active:
            active.append(self.start(self.s.worker_watch.restart_delay()))
            self.s.enqueue_all()  # the batch it held is lost: look at everything again

    async def reconcile(self, wid: str) -> list[Need]:
        """Converge one workload: the step decides, the interpreter writes; returns the instances
        that need a node."""
        ctx = step.Context(time.time(), self.s.runs_on, self.placer.inflight, self.s.config.stop_relocation_delay())
        return await self.interpreter.run(step.on_changes(self.s.state, [wid], ctx))
