"""The `MeterStore` contract every backend meets (tests/meter/ runs one suite over all of them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from persys.events.samples import Sample
from persys.meter.query import Query, Retention, Series


class MeterUnavailable(Exception):
    """The meter's store cannot answer (not configured, or its engine is down)."""


@dataclass
class Summary:
    """One workload's or node's usage over a window (`persysctl top --since`)."""

    name: str
    samples: int
    avg: dict[str, float] = field(default_factory=dict)  # metric -> average
    max: dict[str, float] = field(default_factory=dict)  # metric -> maximum
    node: str = ""


@dataclass
class Maintenance:
    rolled: dict[str, float]  # table -> its new watermark
    deleted_before: dict[str, float]  # table -> rows older than this were deleted


@runtime_checkable
class MeterStore(Protocol):
    retention: Retention
    engine: str  # e.g. "duckdb 1.4.0", "clickhouse 25.8 (chdb)"

    async def write(self, batch: Sequence[Sample]) -> None:
        """Store samples (raw); idempotence is not promised: the ingester acks after this."""
        ...

    async def query(self, q: Query) -> list[Series]:
        """The series a checked query selects, one per instance (or node), at most MAX_SERIES."""
        ...

    async def summary(self, kind: str, start: float, end: float, limit: int = 500) -> list[Summary]:
        """Average and maximum of every metric per workload (kind "workload") or node over a window."""
        ...

    async def maintain(self, now: float) -> Maintenance:
        """Roll finished buckets up and delete what is past retention."""
        ...

    async def bytes_on_disk(self) -> int: ...

    async def close(self) -> None: ...
