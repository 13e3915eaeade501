"""One watch's live-event buffer in the embedded store: filled on the event loop after each commit
(the worker thread posts the commit's events there) and drained by the watch's iterator."""

from __future__ import annotations

import asyncio
from collections import deque

from persys.store.base import (
    WatchEvent,
)

WATCH_QUEUE_MAX = 10_000


class Watcher:
    """Live-event buffer of one watch. Overflow (slow consumer) is not fatal: the watch
    falls back to re-reading the history table from the first missed revision."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.events: deque[WatchEvent] = deque()
        self.wakeup = asyncio.Event()
        self.overflow_from: int | None = None
        self.closed = False
        self.seen_upto = 0  # live events at or below this revision were already replayed

    def matches(self, key: str) -> bool:
        return key.encode().startswith(self.prefix)

    def push(self, batch: list[WatchEvent]) -> None:
        # Whole commits only, so a replay after overflow restarts at a revision boundary.
        if self.overflow_from is not None:
            return
        if len(self.events) + len(batch) > WATCH_QUEUE_MAX:
            self.overflow_from = batch[0].revision
        else:
            self.events.extend(batch)
        self.wakeup.set()
