"""Cluster event bus (observability, not authoritative state).

open_events() URLs: `redis://host:port/0`, `rediss://[user@]host:port/0` (TLS) or
`unix:///path/redis.sock?db=0` (Redis Streams), `sqlite:///path/events.db` (embedded, durable and
bounded: `persys dev`), or `memory://` (in-process ring). Passwords never
go in the URL: pass login=Login(user, password).
"""

from __future__ import annotations

from persys.backend_access import BackendTLS
from persys.credentials import Login, url_password_problem
from persys.events.base import ClusterEvent, EventBus, EventsUnavailable
from persys.events.samples import Sample, SampleBus

__all__ = ["ClusterEvent", "EventBus", "EventsUnavailable", "Sample", "SampleBus", "open_events", "open_samples"]


def open_events(url: str, *, maxlen: int = 10_000, tls: BackendTLS | None = None,
                login: Login | None = None) -> EventBus:
    """tls and login: Redis over TLS (`rediss://`) and an ACL user (persys.backend_access)."""
    problem = url_password_problem(url, "events URL", "--redis-password")
    if problem:
        raise ValueError(problem)
    scheme = url.partition("://")[0]
    if scheme == "memory":
        from persys.events.memory import MemoryEventBus

        return MemoryEventBus(maxlen=maxlen)
    if scheme == "sqlite":
        from persys.events.sqlite_log import SqliteEventBus

        return SqliteEventBus(url.removeprefix("sqlite://"), maxlen=maxlen)
    if scheme in ("redis", "rediss", "unix"):
        from persys.events.redis_stream import RedisEventBus

        return RedisEventBus(url, maxlen=maxlen, tls=tls, login=login)
    raise ValueError(f"unsupported events URL {url!r} (use redis://host:port/0, unix:///path?db=0, "
                     "sqlite:///path/events.db or memory://)")


def open_samples(events: EventBus, maxlen: int = 20_000) -> SampleBus:
    """The meter's sample bus next to an event bus: its own stream on the same Redis (user and TLS
    identity included), or an in-process ring beside the in-process (or SQLite) event log."""
    from persys.events.redis_stream import RedisEventBus

    if isinstance(events, RedisEventBus):
        from persys.events.sample_redis import RedisSampleBus

        return RedisSampleBus(events.open_client(block_ms=1000), maxlen=maxlen)
    from persys.events.sample_memory import MemorySampleBus

    return MemorySampleBus(maxlen=maxlen)
