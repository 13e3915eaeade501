"""Embedded EventBus: a bounded in-process ring buffer (no persistence)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence

from persys.events.base import ClusterEvent, parse_id


class MemoryEventBus:
    def __init__(self, maxlen: int = 10_000) -> None:
        self.maxlen = maxlen
        self._buf: deque[tuple[tuple[int, int], ClusterEvent]] = deque(maxlen=maxlen)
        self._last = (0, 0)
        # Replaced on every publish; subscribers wait on the one current when they looked.
        self._changed = asyncio.Event()
        self._closed = False

    def _next_id(self) -> tuple[int, int]:
        ms = int(time.time() * 1000)
        # Same ms (or a clock step backwards): keep the ms, bump the sequence -> monotonic.
        self._last = (ms, 0) if ms > self._last[0] else (self._last[0], self._last[1] + 1)
        return self._last

    async def publish(self, event: ClusterEvent) -> str:
        if self._closed:
            return ""
        key = self._next_id()
        ev = dataclasses.replace(event, id=f"{key[0]}-{key[1]}")
        self._buf.append((key, ev))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return ev.id

    async def publish_many(self, events: Sequence[ClusterEvent]) -> list[str]:
        return [await self.publish(e) for e in events]

    async def recent(self, limit: int = 100, subject: str | None = None) -> list[ClusterEvent]:
        out: list[ClusterEvent] = []
        for _, ev in reversed(self._buf):
            if len(out) >= limit:
                break
            if subject is None or ev.subject == subject:
                out.append(ev)
        out.reverse()
        return out

    def _after(self, key: tuple[int, int]) -> list[ClusterEvent]:
        # Scan from the newest end: a live subscriber only has a few new events to pick up.
        out: list[ClusterEvent] = []
        for k, ev in reversed(self._buf):
            if k <= key:
                break
            out.append(ev)
        out.reverse()
        return out

    async def subscribe(self, since_id: str | None = None) -> AsyncIterator[ClusterEvent]:
        cursor = parse_id(since_id) if since_id else self._last
        while not self._closed:
            changed = self._changed
            batch = self._after(cursor)
            if not batch:
                await changed.wait()
                continue
            for ev in batch:
                cursor = parse_id(ev.id)
                yield ev

    async def bounds(self) -> tuple[str | None, str | None]:
        if not self._buf:
            return None, None
        return self._buf[0][1].id, self._buf[-1][1].id

    async def healthy(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True
        self._changed.set()
