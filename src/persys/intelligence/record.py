"""The record of investigations: every `why` answered, conclusive or not, kept (bounded) with
what it looked at, so an inconclusive run leaves a trace an operator can find again
(`GET /v1/investigations`). In memory in the gateway that answered:
the analysis identity may write nothing to the cluster, so the record is not in the store."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from persys.intelligence.findings import Investigation

KEEP = 500


@dataclass
class InvestigationRecord:
    keep: int = KEEP
    _items: deque[dict[str, Any]] = field(default_factory=deque)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, inv: Investigation, at: float, asked_by: str) -> dict[str, Any]:
        entry = {"id": next(self._ids), "at": at, "subject": inv.subject, "askedBy": asked_by,
                 "inconclusive": inv.inconclusive, "first": inv.findings[0].cause if inv.findings else None,
                 "causes": [f.cause for f in inv.findings], "lookedAt": list(inv.looked_at),
                 "dropped": list(inv.dropped)}
        self._items.append(entry)
        while len(self._items) > self.keep:
            self._items.popleft()
        return entry

    def list(self, subject: str = "", inconclusive: bool | None = None, limit: int = 100) -> list[dict[str, Any]]:
        out = [e for e in reversed(self._items) if (not subject or e["subject"] == subject)
               and (inconclusive is None or e["inconclusive"] == inconclusive)]
        return out[:max(1, min(limit, self.keep))]
