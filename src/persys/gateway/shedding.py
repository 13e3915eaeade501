"""Shedding instead of queueing: the gateway answers at most `max_in_flight` API requests at once
and refuses the rest at once with 503 and `Retry-After`, so a storm gets quick refusals instead of
answers after tens of seconds (or 504s), the event loop stays free for `/healthz` and `/readyz`,
and memory stays bounded (each admitted list holds its answer in memory until it is sent).

Exempt: the probes and `/metrics` (never wait behind API work), the long-lived streams (SSE
watches, followed logs and events: they are bounded by the stream budget, `routes.stream_budget`)
and WebSockets. After a storm the freed memory is handed back to the system (glibc keeps freed
heap in its arenas otherwise: the RSS stayed at 5-6x its baseline)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_IN_FLIGHT = 64
RETRY_AFTER_S = 1
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
TRIM_AFTER = 32  # requests since the last trim that make one worth its cost (a few ms)
QUIET_S = 1.0  # quiet this long after them: the burst is over


def is_exempt(path: str, query: bytes) -> bool:
    """Requests that are not counted: probes, metrics, and streams that live as long as their
    client (pure)."""
    if path in EXEMPT_PATHS or path.startswith("/v1/watch/") or path in ("/v1/events/stream", "/ui/live"):
        return True
    if path.endswith("/logs") and b"follow=true" in query:
        return True
    return path.endswith(("/terminal", "/console"))


def _malloc_trim() -> Callable[[], None]:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        trim = None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class Shedding:
    """ASGI middleware: counts the API requests being answered and refuses those beyond the bound."""

    def __init__(self, app: App, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.refused = 0
        self._since_trim = 0
        self._settle: asyncio.TimerHandle | None = None
        self._trim = _malloc_trim()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_exempt(scope["path"], scope.get("query_string", b"")):
            await self.app(scope, receive, send)
            return
        self._since_trim += 1
        if self.in_flight >= self.max_in_flight:
            self.refused += 1
            self._after_burst()
            await _busy(send, self.in_flight, self.max_in_flight)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self._after_burst()

    def _after_burst(self) -> None:
        """Once the gateway has been quiet for a second after enough work, collect the cycles the
        burst left (connections, TLS objects) and hand the freed heap back to the system."""
        if self._since_trim < TRIM_AFTER:
            return
        if self._settle is not None:
            self._settle.cancel()
        self._settle = asyncio.get_running_loop().call_later(QUIET_S, self._quiet)

    def _quiet(self) -> None:
        self._settle = None
        if self.in_flight:
            return
        self._since_trim = 0
        started = time.monotonic()
        gc.collect()
        self._trim()
        log.debug("after a burst: gc and malloc_trim took %.1f ms", (time.monotonic() - started) * 1000)


async def _busy(send: Send, in_flight: int, limit: int) -> None:
    body = json.dumps({"error": f"the gateway is busy: {in_flight} requests in flight (its limit is {limit}); "
                                f"retry after {RETRY_AFTER_S}s", "code": "UNAVAILABLE", "problems": []}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode())]})
    await send({"type": "http.response.body", "body": body})
