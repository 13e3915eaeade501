"""CPU percent from cumulative CPU time, the way the process, VM and microVM runtimes report it.

A runtime reads a cumulative counter (ns of CPU used); the percent is its growth since the last
reading of the same workload. Without a recent reading (the first inspect, or one older than a
minute) a short second one is taken so the figure is never a lifetime average.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class _Sample:
    at: float  # monotonic seconds
    used_ns: int
    identity: object  # what was measured (e.g. a domain id): a new one restarts the counter


class CpuSampler:
    def __init__(
        self,
        settle: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settle = settle  # the gap between two readings taken back to back
        self._clock = clock
        self._sleep = sleep
        self._samples: dict[str, _Sample] = {}

    async def percent(
        self, key: str, used_ns: int, read_again: Callable[[], Awaitable[int]], *, identity: object = None
    ) -> float:
        """100% = one full host core, the same convention as `docker stats`. `used_ns` was just
        read; `read_again` reads the counter once more when no recent sample is kept."""
        now = self._clock()
        prev = self._samples.get(key)
        if prev is None or prev.identity != identity or not 0.2 <= now - prev.at <= 60:
            prev = _Sample(now, used_ns, identity)
            await self._sleep(self._settle)
            used_ns = await read_again()
            now = self._clock()
        self._samples[key] = _Sample(now, used_ns, identity)
        return round(max(0, used_ns - prev.used_ns) / ((now - prev.at) * 1e9) * 100, 3)

    def forget(self, key: str) -> None:
        self._samples.pop(key, None)
