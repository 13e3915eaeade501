"""Pure decisions of the live event stream: which events a filter keeps, where a stream starts
(an event id, a time, now), and whether a resumed stream may have missed events (a gap).

Event ids are "<ms>-<seq>" where ms is when the bus received the event (Redis stream ids; the
in-process ring makes the same), so a time is also a position: "since 10m" starts after the
last id the bus could have given ten minutes ago.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from persys.events.base import ClusterEvent

MAX_KINDS = 32
MAX_NAME_CHARS = 253 + 16  # a subject: "<kind>/<name>"
MAX_SEQ = 2**64 - 1  # Redis stream sequence numbers are unsigned 64-bit
_ID = re.compile(r"^(\d{1,15})-(\d{1,20})$")
_DURATION = re.compile(r"^(\d{1,9})(s|m|h|d)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SINCE_SECONDS = 366 * 86400


class FilterError(ValueError):
    """A filter value that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class EventFilter:
    kinds: frozenset[str] = frozenset()
    subject: str = ""
    node: str = ""

    def matches(self, ev: ClusterEvent) -> bool:
        if self.kinds and ev.kind not in self.kinds:
            return False
        if self.subject and ev.subject != self.subject:
            return False
        return not self.node or ev.subject == f"node/{self.node}" or ev.fields.get("node") == self.node


def make_filter(kinds: Iterable[str] = (), subject: str = "", node: str = "") -> EventFilter:
    """The filter, refusing what no event could match or what is unbounded (FilterError names
    the field). Kinds may come comma-separated."""
    ks = frozenset(k.strip() for item in kinds for k in item.split(",") if k.strip())
    if len(ks) > MAX_KINDS:
        raise FilterError(f"kind: at most {MAX_KINDS} kinds")
    for k in ks:
        if len(k) > 64 or not k.isalnum():
            raise FilterError(f"kind: {k[:64]!r} is not an event kind (letters and digits, e.g. NodeReady)")
    if len(subject) > MAX_NAME_CHARS or (subject and ("/" not in subject and subject != "cluster")):
        raise FilterError(f"subject: {subject[:64]!r} is not an object (e.g. workload/web or node/n1)")
    if len(node) > 253 or any(c.isspace() or c == "/" for c in node):
        raise FilterError(f"node: {node[:64]!r} is not a node name")
    return EventFilter(ks, subject, node)


def check_id(event_id: str, field: str = "sinceId") -> str:
    """An event id as the bus gives them, or FilterError naming `field`."""
    m = _ID.match(event_id)
    if m is None or int(m.group(2)) > MAX_SEQ:
        raise FilterError(f"{field}: {event_id[:64]!r} is not an event id (<milliseconds>-<sequence>, as listed)")
    return event_id


def id_key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def id_before(ts: float) -> str:
    """The position just before time `ts`: events the bus received at `ts` or later follow it."""
    ms = int(ts * 1000)
    return f"{ms - 1}-{MAX_SEQ}" if ms > 0 else "0-0"


def parse_since(text: str, now: float, field: str = "since") -> float:
    """'10m', '2h', '30s', '1d' (before `now`) or an RFC 3339 time -> unix time."""
    text = text.strip()
    m = _DURATION.match(text)
    if m:
        seconds = int(m.group(1)) * _UNIT[m.group(2)]
        if seconds > MAX_SINCE_SECONDS:
            raise FilterError(f"{field}: at most 366 days back")
        return now - seconds
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise FilterError(f"{field}: {text[:64]!r} is neither a duration (10m, 2h, 30s, 1d) nor an RFC 3339 "
                          "time (2026-01-02T15:04:05Z)") from None
    if t.tzinfo is None:
        raise FilterError(f"{field}: {text[:64]!r} has no time zone (add Z or +hh:mm)")
    return t.timestamp()


@dataclass(frozen=True, slots=True)
class Start:
    """Where a stream starts: after `after` ("" = the bus's last id now), and the gap notice."""

    after: str
    gap: str = ""


def start_of(since_id: str, since: float, oldest: str | None, last: str | None, retained: int) -> Start:
    """Where a stream starts and whether events may be missing before it.

    `oldest`/`last`: the bus's oldest and newest retained ids (None: it holds none). A resume
    id older than the oldest retained one means the bus trimmed (or lost, after a restart
    without persistence) events after it: the client is told, never silently skipped. A time
    older than what is retained is no gap: the client asked for a window, and gets what exists.
    """
    if since_id:
        if oldest is None:
            # The event the client saw is gone and nothing replaced it: the stream was reset.
            return Start(since_id, f"event {since_id} is no longer retained (the event bus holds no events: it "
                                   "was reset or restarted); events after it may be lost")
        if id_key(since_id) < id_key(oldest):
            return Start(since_id, f"events after {since_id} up to {oldest} may be lost (the event bus keeps the "
                                   f"last {retained} events); resuming from the oldest retained")
        return Start(since_id)
    if since > 0:
        return Start(id_before(since))
    return Start(last or "0-0")


def event_doc(ev: ClusterEvent) -> dict[str, object]:
    """The shape GET /v1/events shows (camelCase keys; fields only when there are some)."""
    return {"id": ev.id, "ts": ev.ts, "kind": ev.kind, "subject": ev.subject, "reason": ev.reason,
            "message": ev.message, **({"fields": dict(ev.fields)} if ev.fields else {})}


def keep_last(docs: Iterable[Mapping[str, object]], flt: EventFilter, since: float, limit: int
              ) -> list[Mapping[str, object]]:
    """The newest `limit` listed events (dicts as event_doc gives) the filter keeps, at or after `since`."""
    kept = [d for d in docs if flt.matches(_from_doc(d)) and float(str(d.get("ts", 0))) >= since]
    return kept[-limit:] if limit > 0 else kept


def _from_doc(d: Mapping[str, object]) -> ClusterEvent:
    fields = d.get("fields")
    return ClusterEvent(kind=str(d.get("kind", "")), subject=str(d.get("subject", "")), message="",
                        fields={str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {})
