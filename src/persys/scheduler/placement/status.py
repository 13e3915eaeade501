"""Rejection status: the unit of explanation (kube-scheduler's framework.Status)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Status:
    """Why one node was rejected.

    ``reason`` is the grouping text of the aggregated explanation, so it must not contain
    per-node figures; those go into ``needed``/``available`` and are aggregated separately
    ("best node has ..." is the maximum ``available`` across the group).
    """

    code: str  # machine-readable, stable (e.g. "insufficient_memory")
    reason: str  # human text shared by every node rejected for the same cause
    filter: str = ""
    needed: int | None = None
    available: int | None = None
    unit: str = ""  # "cpu" (millicores) or "MiB"

    @property
    def short_by(self) -> int | None:
        """How much more the node would need free (fit failures only)."""
        if self.needed is None or self.available is None:
            return None
        return self.needed - max(self.available, 0)

    @property
    def message(self) -> str:
        """Per-node human message: the figures too (needs, has, short by) for fit failures."""
        if self.needed is None or self.available is None:
            return self.reason
        needed, free = fmt_amount(self.needed, self.unit), fmt_amount(self.available, self.unit)
        short = fmt_amount(self.needed - max(self.available, 0), self.unit)
        return f"{self.reason} (needs {needed}, node has {free} free, short by {short})"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "code": self.code,
            "reason": self.reason,
            "filter": self.filter,
            "message": self.message,
        }
        if self.needed is not None:
            d.update(needed=self.needed, available=self.available, short_by=self.short_by, unit=self.unit)
        return d


def fmt_amount(value: int, unit: str) -> str:
    if unit == "cpu":
        return f"{value}m"
    return f"{value} {unit}" if unit else str(value)
