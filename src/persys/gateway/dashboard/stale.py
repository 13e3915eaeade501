"""Answers from the scheduler that a page may show slightly old rather than wait for: the
overview's health document and its last events. A busy scheduler (applying thousands of
workloads) answered Health in 0.6 s at the median and 2.5 s at worst, and the overview waited
for it on every view (bench/dashboard_probe.py). Here a fresh copy (under `max_age`) is used as
is; an older one is asked for again, and if the answer takes longer than `budget` the page is
built with the copy it has (its age shown by the caller; the live connection brings newer events
at once) while the answer lands in the cache for the next page. Without any copy the page waits.

One cache per question, shared by every session: each caller checks its session's role first
(`Session.can`, the same rules the scheduler applies); the question is asked with the
credentials of the session that found the copy too old.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    value: T
    at: float  # time.monotonic() when it was answered

    def age(self, now: float) -> float:
        return max(0.0, now - self.at)


class Stale(Generic[T]):
    def __init__(self, max_age: float = 1.0, budget: float = 0.15, keep: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age, self.budget, self.keep, self.clock = max_age, budget, keep, clock
        self._copy: Answer[T] | None = None
        self._asking: asyncio.Task[T] | None = None

    async def get(self, ask: Callable[[], Awaitable[T]]) -> Answer[T]:
        now = self.clock()
        copy = self._copy
        if copy is not None and copy.age(now) <= self.max_age:
            return copy
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask(ask))
        usable = copy is not None and copy.age(now) <= self.keep
        if not usable:
            await asyncio.shield(self._asking)  # nothing to show instead: wait (its error is the page's)
        else:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._asking), self.budget)
        fresh = self._copy
        assert fresh is not None
        return fresh

    async def _ask(self, ask: Callable[[], Awaitable[T]]) -> T:
        value = await ask()
        self._copy = Answer(value, self.clock())
        return value
