"""The meter where it runs (inside a scheduler process: `persys scheduler --meter ...`): the store,
the ingester and the maintenance loop (rollups, retention), and the figures health shows. Its
tasks are its own: a meter that fails or falls behind never touches scheduling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from persys.events.samples import SampleBus
from persys.meter.base import MeterStore
from persys.meter.ingester import Ingester

log = logging.getLogger(__name__)

MAINTAIN_EVERY = 30.0
BEHIND_SECONDS = 60.0  # samples older than this when stored, or a backlog: health says "behind"
BEHIND_ENTRIES = 100


class Meter:
    def __init__(self, store: MeterStore, bus: SampleBus, consumer: str, *,
                 may_maintain: Callable[[], bool] = lambda: True, maintain_every: float = MAINTAIN_EVERY,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.bus = bus
        self.ingester = Ingester(bus, store, consumer, clock=clock)
        self.may_maintain = may_maintain  # ClickHouse shared by replicas: only the active one rolls up
        self.maintain_every = maintain_every
        self.clock = clock
        self.last_maintenance = 0.0
        self.maintenance_error = ""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.ingester.run(), name="meter-ingester"),
                       asyncio.create_task(self._maintain_loop(), name="meter-maintenance")]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.store.close()
        await self.bus.close()

    async def _maintain_loop(self) -> None:
        while True:
            await asyncio.sleep(self.maintain_every)
            if not self.may_maintain():
                continue
            try:
                await self.store.maintain(self.clock())
                self.last_maintenance, self.maintenance_error = self.clock(), ""
            except Exception as err:
                self.maintenance_error = f"{type(err).__name__}: {err}"[:300]
                log.warning("meter: rollup/retention failed: %s", self.maintenance_error)

    def status(self) -> dict[str, Any]:
        st, ing = self.ingester.stats, self.ingester
        behind = ing.backlog > BEHIND_ENTRIES or st.lag_seconds > BEHIND_SECONDS
        problems = [p for p in (
            f"ingest behind: {ing.backlog} entries waiting, last batch {st.lag_seconds:.0f}s old" if behind else "",
            st.last_error,  # says whether the store or the sample bus failed
            f"maintenance: {self.maintenance_error}" if self.maintenance_error else "") if p]
        return {"engine": self.store.engine, "ok": not problems, "detail": "; ".join(problems),
                "ingestedSamples": st.samples, "backlogEntries": ing.backlog, "lagSeconds": round(st.lag_seconds, 3),
                "maxLagSeconds": round(st.max_lag_seconds, 3), "writeFailures": st.write_failures,
                "readFailures": st.read_failures,
                "lastMaintenance": self.last_maintenance}
