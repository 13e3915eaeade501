"""One automation per cluster: this process acts only while it holds the scheduler's automation
lease (scheduler.automation_lease; a store lease of TTL seconds). Each pass asks for it (take or
renew); a standby records and does nothing. The lease is counted as held until the start of the
last successful renewal plus the TTL less a margin: the store's timer started no earlier than
that call, so when this process thinks it holds the lease, the store does too, whatever the
delays (a process frozen past its lease finds, on waking, that it may not act)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from persys.automation.seams import AutomationApi
from persys.client import SchedulerError

log = logging.getLogger(__name__)
DEFAULT_TTL = 10.0
MARGIN = 0.2  # of the TTL: kept in hand for the last action of a pass and clock skew in a call


def process_id() -> str:
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(4)}"


class Leadership:
    def __init__(self, api: AutomationApi, holder: str = "", ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.holder = holder or process_id()
        self.ttl = ttl
        self.clock = clock
        self.until = 0.0  # monotonic time the lease surely lasts until
        self.leading = False
        self.holder_seen = ""  # who holds it, when not this process

    def valid(self) -> bool:
        return self.clock() < self.until

    async def ensure(self) -> bool:
        """Take or renew the lease; whether this process may act now."""
        started = self.clock()
        try:
            r = await self.api.automation_lease(self.holder, self.ttl)
        except SchedulerError as err:
            log.warning("automation lease: %s: %s", err.code, err.message)
            return self.valid()  # unknown: act only within what was already granted
        was = self.leading
        self.leading = bool(r["held"])
        self.holder_seen = "" if self.leading else str(r["holder"])
        self.until = started + self.ttl * (1 - MARGIN) if self.leading else 0.0
        if self.leading != was:
            log.warning("automation %s: %s", self.holder, f"leading (term {r['term']})" if self.leading
                        else f"standing by ({r['holder']} leads)")
        return self.leading

    async def release(self) -> None:
        if not self.leading:
            return
        try:
            await self.api.automation_lease(self.holder, self.ttl, release=True)
        except SchedulerError as err:  # it expires by itself
            log.warning("automation lease release: %s: %s", err.code, err.message)
        self.leading, self.until = False, 0.0
