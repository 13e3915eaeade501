"""The in-process SampleBus (`persys dev`, tests): a bounded ring with one consumer group, read
like a Redis one: entries go to one reader each, and what a reader left unacknowledged comes
back to it when it starts reading again (`forget_reader`, as after a restart)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from persys.events.samples import Delivery, Sample


class MemorySampleBus:
    def __init__(self, maxlen: int = 10_000) -> None:
        self._ring: deque[tuple[int, list[Sample]]] = deque(maxlen=maxlen)
        self._seq = 0
        self._delivered = 0  # the group's cursor: the last seq handed out
        self._pending: dict[int, tuple[str, list[Sample]]] = {}  # delivered, not acknowledged: seq -> consumer
        self._readers: set[str] = set()
        self._new = asyncio.Event()
        self.trimmed = 0  # entries the ring dropped before anyone read them

    async def publish(self, batch: Sequence[Sample]) -> bool:
        if len(self._ring) == self._ring.maxlen and self._ring[0][0] > self._delivered:
            self.trimmed += 1
        self._seq += 1
        self._ring.append((self._seq, list(batch)))
        self._new.set()
        return True

    async def read(self, consumer: str, count: int = 50, block_ms: int = 1000) -> list[Delivery]:
        if consumer not in self._readers:  # a (re)started reader first gets what it left unacknowledged
            self._readers.add(consumer)
            own = [Delivery(str(i), s) for i, (c, s) in sorted(self._pending.items()) if c == consumer][:count]
            if own:
                return own
        if not any(seq > self._delivered for seq, _ in self._ring):
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), block_ms / 1000)
            except TimeoutError:
                return []
        out = [(seq, s) for seq, s in self._ring if seq > self._delivered][:count]
        for seq, s in out:
            self._pending[seq] = (consumer, s)
        if out:
            self._delivered = out[-1][0]
        return [Delivery(str(seq), s) for seq, s in out]

    def forget_reader(self, consumer: str) -> None:
        self._readers.discard(consumer)

    async def ack(self, ids: Sequence[str]) -> None:
        for i in ids:
            self._pending.pop(int(i), None)

    async def backlog(self) -> int:
        return sum(1 for seq, _ in self._ring if seq > self._delivered)

    async def close(self) -> None:
        return None
