"""Which scheduler replica an agent talks to next, and when it gives up on the current one.

A replica that stops acknowledging heartbeats (frozen, cut off from the network, overloaded
beyond its deadline) is abandoned after `AckDeadline`; so is one that says it is not active
without naming another replica. Replicas abandoned recently are "suspect" for a while: a
standby's pointer to one of them comes from a mirror that has not seen the election yet, so the
agent stays with the standby (asking again) rather than going back. Pure: times come in as
arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Why the agent is looking for another replica (gRPC status names, plus our own deadline).
ACK_DEADLINE = "ACK_DEADLINE"
MOVING_CODES = frozenset({"FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED", ACK_DEADLINE})


@dataclass
class AckDeadline:
    """No acknowledgement on the update stream for `seconds` (since it opened or since the last
    one) means the replica is gone for us, whatever TCP says (a frozen process's kernel keeps the
    connection open and buffers our heartbeats)."""

    seconds: float
    last: float = 0.0  # when the stream opened or last answered; 0 = no stream open

    def opened(self, now: float) -> None:
        self.last = now

    def acked(self, now: float) -> None:
        self.last = now

    def rearm(self, now: float) -> None:
        """The deadline passed and the agent stayed: watch for another full deadline (unless
        the stream has closed meanwhile)."""
        if self.last > 0:
            self.last = now

    def closed(self) -> None:
        self.last = 0.0

    def due_in(self, now: float) -> float:
        """Seconds until the deadline (inf with no stream open)."""
        return float("inf") if self.last <= 0 else self.last + self.seconds - now

    def expired(self, now: float) -> bool:
        return self.due_in(now) <= 0


def abandons(code: str, pointer: str, current: str) -> bool:
    """Whether this answer makes the current replica suspect: it is unreachable or silent, or it
    is not active and cannot name the active one. A replica naming itself was just elected and
    is catching up with the store: the agent stays and asks again (a replica that is not active
    never names itself)."""
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", ACK_DEADLINE):
        return True
    return code == "FAILED_PRECONDITION" and pointer == ""


def next_target(targets: Sequence[str], current: str, code: str, pointer: str,
                suspect_until: Mapping[str, float], now: float) -> str | None:
    """The replica to try next, or None to stay (and ask the current one again later)."""
    if code not in MOVING_CODES or (code == "FAILED_PRECONDITION" and pointer == current):
        return None  # not a reason to move, or the elected replica catching up: ask it again

    def ok(t: str) -> bool:
        return t != current and suspect_until.get(t, 0.0) <= now

    if pointer and ok(pointer):
        return pointer
    if not targets:
        return None
    start = targets.index(current) + 1 if current in targets else 0
    for k in range(len(targets)):
        t = targets[(start + k) % len(targets)]
        if ok(t):
            return t
    return None


# What a probe (one unary heartbeat, bounded by a short timeout) found at a replica.
ACTIVE = "ACTIVE"  # answered the heartbeat: it is the replica for this node (even if it asks us to register)
STANDBY = "STANDBY"  # answered that it is not; names the active one (or nobody) in `pointer`
REFUSING = "REFUSING"  # the connection was refused or failed: nothing listens there
SILENT = "SILENT"  # no answer within the timeout (frozen, cut off, overloaded)
PROBED_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", ACK_DEADLINE})  # moves decided by probing


@dataclass(frozen=True)
class Probe:
    outcome: str  # ACTIVE | STANDBY | REFUSING | SILENT
    pointer: str = ""  # a standby's active replica


def better_target(targets: Sequence[str], current: str, probes: Mapping[str, Probe],
                  suspect_until: Mapping[str, float], now: float) -> str | None:
    """Where to go when the current replica went quiet or its call failed, from what probes
    found (None: stay and probe again). An agent leaves only for something better: a replica
    that answers as the active one, or one a standby names (the leader moved). An answering
    active replica is never left, and one that is only silent (frozen, overloaded) is never
    traded for an address that refuses connections or for a standby that still names it: the
    election has not happened, and moving would take this node's heartbeats from the only
    replica that may judge it. Only when nothing listens at the current address does the agent
    try another replica that at least answers."""
    here = probes.get(current, Probe(SILENT))
    if here.outcome == ACTIVE:
        return None
    start = targets.index(current) + 1 if current in targets else 0
    order = [targets[(start + k) % len(targets)] for k in range(len(targets))] if targets else []
    others = [t for t in order if t != current]
    for t in others:
        if probes.get(t, Probe(SILENT)).outcome == ACTIVE:
            return t
    for t in others:
        p = probes.get(t, Probe(SILENT))
        if p.outcome == STANDBY and p.pointer and p.pointer != current and suspect_until.get(p.pointer, 0.0) <= now:
            pointed = probes.get(p.pointer)
            if pointed is None or pointed.outcome in (ACTIVE, SILENT):  # not probed, or slow: follow the standby
                return p.pointer
    if here.outcome == REFUSING:
        for t in others:
            if probes.get(t, Probe(SILENT)).outcome != REFUSING and suspect_until.get(t, 0.0) <= now:
                return t
    return None
