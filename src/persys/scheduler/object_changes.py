"""Which workloads or nodes a mirror change touches (pure), and a per-stream set of those not yet
sent, fed by the mirror's listener (`ClusterState.subscribe`) so a live watch follows the mirror
instead of polling it.

The set coalesces: a workload changed ten times before the stream sends it is sent once, with its
latest view. Its size is bounded by the number of objects in the mirror.
"""

from __future__ import annotations

import asyncio

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


class ChangeSet:
    """Ids changed since the stream last took them; `listener` is what the mirror calls."""

    def __init__(self, watched: str) -> None:
        self.watched = watched
        self._dirty: set[str] = set()
        self._reset = False
        self._wake = asyncio.Event()

    def listener(self, kind: str, ident: str) -> None:
        which = touched(self.watched, kind, ident)
        if which is None:
            return
        if which == RESET:
            self._reset = True
        else:
            self._dirty.add(which)
        self._wake.set()

    async def wait(self, seconds: float | None) -> None:
        """Return when something changed (at once if something is pending), or after `seconds`."""
        if self._dirty or self._reset:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return

    def take(self) -> tuple[list[str], bool]:
        """The changed ids in order, and whether everything must be looked at again."""
        ids, reset = sorted(self._dirty), self._reset
        self._dirty, self._reset = set(), False
        self._wake.clear()
        return ids, reset
