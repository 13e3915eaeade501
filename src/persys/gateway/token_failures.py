"""Failed bearer-token attempts, per source address (issue #30, 8): `LIMIT` failures within
`WINDOW_S` seconds and the source's further token attempts are answered 429 with Retry-After
(the scheduler is not even asked) until the oldest failure leaves the window. A token that works
is never slowed; a client certificate is not a token attempt. Pure bookkeeping over the clock it
is given; bounded memory (the sources with the fewest recent failures are forgotten first)."""

from __future__ import annotations

import math
from collections import deque

LIMIT = 10
WINDOW_S = 60.0
MAX_SOURCES = 10_000


class TokenFailures:
    def __init__(self, limit: int = LIMIT, window_s: float = WINDOW_S, max_sources: int = MAX_SOURCES) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_sources = max_sources
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, source: str, now: float) -> deque[float]:
        times = self._failures.get(source, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def retry_after(self, source: str, now: float) -> int:
        """Whole seconds until `source` may try a token again (0: now)."""
        times = self._recent(source, now)
        if not times:
            self._failures.pop(source, None)
            return 0
        if len(times) < self.limit:
            return 0
        return max(1, math.ceil(times[-self.limit] + self.window_s - now))

    def failed(self, source: str, now: float) -> None:
        times = self._recent(source, now)
        times.append(now)
        if len(times) > self.limit:  # only the newest `limit` matter
            times.popleft()
        self._failures[source] = times
        if len(self._failures) > self.max_sources:
            for s in sorted(self._failures, key=lambda s: len(self._failures[s]))[: len(self._failures) // 10 + 1]:
                if s != source:
                    del self._failures[s]
