"""Cluster event bus (observability, not authoritative state).

open_events() URLs: `redis://host:port/0` or `unix:///path/redis.sock?db=0` (Redis Streams), or
`memory://` (in-process ring).
"""

from __future__ import annotations

from persys.events.base import ClusterEvent, EventBus, EventsUnavailable

__all__ = ["ClusterEvent", "EventBus", "EventsUnavailable", "open_events"]


def open_events(url: str, *, maxlen: int = 10_000) -> EventBus:
    scheme = url.partition("://")[0]
    if scheme == "memory":
        from persys.events.memory import MemoryEventBus

        return MemoryEventBus(maxlen=maxlen)
    if scheme in ("redis", "rediss", "unix"):
        from persys.events.redis_stream import RedisEventBus

        return RedisEventBus(url, maxlen=maxlen)
    raise ValueError(f"unsupported events URL {url!r} (use redis://host:port/0, unix:///path?db=0 or memory://)")
