"""Garbage collection for a process whose state is a large, long-lived in-memory mirror.

CPython's cyclic collector now and then walks every object it tracks. A scheduler mirroring tens
of thousands of workloads holds millions of objects, and a full collection then stops the whole
process, interpreter lock held, for a second or more: long enough to answer heartbeats late and,
with a short lease, to lose leadership. Nearly all of that state lives as long as the process (a
document is replaced, never mutated, and the old one is freed by reference counting: documents
hold no cycles), so it is moved out of the collector's sight with `gc.freeze()` as it
accumulates; collections then look at young objects only. Pauses that still exceed a threshold are
logged, so an operator can see them.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)
YOUNG_THRESHOLD = 50_000


class HeapGuard:
    def __init__(self, freeze_every_seconds: float = 1.0, warn_pause_seconds: float = 0.25) -> None:
        self.freeze_every = freeze_every_seconds
        self.warn_pause = warn_pause_seconds
        self.longest_pause = 0.0
        self._last_freeze = 0.0
        self._started = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        # Young collections every 700 allocations (the default) are thousands per second at this
        # allocation rate; each also promotes work towards a full collection.
        if gc.get_threshold()[0] < YOUNG_THRESHOLD:
            gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def tick(self) -> None:
        """Call periodically (every second or so): moves what survived since the last freeze out of
        the collector's way, so a full collection only ever walks about a second's worth of
        objects. The price: cyclic garbage that happens to be alive at that instant (rare: the
        mirror's documents hold no cycles) is never collected."""
        now = time.monotonic()
        if now - self._last_freeze >= self.freeze_every:
            self._last_freeze = now
            gc.freeze()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.longest_pause = max(self.longest_pause, pause)
        if pause >= self.warn_pause:
            log.warning("garbage collection (generation %s) paused the process for %.2f s; %d objects frozen",
                        info.get("generation"), pause, gc.get_freeze_count())
