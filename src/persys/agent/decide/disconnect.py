"""When an agent that lost every scheduler replica stops its `onDisconnect: Stop` instances.

The scheduler relocates a node's instances once it has received nothing from the node for the
node grace, counted from the last heartbeat it *received*. The agent counts from the time it
*sent* the latest heartbeat a replica acknowledged, which is never later than that receipt, and
stops after `stop_after` (grace minus two heartbeat intervals, at least half the grace). So the
agent's deadline falls at least `grace - stop_after` before the scheduler can decide to relocate,
which is the time it has to stop the instances. An acknowledgement in degraded mode is contact
too: only the loss of every replica counts.

A stopped ("fenced") instance is not started again by the agent on its own: only once a replica
acknowledged a heartbeat sent after the fencing and a full desired set (normal mode) arrived
after it, i.e. once the scheduler, not the agent, says whether the instance still belongs here.
The scheduler sends a full set only when a WatchAssignments stream opens (or on a mode change or
drift resync), so when acknowledgements come back without that stream reopening (a short stall,
a single replica) the verdict asks for a `resync`: the agent reopens the stream to get one.

`decide` is pure (a snapshot in, a verdict out); `AckClock` only keeps the heartbeat send times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from persys.model.workload import OnDisconnect

MARGIN_HEARTBEATS = 2  # heartbeat intervals the agent's deadline keeps before the scheduler's
MIN_FRACTION = 0.5  # ... but the agent waits at least this share of the grace
REASON = "Disconnected"


def stop_after(grace: float, heartbeat_interval: float) -> float:
    """Seconds without an acknowledged heartbeat after which Stop instances stop (0: never,
    the grace is unknown)."""
    if grace <= 0:
        return 0.0
    return max(grace - MARGIN_HEARTBEATS * heartbeat_interval, grace * MIN_FRACTION)


def heartbeat_interval(told: float, grace: float) -> float:
    """The interval the agent heartbeats at: as told, unless the grace is so short that one late
    heartbeat would already cross `stop_after` (then a fifth of the grace: stop_after is then
    three intervals)."""
    if grace > 0 and stop_after(grace, told) < 1.5 * told:
        return grace / 5
    return told


@dataclass(frozen=True)
class Snapshot:
    now: float
    started_at: float  # when this agent process started (silence counts from there before any ack)
    last_ack: float | None  # send time of the latest heartbeat a replica acknowledged
    last_full_set: float | None  # arrival of the latest full desired set in normal mode
    grace: float  # the scheduler's node grace (0: not known yet)
    heartbeat_interval: float
    policies: Mapping[str, OnDisconnect]  # instances desired Running here, with their policy
    fenced: Mapping[str, float]  # instances stopped for disconnection -> when


@dataclass(frozen=True)
class Verdict:
    silent_for: float
    stop_after: float  # 0: disconnection stops nothing (grace unknown)
    disconnected: bool
    fence: tuple[str, ...]  # to stop now and not start on our own
    release: tuple[str, ...]  # fenced before; the scheduler's desired state decides again
    next_check: float | None  # clock value at which the verdict changes by itself
    resync: bool = False  # fenced instances wait only for a full desired set: ask for one


def decide(s: Snapshot) -> Verdict:
    limit = stop_after(s.grace, s.heartbeat_interval)
    since = s.last_ack if s.last_ack is not None else s.started_at
    silent = max(0.0, s.now - since)
    disconnected = limit > 0 and silent >= limit
    fence: tuple[str, ...] = ()
    if disconnected:
        fence = tuple(sorted(w for w, p in s.policies.items() if p == OnDisconnect.STOP and w not in s.fenced))

    def heard_since(at: float) -> bool:
        return not disconnected and s.last_ack is not None and s.last_ack > at

    def full_set_since(at: float) -> bool:
        return s.last_full_set is not None and s.last_full_set > at

    release = tuple(sorted(
        w for w, at in s.fenced.items()
        if w not in s.policies or (heard_since(at) and full_set_since(at))))
    resync = any(w not in release and heard_since(at) and not full_set_since(at) for w, at in s.fenced.items())
    watch = limit > 0 and not disconnected and any(p == OnDisconnect.STOP for p in s.policies.values())
    return Verdict(silent, limit, disconnected, fence, release, since + limit if watch else None, resync)


class AckClock:
    """Send times of heartbeats awaiting their acknowledgement (acks come in order on a stream),
    and the send time of the latest acknowledged one."""

    def __init__(self) -> None:
        self._pending: deque[float] = deque()
        self.last_ack: float | None = None

    def sent(self, at: float) -> None:
        self._pending.append(at)

    def unsent(self) -> None:
        """The heartbeat just recorded never left (the stream was closed)."""
        if self._pending:
            self._pending.pop()

    def answered(self, acknowledged: bool) -> float | None:
        """The next acknowledgement on the stream; a `reregister` answer is no contact (that
        replica does not count us alive). Returns the send time of the heartbeat it answers."""
        if not self._pending:
            return None
        at = self._pending.popleft()
        if acknowledged:
            self.contact(at)
        return at

    def contact(self, at: float) -> None:
        if self.last_ack is None or at > self.last_ack:
            self.last_ack = at

    def reset(self) -> None:
        """The stream ended: answers to what it carried will not come."""
        self._pending.clear()
