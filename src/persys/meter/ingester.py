"""The meter's ingester: consumes the sample bus as a consumer group, writes batches to the store
off the event loop, acknowledges what is stored. A store that fails keeps the entries
unacknowledged (retried with backoff, redelivered to the next ingester after a restart); how far
behind it is shows in health (backlog, lag) rather than silently."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from persys.events.samples import Delivery, SampleBus
from persys.meter.base import MeterStore

log = logging.getLogger(__name__)

READ_ENTRIES = 50  # bus entries per read (each a batch of up to MAX_BATCH samples)


@dataclass
class BusReadError(Exception):
    """Reading the sample bus failed (Redis down, or refusing): not a store failure."""


class IngestStats:
    samples: int = 0
    batches: int = 0
    write_failures: int = 0
    read_failures: int = 0  # the sample bus could not be read (Redis down, its group lost)
    last_error: str = ""
    lag_seconds: float = 0.0  # age of the oldest sample of the last batch when it was stored
    max_lag_seconds: float = 0.0
    newest: float = 0.0  # newest sample timestamp stored


class Ingester:
    def __init__(self, bus: SampleBus, store: MeterStore, consumer: str, *,
                 clock: Callable[[], float] = time.time, block_ms: int = 1000) -> None:
        self.bus = bus
        self.store = store
        self.consumer = consumer
        self.clock = clock
        self.block_ms = block_ms
        self.stats = IngestStats()
        self.backlog = 0  # bus entries not yet delivered (last look)
        self._unstored: list[Delivery] = []  # read but not stored (the store failed): written again first

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self.step()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the store or the bus is down: retry, never give up
                st = self.stats
                if isinstance(err, BusReadError):
                    st.read_failures += 1
                    failures, st.last_error = st.read_failures, str(err)[:300]
                else:
                    st.write_failures += 1
                    failures, st.last_error = st.write_failures, f"store: {type(err).__name__}: {err}"[:300]
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("meter: ingest failed (%d so far), retrying: %s", failures, st.last_error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def step(self) -> int:
        """One read, write and acknowledgement; returns the samples stored."""
        try:
            got = self._unstored or await self.bus.read(self.consumer, READ_ENTRIES, self.block_ms)
        except Exception as err:  # named as the bus's failure, not the store's
            raise BusReadError(f"sample bus: {type(err).__name__}: {err}") from err
        if not got:
            self.backlog = max(0, await self.bus.backlog())
            return 0
        samples = [s for d in got for s in d.samples]
        self._unstored = got
        if samples:
            await self.store.write(samples)
        self._unstored = []
        await self.bus.ack([d.id for d in got])
        st = self.stats
        now = self.clock()
        if samples:
            st.lag_seconds = max(0.0, now - min(s.ts for s in samples))
            st.max_lag_seconds = max(st.max_lag_seconds, st.lag_seconds)
            st.newest = max(st.newest, max(s.ts for s in samples))
        st.samples += len(samples)
        st.batches += 1
        st.last_error = ""
        if len(got) == READ_ENTRIES or st.batches % 20 == 0:
            self.backlog = max(0, await self.bus.backlog())
        return len(samples)
