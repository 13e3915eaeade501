"""The planner seam (Nomad's planner): a plan's writes go in, which of them landed comes out.
`StorePlanner` commits to the store through the mirror's fenced commits, grouped writes many to
a transaction; a test's planner may refuse or land part of a plan with no store at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from persys.observability.metrics import LoopHistogram
from persys.scheduler.decide.effects import Write
from persys.scheduler.interpret.group_commit import GroupCommit, Unit, commit_units
from persys.scheduler.interpret.ops import fenced, store_write
from persys.scheduler.mirror.follower import ClusterState


class Planner(Protocol):
    async def land(self, writes: Sequence[Write], grouped: bool = False) -> list[bool]:
        """Land each write atomically if its guards hold, under its fence; whether each landed.
        `grouped`: the writes are independent and may share transactions."""


class StorePlanner:
    def __init__(self, state: ClusterState, sizes: LoopHistogram | None = None) -> None:
        self.state = state
        self.sizes = sizes
        # Concurrent callers' node-fenced writes (agents' reports) share transactions.
        self.node_writes = GroupCommit(lambda c, o: state.commit(c, o, fenced="node"), sizes=sizes)

    async def land(self, writes: Sequence[Write], grouped: bool = False) -> list[bool]:
        if not writes:
            return []
        if not grouped:
            return [await self.state.commit(*store_write(w), fenced=fenced(w)) for w in writes]
        if all(w.fence == "node" for w in writes):
            return await self.node_writes.submit([store_write(w) for w in writes])
        units = [Unit(*store_write(w)) for w in writes]
        fence = fenced(writes[0])
        return await commit_units(lambda c, o: self.state.commit(c, o, fenced=fence), units, sizes=self.sizes)
