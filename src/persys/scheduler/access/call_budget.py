"""How many streams and calls one node may hold open at a scheduler at once.

An agent needs one desired-state watch and one update stream (two for a moment while it
reconnects); a certificate that opened 2,277 watch streams cost the scheduler 100 MB. Beyond the
bound a call is refused with RESOURCE_EXHAUSTED before it holds anything. Keyed by the node id
acted for: a node identity may only act for itself, so this is per identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WATCH_STREAMS_PER_NODE = 4
UPDATE_STREAMS_PER_NODE = 4
CALLS_PER_NODE = 8  # concurrent unary calls (register, heartbeat, report)


class OverBudgetError(Exception):
    pass


@dataclass
class CallBudget:
    limit: int
    what: str
    held: dict[str, int] = field(default_factory=dict)

    def acquire(self, key: str) -> None:
        """Take one slot of `key`; OverBudgetError when all are taken (nothing is taken then)."""
        n = self.held.get(key, 0)
        if n >= self.limit:
            raise OverBudgetError(f"node {key} already holds {n} {self.what} (at most {self.limit})")
        self.held[key] = n + 1

    def release(self, key: str) -> None:
        left = self.held[key] - 1
        if left:
            self.held[key] = left
        else:
            del self.held[key]
