"""Does the state store or the event bus take clients that prove nothing? Asked once when
`persys scheduler` starts: etcd and Redis are reached as an anonymous client would (no client
certificate, no user, no password; the server still verified with the CA we were given), and a
backend that answers a read anyway gets a warning naming it. Anyone who can reach such a server
(a workload on a node with host networking, say) reads and writes the whole cluster's state.

A backend that refuses, or cannot be reached within the bound, gives no warning: only an answer
proves open access. SQLite and in-process backends are not servers and are not asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

from persys.backend_access import BackendAccess, BackendTLS
from persys.events import open_events
from persys.events.redis_stream import RedisEventBus
from persys.store.etcd import EtcdStore

PROBE_TIMEOUT_S = 3.0
FIX = 'docs/security.md, "etcd and Redis in production"'


def _anonymous_tls(access: BackendAccess | None) -> BackendTLS | None:
    """The server check of `access` without our identity (None: no TLS)."""
    if access is None or access.tls is None:
        return None
    return BackendTLS(access.tls.ca, None, None, access.tls.server_name)


async def _etcd_answers(url: str, access: BackendAccess | None, bound_s: float) -> bool:
    scheme, _, rest = url.partition("://")
    if scheme not in ("etcd", "etcds"):
        return False
    tls = _anonymous_tls(access)
    if scheme == "etcds" and tls is None:
        return False  # the scheduler itself could not open it so; nothing to compare with
    store = EtcdStore(rest.split(","), tls=tls, timeout=bound_s)
    try:
        await asyncio.wait_for(store.get("/persys/"), bound_s)
        return True
    except Exception:  # refused, unreachable or timed out: no proof of open access
        return False
    finally:
        with contextlib.suppress(Exception):
            await store.close()


def _without_user(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


async def _redis_answers(url: str, access: BackendAccess | None, bound_s: float) -> bool:
    if url.partition("://")[0] not in ("redis", "rediss", "unix"):
        return False
    bus = open_events(_without_user(url), tls=_anonymous_tls(access))
    assert isinstance(bus, RedisEventBus)
    try:
        # A read of the stream Persys writes: a default user limited to PING proves nothing.
        await asyncio.wait_for(bus._redis.exists(bus.stream), bound_s)
        return True
    except Exception:  # NOAUTH, NOPERM, a refused handshake, unreachable
        return False
    finally:
        with contextlib.suppress(Exception):
            await bus.close()


async def open_access_warnings(store_url: str, events_url: str, store_access: BackendAccess | None,
                               events_access: BackendAccess | None,
                               bound_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """One warning per backend that answered an anonymous client's read."""
    etcd, redis = await asyncio.gather(_etcd_answers(store_url, store_access, bound_s),
                                       _redis_answers(events_url, events_access, bound_s))
    out = []
    if etcd:
        out.append(f"the state store ({store_url}) answers clients without a certificate or password: anyone who "
                   f"reaches it reads and writes the whole cluster's state; turn on etcd authentication or "
                   f"client-certificate authentication with a CA of etcd's own ({FIX})")
    if redis:
        out.append(f"the event bus ({_without_user(events_url)}) answers clients without a password: anyone who "
                   f"reaches it reads and writes the cluster's events; turn the Redis default user off and give "
                   f"Persys an ACL user ({FIX})")
    return out
