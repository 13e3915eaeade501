"""Cluster events: observability data (NodeJoined, WorkloadScheduled, DriftDetected, ...).

Events are NOT authoritative state; losing some during an outage is acceptable, so
publishing never fails the caller. Ids are "<ms>-<seq>" (Redis stream id format) and
increase monotonically within a bus.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ClusterEvent:
    kind: str  # e.g. "NodeJoined", "WorkloadScheduled"
    subject: str  # e.g. "workload/web", "node/n1"
    message: str
    reason: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    id: str = ""  # assigned by the backend on publish


class EventsUnavailable(Exception):
    """The event backend cannot be reached (raised by recent(); publish() never raises)."""


@runtime_checkable
class EventBus(Protocol):
    async def publish(self, event: ClusterEvent) -> str:
        """Append the event; returns its id, or "" if it was dropped (backend down)."""
        ...

    async def publish_many(self, events: Sequence[ClusterEvent]) -> list[str]:
        """Append several events in order in one round trip; ids as for `publish`."""
        ...

    async def recent(self, limit: int = 100, subject: str | None = None) -> list[ClusterEvent]:
        """Up to `limit` most recent events (optionally for one subject), newest last."""
        ...

    def subscribe(self, since_id: str | None = None) -> AsyncIterator[ClusterEvent]:
        """Live tail in publish order; with since_id, first replays retained events after it."""
        ...

    async def bounds(self) -> tuple[str | None, str | None]:
        """The oldest and newest retained event ids (None, None: none retained); raises
        EventsUnavailable when the backend cannot be reached. A resumed stream compares its id
        with the oldest to tell a gap from a replay (events.filters.start_of)."""
        ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def parse_id(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)
