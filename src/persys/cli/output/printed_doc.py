"""What `-o json|yaml|jsonpath` prints of an answer: times as RFC 3339 strings (UTC, milliseconds:
`2026-12-02T15:04:05.123Z`) and keys in one style, camelCase, as kubectl prints API objects.

The gateway answers times as Unix seconds and a few older answers (tokens, join tokens, audit)
with snake_case keys; persysctl presents both the one way. User data is never touched: what is
under `spec`, `labels`, `env`, an event's `fields` and the like is printed as it is, so a view
printed by `get -o yaml` still applies back (`cli.ctl.views`). Pure."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

# Keys whose numbers are Unix times (after the camelCase rename).
TIME_KEYS = frozenset({
    "ts", "createdAt", "updatedAt", "expiresAt", "usedAt", "revokedAt", "registeredAt", "lastHeartbeat",
    "lastSeen", "electedAt", "endsAt", "startedAt", "finishedAt", "eventsLastDropAt", "notBefore", "notAfter",
    "since", "drainDeadline", "deadline",  # a drain's deadline is a wall-clock time too
})
# Subtrees holding user data or documents of their own: printed as they are.
OPAQUE = frozenset({"spec", "labels", "annotations", "env", "fields", "data", "stringData", "selector",
                    "object", "manifest", "policy", "usage", "series", "points"})
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def camel(key: str) -> str:
    if not _SNAKE.match(key):
        return key
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def printed(data: Any) -> Any:
    """`data` as -o json|yaml|jsonpath print it (a copy; `data` is not changed)."""
    if isinstance(data, list):
        return [printed(v) for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = camel(key) if isinstance(key, str) else key
        if name in OPAQUE:
            out[name] = value
        elif name in TIME_KEYS and isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            try:
                out[name] = rfc3339(float(value))
            except (OverflowError, OSError, ValueError):  # not a time after all: as it came
                out[name] = value
        else:
            out[name] = printed(value)
    return out
