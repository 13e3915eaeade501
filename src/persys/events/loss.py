"""A pure ledger of lost cluster events: how many, when, why, and what is not reported yet.

Events are observability, so losing some (event bus down, publish queue full) must not stop
the control plane, but the loss must not be silent either: the ledger counts every lost event
since start (for health) and keeps the span not yet announced, which the publisher turns into
one `EventsLost` gap event as soon as the bus takes events again. No I/O and no clock of its
own: callers pass the time in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass

from persys.events.base import ClusterEvent

GAP_KIND = "EventsLost"

# Why events were lost (the gap event's reason lists the causes of its span).
BUS_DOWN = "EventBusUnavailable"
QUEUE_FULL = "PublishQueueFull"


@dataclass(frozen=True)
class LostSpan:
    """Lost events not yet announced: how many, the emit times of the first and last, causes."""

    count: int = 0
    first_ts: float = 0.0
    last_ts: float = 0.0
    causes: frozenset[str] = frozenset()

    def merged(self, other: LostSpan) -> LostSpan:
        if not other.count:
            return self
        if not self.count:
            return other
        return LostSpan(self.count + other.count, min(self.first_ts, other.first_ts),
                        max(self.last_ts, other.last_ts), self.causes | other.causes)


def _fmt(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def gap_event(span: LostSpan, source: str) -> ClusterEvent:
    """The event that stands for `span` in the stream (published before anything newer)."""
    causes = ",".join(sorted(span.causes))
    return ClusterEvent(
        kind=GAP_KIND,
        subject=f"replica/{source}",
        reason=causes,
        message=(f"{span.count} events lost between {_fmt(span.first_ts)} and {_fmt(span.last_ts)} "
                 f"on replica {source} ({causes})"),
        fields={"count": str(span.count), "from": repr(span.first_ts), "to": repr(span.last_ts),
                "replica": source, "causes": causes},
    )


@dataclass
class LossLedger:
    """Counts lost events; `log_interval` bounds how often a caller is told to log about it."""

    log_interval: float = 30.0
    total: int = 0  # since start
    last_drop_at: float = 0.0  # wall-clock time of the latest loss (0: never)
    pending: LostSpan = dataclasses.field(default_factory=LostSpan)
    _logged_at: float | None = None
    _unlogged: int = 0

    def record(self, events: Iterable[ClusterEvent], cause: str, now: float) -> int:
        """Count `events` as lost. Returns how many losses to log now (0: stay quiet), so a
        flood of drops logs once per interval with the number since the last line."""
        stamps = [e.ts for e in events]
        if not stamps:
            return 0
        self.total += len(stamps)
        self.last_drop_at = now
        self.pending = self.pending.merged(LostSpan(len(stamps), min(stamps), max(stamps), frozenset({cause})))
        self._unlogged += len(stamps)
        if self._logged_at is not None and now - self._logged_at < self.log_interval:
            return 0
        self._logged_at, n, self._unlogged = now, self._unlogged, 0
        return n

    def take(self) -> LostSpan | None:
        """Hand the pending span to the publisher (None if nothing is pending); give it back
        with `restore` if its gap event could not be published."""
        span, self.pending = self.pending, LostSpan()
        return span if span.count else None

    def restore(self, span: LostSpan) -> None:
        self.pending = self.pending.merged(span)

    def health(self) -> dict[str, float | int]:
        return {"eventsDropped": self.total, "eventsLastDropAt": self.last_drop_at,
                "eventsDropsUnreported": self.pending.count}
