"""What a meter query asks and how it is answered: pure. The bounds on every input, which table
serves which part of the range (`plan`), and how partial aggregates become values (`finish`).

Three tables hold the samples: `raw` (each sample), `m1` (1-minute rollups) and `h1` (hourly
rollups). A rollup row keeps count, sum, min, max and the last value of each metric, so any of
the aggregations can be computed from it exactly. A query uses the coarsest table whose
resolution divides its step; the part of the range that table has not rolled up yet (after its
watermark) comes from the finer tables, and partial aggregates of one step bucket are merged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from persys.events.samples import METRICS

AGGS = ("avg", "max", "min", "sum", "last")
SELECTORS = ("workload", "node", "label")
METRIC_NAMES: dict[str, str] = {m.replace("_", "-"): m for m in METRICS}  # CLI/REST spelling -> column
MAX_RANGE_SECONDS = 400 * 86_400
MIN_STEP_SECONDS = 10
MAX_POINTS = 5_000  # per series: range / step
MAX_SERIES = 200
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_LABEL = re.compile(r"^[A-Za-z0-9_./-]{1,63}=[A-Za-z0-9_./-]{0,63}$")


@dataclass(frozen=True)
class Table:
    name: str
    resolution: int  # seconds per row (0: each sample)
    retention: int  # seconds kept


@dataclass(frozen=True)
class Retention:
    """How long each table keeps its rows (`--meter-retention raw=1d,1m=30d,1h=365d`)."""

    raw: int = 86_400
    minute: int = 30 * 86_400
    hour: int = 365 * 86_400

    def tables(self) -> tuple[Table, Table, Table]:
        return Table("raw", 0, self.raw), Table("m1", 60, self.minute), Table("h1", 3600, self.hour)


class QueryError(ValueError):
    """A query the meter refuses; `field` names the input at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Query:
    selector: str  # workload | node | label
    value: str  # the workload or node name, or k=v
    metric: str  # a column of METRICS
    start: float
    end: float
    step: int
    agg: str = "avg"


def check(q: Query) -> Query:
    """The query if every input is within bounds, else QueryError naming the field."""
    if q.selector not in SELECTORS:
        raise QueryError("selector", f"must be one of {', '.join(SELECTORS)}")
    pattern = _LABEL if q.selector == "label" else _NAME
    if not pattern.match(q.value):
        raise QueryError(q.selector, "must be a name" if q.selector != "label" else "must be key=value")
    if q.metric not in METRICS:
        raise QueryError("metric", f"must be one of {', '.join(METRIC_NAMES)}")
    if q.agg not in AGGS:
        raise QueryError("agg", f"must be one of {', '.join(AGGS)}")
    check_window(q.start, q.end)
    if q.step < MIN_STEP_SECONDS:
        raise QueryError("step", f"must be at least {MIN_STEP_SECONDS}s")
    if (q.end - q.start) / q.step > MAX_POINTS:
        raise QueryError("step", f"too fine for the range: at most {MAX_POINTS} points per series")
    return q


def check_window(start: float, end: float) -> None:
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise QueryError("since", "the range must end after it starts")
    if end - start > MAX_RANGE_SECONDS:
        raise QueryError("since", f"at most {MAX_RANGE_SECONDS // 86_400} days")


@dataclass(frozen=True)
class Segment:
    table: Table
    start: float
    end: float


def serving_table(tables: tuple[Table, ...], step: int) -> int:
    """Index of the coarsest table whose resolution divides the step (0 = raw serves any)."""
    best = 0
    for i, t in enumerate(tables):
        if t.resolution and step % t.resolution == 0:
            best = i
    return best


def plan(tables: tuple[Table, ...], watermarks: dict[str, float], step: int, start: float, end: float
         ) -> list[Segment]:
    """The parts of [start, end) and the table each comes from: the serving table up to its
    watermark, each finer one from the coarser one's watermark to its own, raw for the rest.
    `step == 0`: one bucket over the whole window (a summary), served like the coarsest table."""
    k = serving_table(tables, step) if step else len(tables) - 1
    out: list[Segment] = []
    lo = start
    for i in range(k, -1, -1):
        t = tables[i]
        hi = end if i == 0 else min(end, watermarks.get(t.name, 0.0))
        if hi > lo:
            out.append(Segment(t, lo, hi))
            lo = hi
    return out


def finish(agg: str, n: float, part: float) -> float:
    """A bucket's value from its count and the one partial aggregate its aggregation reads (the
    sum for avg and sum, the minimum for min, the maximum for max, the last value for last)."""
    if agg == "avg":
        return part / n if n else 0.0
    return part


def rollup_target(resolution: int, now: float, newest: float, grace: float) -> float:
    """How far a rollup may go: whole buckets older than the newest sample stored (or now, if
    earlier) by `grace`, so samples still on their way land before their bucket is closed."""
    edge = min(now, newest) - grace
    return math.floor(edge / resolution) * resolution


@dataclass
class Series:
    key: str  # the instance (workload and label queries) or the node
    workload: str = ""
    node: str = ""
    points: list[tuple[float, float]] = field(default_factory=list)


DURATION = re.compile(r"^(\d+)(s|m|h|d|w)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def seconds(text: str, field_name: str) -> int:
    """A duration like 90s, 5m, 1h, 7d, 2w."""
    m = DURATION.match(text.strip())
    if not m:
        raise QueryError(field_name, f"{text!r} is not a duration (e.g. 30s, 5m, 1h, 7d)")
    return int(m.group(1)) * _UNIT[m.group(2)]


def parse_retention(text: str) -> Retention:
    """`raw=1d,1m=30d,1h=365d` (any subset; the others keep their defaults)."""
    values = {"raw": Retention.raw, "1m": Retention.minute, "1h": Retention.hour}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        if key not in values:
            raise QueryError("meter-retention", f"unknown table {key!r} (raw, 1m, 1h)")
        values[key] = seconds(val, "meter-retention")
    r = Retention(values["raw"], values["1m"], values["1h"])
    if not r.raw <= r.minute <= r.hour:
        raise QueryError("meter-retention", "coarser tables must keep at least as long as finer ones")
    return r
