"""Bounded waits on the scheduler (issue #31, "answers under a storm"): an overloaded scheduler
gets the gateway a quick 503 + Retry-After, never an answer after the scheduler call's 10 s
timeout (a late 504).

Two bounds, both on the gateway's side of the call, both for reads (GETs of the API, which have
an answer budget; writes are bounded by the gateway's requests in flight, gateway.shedding):

- `SchedulerGate`: at most `max_calls` scheduler reads in flight from this gateway. A call beyond
  it waits for a slot at most `wait_s` (and never past its request's answer budget), and is
  refused at once, without waiting, when `max_waiting` calls are already queued: shed early, the
  queue itself bounded. The scheduler then works on a few calls at a time, each answered faster,
  instead of dividing its one event loop among every admitted request.
- The answer budget of a read (`read_budget.ReadBudget`, `client.ANSWER_BY`): a scheduler call
  of a GET still unanswered when the request should have its answer is cancelled (on the
  scheduler too: the work is dropped, not finished for nobody) and answered 503 + Retry-After
  when the gate is `stalled`: full (every slot taken or calls waiting, now or within the last
  `memory_s`: cutting calls frees slots while the scheduler is no faster) and no call it let
  through has come back for `stall_s` (a frozen or drowning scheduler). While calls do come back
  the slow ones are let finish: cutting work the scheduler is making progress on would leave a
  storm with no answer at all. A slow call with nothing waiting behind it keeps the 10 s timeout
  too: a busy machine is not an overloaded scheduler. Writes always do: a cut-off write might
  still apply, and its caller should learn the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from persys.client import SchedulerError, overloaded

# The scheduler answers reads on one event loop (and one GIL): more at once makes each slower, not
# more of them answered. Measured (bench/gateway_storm.py): 64 at once, each list of 300 workloads
# took up to 39 s at load 12; two at once finish one after the other.
DEFAULT_MAX_CALLS = 2
DEFAULT_MAX_WAITING = 8  # beyond slots and queue: refused at the door (read_budget), before any work
DEFAULT_WAIT_S = 1.0
DEFAULT_MEMORY_S = 5.0
DEFAULT_STALL_S = 3.0  # well above one read's time on a busy machine: only a stall trips it


class SchedulerGate:
    """`client.CallGate`: a bounded number of calls in flight, a bounded queue, bounded waits."""

    def __init__(self, max_calls: int = DEFAULT_MAX_CALLS, max_waiting: int = DEFAULT_MAX_WAITING,
                 wait_s: float = DEFAULT_WAIT_S, memory_s: float = DEFAULT_MEMORY_S,
                 stall_s: float = DEFAULT_STALL_S) -> None:
        if max_calls < 1 or max_waiting < 0 or wait_s < 0:
            raise ValueError("max_calls >= 1, max_waiting >= 0, wait_s >= 0")
        self.max_calls = max_calls
        self.max_waiting = max_waiting
        self.wait_s = wait_s
        self.memory_s = memory_s
        self.stall_s = stall_s
        self._full_at = float("-inf")  # when every slot was last taken, or a call last waited
        self._back_at = time.monotonic()  # when a call let through last came back (not cut)
        self._slots = asyncio.Semaphore(max_calls)
        self.in_flight = 0
        self.waiting = 0
        self.shed = 0  # calls refused, for /metrics and the tests

    @property
    def busy(self) -> bool:
        """Every slot taken or calls waiting for one, now or within `memory_s`: the scheduler is behind."""
        now = time.monotonic()
        if self.waiting > 0 or self.in_flight >= self.max_calls:
            self._full_at = now
        return now - self._full_at < self.memory_s

    @property
    def stalled(self) -> bool:
        """`busy`, and no call has come back for `stall_s`: reads past their budget are cut."""
        return self.busy and time.monotonic() - self._back_at >= self.stall_s

    @contextlib.asynccontextmanager
    async def slot(self, answer_by: float | None) -> AsyncIterator[None]:
        await self._enter(answer_by)
        self.in_flight += 1
        cut = False
        try:
            yield
        except SchedulerError as err:
            cut = err.retry_after is not None
            raise
        finally:
            self.in_flight -= 1
            self._slots.release()
            if not cut:
                self._back_at = time.monotonic()

    async def _enter(self, answer_by: float | None) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free: never waits
            return
        self._full_at = time.monotonic()
        wait = self.wait_s if answer_by is None else min(self.wait_s, answer_by - self._full_at)
        if self.waiting >= self.max_waiting or wait <= 0:
            self.shed += 1
            raise overloaded(f"{self.in_flight} calls in flight and {self.waiting} waiting at the gateway")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), wait)
        except TimeoutError:
            self.shed += 1
            raise overloaded(f"no call to it could start within {wait:.1f}s ({self.in_flight} in flight)") from None
        finally:
            self.waiting -= 1
