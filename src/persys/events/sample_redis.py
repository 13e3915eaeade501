"""SampleBus on a Redis Stream of its own (`persys:samples`, bounded with MAXLEN ~): one XADD per
batch, read by the meter's ingesters as the consumer group `persys-meter` (XREADGROUP, XACK), so
an ingester that restarts resumes after the last entry it acknowledged; entries another consumer
left unacknowledged for a minute are claimed (XAUTOCLAIM). The Redis user needs, besides the
event bus's commands: +xgroup|create +xreadgroup +xack +xautoclaim +xinfo|groups (docs/observability.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from persys.events.samples import Delivery, Sample, decode, encode

log = logging.getLogger(__name__)

STREAM = "persys:samples"
GROUP = "persys-meter"
CLAIM_IDLE_MS = 60_000  # an entry unacknowledged this long belongs to an ingester that died


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisSampleBus:
    def __init__(self, client: aioredis.Redis, *, stream: str = STREAM, maxlen: int = 20_000) -> None:
        self._r = client
        self.stream = stream
        self.maxlen = maxlen  # entries (batches of up to MAX_BATCH samples each)
        self._group_ready = False
        self._own_checked = False

    async def publish(self, batch: Sequence[Sample]) -> bool:
        try:
            await self._r.xadd(self.stream, {"b": encode(batch)}, maxlen=self.maxlen, approximate=True)
            return True
        except (RedisError, OSError) as e:
            log.debug("samples: publish failed: %s", e)
            return False

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # "0": a new group starts with whatever the stream still holds.
            await self._r.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        self._group_ready = True

    async def read(self, consumer: str, count: int = 50, block_ms: int = 1000) -> list[Delivery]:
        try:
            return await self._read_group(consumer, count, block_ms)
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
        # Redis restarted without its data (or the stream was deleted): the group went with it.
        # Create it again and go on, as at a first start: nothing of the old group survived.
        log.warning("samples: consumer group %s on %s is gone (a Redis restart?); creating it again", GROUP,
                    self.stream)
        self._group_ready = self._own_checked = False
        return await self._read_group(consumer, count, block_ms)

    async def _read_group(self, consumer: str, count: int, block_ms: int) -> list[Delivery]:
        await self._ensure_group()
        if not self._own_checked:
            # Our own unacknowledged entries first (a restart under the same name), then those
            # a dead ingester left behind.
            own = await self._read(consumer, "0", count, None)
            if own:
                return own
            self._own_checked = True
            claimed: Any = await self._r.xautoclaim(self.stream, GROUP, consumer, CLAIM_IDLE_MS, "0-0",
                                                    count=count)
            entries = [e for e in (claimed[1] if claimed else []) if e and e[1]]
            if entries:
                return [Delivery(_s(i), decode(d.get(b"b", d.get("b", b"[]")))) for i, d in entries]
        return await self._read(consumer, ">", count, block_ms)

    async def _read(self, consumer: str, start: str, count: int, block_ms: int | None) -> list[Delivery]:
        reply: Any = await self._r.xreadgroup(GROUP, consumer, {self.stream: start}, count=count, block=block_ms)
        out: list[Delivery] = []
        for _stream, entries in reply or []:
            for entry_id, data in entries:
                if data:  # a trimmed entry still pending comes back empty
                    out.append(Delivery(_s(entry_id), decode(data.get(b"b", data.get("b", b"[]")))))
                else:
                    await self.ack([_s(entry_id)])
        return out

    async def ack(self, ids: Sequence[str]) -> None:
        if ids:
            await self._r.xack(self.stream, GROUP, *ids)

    async def backlog(self) -> int:
        try:
            groups: Any = await self._r.xinfo_groups(self.stream)
        except (RedisError, OSError):
            return -1
        for g in groups:
            if _s(g.get("name", "")) == GROUP:
                lag = g.get("lag")
                return int(lag) if lag is not None else -1
        return -1

    async def close(self) -> None:
        await self._r.aclose()
