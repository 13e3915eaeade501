"""An opt-in watchdog that names what held the event loop whenever it stalls.

Everything the scheduler does runs on one asyncio loop, so any step that holds it (a long
computation, a garbage collection, a blocking call) delays every heartbeat, report and decision
behind it. Latency figures show that it happened, not what did it. The watchdog is a small task
that ticks every few milliseconds and a thread that, when the ticks stop for longer than the
threshold, records the loop thread's stack once; when the loop runs again the stall is logged
with its length and that stack. It costs a wake-up every `tick` seconds plus the thread's polls,
which is why it is off unless asked for (`persys scheduler --stall-log-ms`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stall:
    seconds: float
    stack: str  # the loop thread's stack when the stall was noticed


class StallWatchdog:
    def __init__(self, threshold_seconds: float, tick_seconds: float = 0.002, stack_depth: int = 24) -> None:
        if threshold_seconds <= 0:
            raise ValueError("the stall threshold must be positive")
        self.threshold = threshold_seconds
        self.tick = min(tick_seconds, threshold_seconds / 4)
        self.depth = stack_depth
        self.stalls = 0
        self.longest = 0.0
        self._last_tick = time.monotonic()
        self._noticed: str | None = None  # the stack recorded for the stall in progress
        self._loop_thread = 0
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Call from the loop to be watched."""
        self._loop_thread = threading.get_ident()
        self._last_tick = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._ticker(), name="stall-watchdog")
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 1.0)

    async def _ticker(self) -> None:
        while True:
            now = time.monotonic()
            stack, self._noticed = self._noticed, None
            if stack is not None and now - self._last_tick >= self.threshold:
                self._report(Stall(now - self._last_tick, stack))
            self._last_tick = now
            await asyncio.sleep(self.tick)

    def _report(self, stall: Stall) -> None:
        self.stalls += 1
        self.longest = max(self.longest, stall.seconds)
        log.warning("event loop stalled for %.1f ms; it was running:\n%s", stall.seconds * 1000, stall.stack)

    def _watch(self) -> None:
        last_seen = 0.0
        while not self._stop.wait(self.tick):
            tick = self._last_tick
            if tick != last_seen and time.monotonic() - tick > self.threshold:
                last_seen = tick  # one stack per stall
                frame = sys._current_frames().get(self._loop_thread)
                self._noticed = "".join(traceback.format_stack(frame, limit=self.depth)) if frame else "(unknown)"
