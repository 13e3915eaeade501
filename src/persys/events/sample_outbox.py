"""The publishing side of the meter's samples: a bounded queue and the task that drains it in
batches onto the SampleBus. `offer` never blocks and never raises (a report must not wait for
telemetry); what a full queue or a down bus loses is counted, and health shows it."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from persys.events.samples import MAX_BATCH, Sample, SampleBus

log = logging.getLogger(__name__)


@dataclass
class SampleCounts:
    published: int = 0
    dropped_full: int = 0  # the queue was full
    dropped_bus: int = 0  # the bus refused or was down


class SampleOutbox:
    def __init__(self, bus: SampleBus, *, maxsize: int = 100_000, batch: int = MAX_BATCH) -> None:
        self.bus = bus
        self.maxsize = maxsize
        self.batch = batch
        self.counts = SampleCounts()
        self._q: deque[Sample] = deque()
        self._ready = asyncio.Event()

    @property
    def queued(self) -> int:
        return len(self._q)

    def offer(self, samples: Iterable[Sample]) -> None:
        for s in samples:
            if len(self._q) >= self.maxsize:
                self.counts.dropped_full += 1
                continue
            self._q.append(s)
        if self._q:
            self._ready.set()

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._q:
                n = min(self.batch, len(self._q))
                await self.publish([self._q.popleft() for _ in range(n)])

    async def publish(self, batch: list[Sample]) -> None:
        try:
            ok = await self.bus.publish(batch)
        except Exception as err:  # a backend bug must not kill the publisher: count it as loss
            log.debug("samples: publish failed: %s", err)
            ok = False
        if ok:
            self.counts.published += len(batch)
        else:
            if not self.counts.dropped_bus:
                log.warning("samples: the sample bus refused a batch; samples are dropped until it is back")
            self.counts.dropped_bus += len(batch)

    def health(self) -> dict[str, int]:
        c = self.counts
        return {"queued": self.queued, "published": c.published, "droppedQueueFull": c.dropped_full,
                "droppedBusDown": c.dropped_bus}
