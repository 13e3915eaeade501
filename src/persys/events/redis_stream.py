"""EventBus on a Redis Stream (XADD MAXLEN ~, XREVRANGE, blocking XREAD).

Publishing is best effort: while Redis is down, publish() drops the event, counts it in
`dropped`, logs once per outage and returns "". Subscribers retry and resume after the last
id they delivered, so a tail survives a Redis restart (events dropped meanwhile are lost).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.credentials import CredentialProvider
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from persys.backend_access import BackendTLS, tls_refusal_hint
from persys.credentials import Login
from persys.events.base import ClusterEvent, EventsUnavailable

log = logging.getLogger(__name__)

_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _encode(event: ClusterEvent) -> dict[str, str]:
    return {
        "kind": event.kind,
        "subject": event.subject,
        "message": event.message,
        "reason": event.reason,
        "fields": json.dumps(event.fields, separators=(",", ":")),
        "ts": repr(event.ts),
    }


def _decode(event_id: Any, data: dict[Any, Any]) -> ClusterEvent:
    d = {_s(k): _s(v) for k, v in data.items()}
    try:
        fields = json.loads(d.get("fields", "{}"))
    except ValueError:
        fields = {}
    return ClusterEvent(
        kind=d.get("kind", ""),
        subject=d.get("subject", ""),
        message=d.get("message", ""),
        reason=d.get("reason", ""),
        fields={str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {},
        ts=float(d.get("ts", "0") or 0),
        id=_s(event_id),
    )


def _access_options(tls: BackendTLS | None, login: Login | None) -> dict[str, Any]:
    """redis-py's connection options for a TLS identity and an ACL user (AUTH user password)."""
    out: dict[str, Any] = {}
    if tls is not None:
        out.update(ssl_cert_reqs="required", ssl_check_hostname=True)
        if tls.ca is not None:
            out["ssl_ca_certs"] = str(tls.ca)
        if tls.cert is not None and tls.key is not None:
            out.update(ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    if login is not None:
        out["credential_provider"] = LoginCredentials(login)
    return out


def _without_user(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


class LoginCredentials(CredentialProvider):
    """The ACL user's credentials for each new connection, the password read again from its file
    or variable each time: a rotated password takes effect at the next connection."""

    def __init__(self, login: Login) -> None:
        self._login = login

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        fresh = self._login.current()
        if fresh is not None:
            log.info("event bus: user %r's password changed in its source; new connections use it", fresh.user)
            self._login = fresh
        password = self._login.password.reveal()
        # A password alone is the default user's (requirepass): plain AUTH, as before Redis 6.
        return (password,) if self._login.user == "default" else (self._login.user, password)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()  # a small file or variable: no need to leave the loop


class EventsAccessDenied(Exception):
    """Redis refused our credentials, TLS identity or the commands/keys Persys needs."""


class RedisEventBus:
    def __init__(
        self,
        url: str,
        *,
        stream: str = "persys:events",
        maxlen: int = 10_000,
        timeout: float = 2.0,
        block_ms: int = 1000,
        tls: BackendTLS | None = None,
        login: Login | None = None,
    ) -> None:
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.block_ms = block_ms
        self.dropped = 0
        self._outage = False
        # No client-side retries: a publish during an outage should fail fast and be dropped.
        common: dict[str, Any] = {
            "protocol": 2,  # redis-py 8 defaults to RESP3; we parse RESP2 replies
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            **_access_options(tls, login),
        }
        # With a login the user comes from it (a user in the URL too would clash in redis-py).
        target = _without_user(url) if login is not None else url
        self._redis = aioredis.Redis.from_url(target, socket_timeout=timeout, **common)
        # Blocking XREADs hold a connection; give them their own pool and a longer timeout.
        self._sub_redis = aioredis.Redis.from_url(target, socket_timeout=timeout + block_ms / 1000, **common)
        self._target, self._common, self._timeout = target, common, timeout

    def open_client(self, block_ms: int) -> aioredis.Redis:
        """A new client of the same Redis, user and TLS identity, for another stream that blocks
        up to `block_ms` in its reads (the meter's samples: events.sample_redis)."""
        return aioredis.Redis.from_url(self._target, socket_timeout=self._timeout + block_ms / 1000, **self._common)

    async def publish(self, event: ClusterEvent) -> str:
        return (await self.publish_many([event]))[0]

    async def publish_many(self, events: Sequence[ClusterEvent]) -> list[str]:
        if not events:
            return []
        # One pipelined round trip (not a transaction): a burst of events costs one RTT.
        pipe = self._redis.pipeline(transaction=False)
        for event in events:
            pipe.xadd(self.stream, _encode(event), maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
        try:
            ids = await pipe.execute()
        except _DOWN as e:
            self.dropped += len(events)
            if not self._outage:
                self._outage = True
                log.warning("event bus: redis at %s unreachable, dropping events: %s", redacted(self.url), e)
            return [""] * len(events)
        except RedisError as e:
            self.dropped += len(events)
            log.warning("event bus: publish failed: %s", e)
            return [""] * len(events)
        if self._outage:
            self._outage = False
            log.info("event bus: redis at %s reachable again (%d dropped so far)", redacted(self.url), self.dropped)
        return [_s(i) for i in ids]

    async def recent(self, limit: int = 100, subject: str | None = None) -> list[ClusterEvent]:
        out: list[ClusterEvent] = []
        upper = "+"
        page = max(limit, 100) if subject is None else 500
        try:
            while len(out) < limit:
                rows: Any = await self._redis.xrevrange(self.stream, max=upper, count=page)
                for event_id, data in rows:
                    ev = _decode(event_id, data)
                    if subject is None or ev.subject == subject:
                        out.append(ev)
                        if len(out) >= limit:
                            break
                if len(rows) < page:
                    break
                upper = "(" + _s(rows[-1][0])  # exclusive bound: continue below the last id
        except _DOWN as e:
            raise EventsUnavailable(f"{redacted(self.url)}: {e}") from e
        out.reverse()
        return out

    async def _last_id(self) -> str:
        rows: Any = await self._sub_redis.xrevrange(self.stream, count=1)
        return _s(rows[0][0]) if rows else "0-0"

    async def subscribe(self, since_id: str | None = None) -> AsyncIterator[ClusterEvent]:
        # Start from a concrete id rather than "$" so nothing published between two
        # XREAD calls (or during a reconnect) is skipped.
        cursor = since_id
        backoff = 0.1
        while True:
            try:
                if cursor is None:
                    cursor = await self._last_id()
                reply: Any = await self._sub_redis.xread(
                    {self.stream: cursor}, block=self.block_ms, count=500
                )
                backoff = 0.1
            except _DOWN as e:
                log.debug("event subscribe: redis unreachable, retrying: %s", e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            for _stream, entries in reply or []:
                for event_id, data in entries:
                    ev = _decode(event_id, data)
                    cursor = ev.id
                    yield ev

    async def bounds(self) -> tuple[str | None, str | None]:
        try:
            # XREAD from the start (not XRANGE): the ACL Persys documents grants XREAD and XREVRANGE.
            first: Any = await self._redis.xread({self.stream: "0-0"}, count=1)
            last: Any = await self._redis.xrevrange(self.stream, count=1)
        except _DOWN as e:
            raise EventsUnavailable(f"{redacted(self.url)}: {e}") from e
        oldest = _s(first[0][1][0][0]) if first and first[0][1] else None
        return oldest, (_s(last[0][0]) if last else None)

    async def check_access(self, attempts: int = 3) -> None:
        """Raise EventsAccessDenied for a wrong password, TLS identity or an ACL without what Persys
        needs; return when Redis is merely unreachable (events are best effort: the scheduler starts
        without them). Under TLS 1.3 a server refusing our certificate sometimes just resets the
        connection instead of sending its alert, so an unexplained failure is tried again."""
        for attempt in range(attempts):
            try:
                await self._check_once()
                return
            except _DOWN as e:
                hint = tls_refusal_hint(str(e), "redis")
                if hint:
                    raise EventsAccessDenied(f"redis at {redacted(self.url)}: {hint} ({e})") from None
                if attempt + 1 == attempts or isinstance(e, RedisTimeoutError):
                    log.warning("event bus: redis at %s unreachable at start: %s", redacted(self.url), e)
                    return
                await asyncio.sleep(0.1)

    async def _check_once(self) -> None:
        try:
            await self._redis.ping()
            await self._redis.xrevrange(self.stream, count=1)
        except AuthenticationError:  # a ConnectionError to redis-py: before _DOWN
            raise EventsAccessDenied(f"redis at {redacted(self.url)}: authentication failed (wrong user or "
                                     "password, or the user is disabled; check --redis-user and "
                                     "--redis-password)") from None
        except (NoPermissionError, ResponseError) as e:
            raise EventsAccessDenied(f"redis at {redacted(self.url)}: {e} (the ACL user needs the commands and "
                                     f"key pattern in docs/security.md, 'etcd and Redis in production')") from None

    async def healthy(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self._redis.aclose()
        await self._sub_redis.aclose()
