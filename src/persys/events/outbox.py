"""The scheduler's side of the event bus: a bounded queue and the task that publishes it.

Emitting never blocks and never fails the caller (events are observability). What cannot be
published, because the queue is full or the bus is down, is counted in a `LossLedger`; the
first publish that succeeds afterwards carries an `EventsLost` gap event ahead of the new
events, so a reader of the stream sees where and how much is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from persys.events.base import ClusterEvent, EventBus
from persys.events.loss import BUS_DOWN, QUEUE_FULL, LossLedger, gap_event

log = logging.getLogger(__name__)

BATCH = 500


class EventOutbox:
    def __init__(self, bus: EventBus, source: str, *, maxsize: int = 10_000, retry_gap_seconds: float = 1.0,
                 log_interval: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.source = source  # the replica whose losses these are
        self.ledger = LossLedger(log_interval=log_interval)
        self.retry_gap_seconds = retry_gap_seconds
        self.clock = clock
        self._q: asyncio.Queue[ClusterEvent] = asyncio.Queue(maxsize=maxsize)

    @property
    def depth(self) -> int:
        """Events waiting to be published."""
        return self._q.qsize()

    def emit(self, event: ClusterEvent) -> None:
        try:
            self._q.put_nowait(event)
        except asyncio.QueueFull:  # dropping beats blocking scheduling, but it is counted
            self._lost([event], QUEUE_FULL)

    def _lost(self, events: list[ClusterEvent], cause: str) -> None:
        n = self.ledger.record(events, cause, self.clock())
        if n:
            log.warning("events: %d lost (%s), %d since start; an %s event will say so once published",
                        n, cause, self.ledger.total, "EventsLost")

    async def run(self) -> None:
        while True:
            batch: list[ClusterEvent] = []
            if self.ledger.pending.count:
                # A gap is waiting: retry it even if nothing new is emitted.
                try:
                    batch.append(await asyncio.wait_for(self._q.get(), self.retry_gap_seconds))
                except TimeoutError:
                    pass
            else:
                batch.append(await self._q.get())
            while len(batch) < BATCH and not self._q.empty():
                batch.append(self._q.get_nowait())
            await self.publish(batch)

    async def publish(self, batch: list[ClusterEvent]) -> None:
        """One publishing pass: the pending gap event (if any) first, then `batch`."""
        span = self.ledger.take()
        out = ([gap_event(span, self.source)] if span else []) + batch
        if not out:
            return
        try:
            ids = await self.bus.publish_many(out)
        except Exception as err:  # a backend bug must not kill the publisher: count it as loss
            log.debug("events: publish failed: %s", err)
            ids = [""] * len(out)
        if span is not None:
            if ids[0]:
                log.info("events: published a gap event for %d lost events", span.count)
            else:
                self.ledger.restore(span)
            ids = ids[1:]
        lost = [e for e, i in zip(batch, ids, strict=True) if not i]
        if lost:
            self._lost(lost, BUS_DOWN)
