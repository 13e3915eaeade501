"""Which workloads or nodes a mirror change touches (pure), and the feed of those changes that
live watches read, fed by the mirror's listener (`ClusterState.subscribe`) so a watch follows the
mirror instead of polling it. A workload changed ten times before a stream sends it is sent once,
with its latest view.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque

from persys.model.workload import workload_of

WORKLOADS = "workloads"
NODES = "nodes"
RESET = "*"  # the mirror was replaced (a restore): every object may have changed


def touched(watched: str, kind: str, ident: str) -> str | None:
    """The id of the watched object a mirror change (kind, id) touches, RESET, or None."""
    if kind == "reset":
        return RESET
    if watched == WORKLOADS:
        if kind == "workload":
            return ident
        if kind == "status":
            return workload_of(ident)
        if kind == "assignment":  # ident: "<node>/<instance>"
            return workload_of(ident.partition("/")[2])
        return None
    if kind == "node":
        return ident
    if kind == "assignment":  # a node's allocation changed
        return ident.partition("/")[0]
    return None


class ChangeFeed:
    """The changes of one watched kind, shared by every stream of it: one mirror listener, so a
    mirror change costs the same with 256 streams as with one (`bench/live_streams.py`).

    A bounded log of touched ids; each stream keeps a cursor (how many entries it has read) and
    takes the ids after it, de-duplicated: a stream that was slow sends each changed object once.
    A stream further behind than the log holds is told to look at everything again (reset).
    """

    def __init__(self, watched: str, capacity: int = 100_000) -> None:
        self.watched = watched
        self._log: deque[str] = deque(maxlen=capacity)
        self._seq = 0  # entries ever appended
        self.readers = 0  # streams following: none, and the listener does nothing
        self._wake = asyncio.Event()
        self._waiting = False

    @property
    def cursor(self) -> int:
        """The position now: a stream starting here sees the changes from now on."""
        return self._seq

    def listener(self, kind: str, ident: str) -> None:
        if not self.readers:
            return
        which = touched(self.watched, kind, ident)
        if which is None:
            return
        self._log.append(which)
        self._seq += 1
        if self._waiting:  # wake every waiting stream once; the next waiters get a fresh event
            wake, self._wake, self._waiting = self._wake, asyncio.Event(), False
            wake.set()

    async def wait(self, cursor: int, seconds: float | None) -> None:
        """Return when there are changes after `cursor` (at once if there are), or after `seconds`."""
        if self._seq > cursor:
            return
        self._waiting = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def take(self, cursor: int) -> tuple[list[str], bool, int]:
        """The ids changed after `cursor` (sorted, each once), whether everything must be looked
        at again (the mirror was replaced, or the stream fell behind the log), the new cursor."""
        missed = self._seq - cursor
        if missed > len(self._log):
            return [], True, self._seq
        recent = set(itertools.islice(reversed(self._log), missed))  # from the new end: O(missed)
        reset = RESET in recent
        recent.discard(RESET)
        return sorted(recent), reset, self._seq
