"""The meter's SQL, written once over both engines' common ground; a `Dialect` holds what
differs (DDL, argMax's spelling, string literals, label matching). The ClickHouse dialect
(clickhouse_sql.py) is shared by the ClickHouse server backend and the in-process chDB backend.

A raw sample reads as a rollup row of one sample (n = 1, sum = min = max = last = the value), so
one set of expressions builds rollups from raw or from finer rollups, and the partial aggregates
of a query over several tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from persys.events.samples import METRICS, NODE, WORKLOAD
from persys.meter.query import Segment, Table

KEYS = ("kind", "node", "workload", "instance", "runtime", "labels")
MARKS = "marks"


@dataclass(frozen=True)
class Dialect:
    name: str
    arg_max: str  # arg_max (DuckDB) | argMax (ClickHouse)
    quote: Callable[[str], str]
    contains: Callable[[str, str], str]  # (column, needle literal) -> whether ','+column+',' has it
    create: Callable[[str, bool], str]  # (table, is rollup) -> CREATE TABLE IF NOT EXISTS
    add_column: Callable[[str, str], str]  # (table, metric column) -> ALTER TABLE ... ADD COLUMN IF NOT EXISTS
    create_marks: str
    prefix: str = ""  # database qualifier, e.g. "persys."
    # Rollup rows written in (kind, workload, instance, bucket) order: an engine with no clustered
    # key (DuckDB) then skips, by its zone maps, the row groups and vectors of other workloads
    # (ClickHouse's MergeTree sorts by its ORDER BY key itself).
    sorted_rollups: bool = False


ORDER = ("kind", "workload", "instance")  # what a query selects by, then time: the rollups' row order


def table_name(d: Dialect, t: Table | str) -> str:
    return f"{d.prefix}meter_{t if isinstance(t, str) else t.name}"


def _cols(raw: bool, metric: str) -> tuple[str, str, str, str]:
    """sum, min, max and last of a metric as columns of a raw or a rollup table."""
    return (metric,) * 4 if raw else (f"{metric}_sum", f"{metric}_min", f"{metric}_max", f"{metric}_last")


PARTS = ("sum", "min", "max", "last")
# The partial aggregates each aggregation reads (n and last_ts always): the others are neither
# read from the table nor sent back, so a query scans and returns only its columns.
NEEDS: dict[str, tuple[str, ...]] = {"avg": ("sum",), "sum": ("sum",), "min": ("min",), "max": ("max",),
                                     "last": ("last",)}


def partials(d: Dialect, raw: bool, metrics: Sequence[str], needs: Sequence[str] = PARTS) -> list[str]:
    """Aggregates over a table's rows that merge into a rollup row: n, last_ts, then per metric
    sum, min, max, last (in that order; only those in `needs`)."""
    t = "ts" if raw else "last_ts"
    out = ["count(*)" if raw else "sum(n)", f"max({t})"]
    for m in metrics:
        s, lo, hi, last = _cols(raw, m)
        exprs = (f"sum({s})", f"min({lo})", f"max({hi})", f"{d.arg_max}({last}, {t})")
        out += [e for p, e in zip(PARTS, exprs, strict=True) if p in needs]
    return out


def rollup_columns() -> list[str]:
    out = ["bucket", *KEYS, "n", "last_ts"]
    for m in METRICS:
        out += [f"{m}_sum", f"{m}_min", f"{m}_max", f"{m}_last"]
    return out


def rollup_sql(d: Dialect, src: Table, dst: Table, lo: float, hi: float) -> str:
    """Roll `src` rows in [lo, hi) up into `dst` buckets."""
    raw = src.resolution == 0
    time_col = "ts" if raw else "bucket"
    bucket = f"floor({time_col} / {dst.resolution}) * {dst.resolution}"
    cols = ", ".join(rollup_columns())
    order = f" ORDER BY {', '.join(ORDER)}, b" if d.sorted_rollups else ""
    return (f"INSERT INTO {table_name(d, dst)} ({cols}) SELECT {bucket} AS b, {', '.join(KEYS)}, "
            f"{', '.join(partials(d, raw, METRICS))} FROM {table_name(d, src)} "
            f"WHERE {time_col} >= {lo!r} AND {time_col} < {hi!r} GROUP BY b, {', '.join(KEYS)}{order}")


COMPACTING = "meter_compacting"


def compact_sql(d: Dialect, t: Table, lo: float, hi: float, i: int = 0, slices: int = 1) -> list[str]:
    """Rewrite a rollup's rows of [lo, hi) in (kind, workload, instance, bucket) order, for an
    engine with `sorted_rollups`: each rollup pass appends a few minutes of every workload, so a
    day of one workload lies in every row group; rewritten per closed hour, it lies in about one
    row group per hour. Slice `i` of `slices` (workloads by hash) is rewritten: one transaction
    each, run by the caller; the rows are the same, so a slice not done yet only reads slower."""
    name = table_name(d, t)
    span = f"bucket >= {lo!r} AND bucket < {hi!r}"
    if slices > 1:
        span += f" AND hash(workload) % {int(slices)} = {int(i)}"
    return [f"CREATE TEMPORARY TABLE {COMPACTING} AS SELECT * FROM {name} WHERE {span} "
            f"ORDER BY {', '.join(ORDER)}, bucket",
            f"DELETE FROM {name} WHERE {span}",
            f"INSERT INTO {name} SELECT * FROM {COMPACTING}",
            f"DROP TABLE {COMPACTING}"]


def delete_sql(d: Dialect, t: Table, before: float) -> str:
    col = "ts" if t.resolution == 0 else "bucket"
    return f"DELETE FROM {table_name(d, t)} WHERE {col} < {before!r}"


def mark_sql(d: Dialect, name: str, value: float) -> str:
    return f"INSERT INTO {table_name(d, MARKS)} (name, value) VALUES ({d.quote(name)}, {value!r})"


def marks_sql(d: Dialect) -> str:
    return f"SELECT name, max(value) FROM {table_name(d, MARKS)} GROUP BY name"


def selection(d: Dialect, selector: str, value: str) -> str:
    """The WHERE condition of a selector: a workload's instances, a node's own samples, or the
    instances of workloads carrying a label (k=v); `*` with workload/node: all of that kind."""
    kind = NODE if selector == "node" else WORKLOAD
    cond = f"kind = {d.quote(kind)}"
    if selector == "label":
        return f"{cond} AND {d.contains('labels', d.quote(',' + value + ','))}"
    if value != "*":
        cond += f" AND {selector} = {d.quote(value)}"
    return cond


# A raw segment this short (the minutes after the rollups' watermark) is read as its rows, each a
# partial of one sample merged by `merge_partials`: a handful of rows per series, no hash
# aggregation in the engine.
TAIL_SECONDS = 600


def _as_rows(seg: Segment, step: int) -> bool:
    raw = seg.table.resolution == 0
    return step == seg.table.resolution or (raw and seg.end - seg.start <= TAIL_SECONDS)


def rows_per_series(segments: Sequence[Segment], step: int) -> int:
    """At most how many rows one series gets from `query_sql`: a bucket per step and segment, and
    for a short raw segment read as rows, one per second (samples come every 10 s or more)."""
    return sum(int(seg.end - seg.start) + 1 if seg.table.resolution == 0 and _as_rows(seg, step)
               else int((seg.end - seg.start) / step) + 2 for seg in segments)


def query_sql(d: Dialect, segments: Sequence[Segment], where: str, group: str, step: int,
              metrics: Sequence[str], limit: int, needs: Sequence[str] = PARTS, workload: str = "") -> str:
    """Partial aggregates per group (instance, workload or node) and step bucket from each segment
    (g, b, workload, node, n, last_ts, then per metric the parts in `needs`, in PARTS order), one
    row per group and bucket and segment: `merge_partials` combines a bucket's rows from several
    tables. A segment whose rows already are the step's buckets is read without aggregating (the
    common case: a 1-minute step over minute rollups), and so is a short raw segment (a series'
    last minutes, not rolled up yet). `workload`: the one workload the condition selects; its
    column is then left out (g, b, node, n, ...: `lead_columns`), the caller knows it, so the
    engine neither repeats it on every row nor the client converts it for each."""
    parts = []
    wl = [] if workload else ["workload"]
    for seg in segments:
        raw = seg.table.resolution == 0
        time_col = "ts" if raw else "bucket"
        tail = (f" FROM {table_name(d, seg.table)} WHERE {where} AND {time_col} >= {seg.start!r} "
                f"AND {time_col} < {seg.end!r}")
        if step and group == "instance" and _as_rows(seg, step):
            bucket = time_col if step == seg.table.resolution else f"floor({time_col} / {step}) * {step}"
            cols = [bucket, *wl, "node", "1" if raw else "n", time_col if raw else "last_ts"]
            for m in metrics:
                cols += [c for p, c in zip(PARTS, _cols(raw, m), strict=True) if p in needs]
            parts.append(f"SELECT {group} AS g, " + ", ".join(cols) + tail)
            continue
        bucket = f"floor({time_col} / {step}) * {step}" if step else "0"
        ident = "max(node) AS nd" if workload else "max(workload) AS wl, max(node) AS nd"
        parts.append(f"SELECT {group} AS g, {bucket} AS b, {ident}, "
                     + ", ".join(f"{expr} AS p{i}" for i, expr in enumerate(partials(d, raw, metrics, needs)))
                     + tail + " GROUP BY g, b")
    # Ordered by group, so that a result cut at `limit` leaves only its last group incomplete.
    body = parts[0] if len(parts) == 1 else f"SELECT * FROM ({' UNION ALL '.join(parts)}) AS u"
    return f"{body} ORDER BY 1, 2 LIMIT {int(limit)}"


def lead_columns(workload: str = "") -> int:
    """How many columns of a `query_sql` row come before n: g, b, then workload (unless the query
    named one) and node."""
    return 3 if workload else 4


Partial = Sequence[Any]  # [group, bucket, (workload,) node, n, last_ts, then the parts asked for]


def merge_partials(rows: Sequence[Sequence[Any]], parts: Sequence[str], limit: int, lead: int = 4
                   ) -> list[Partial]:
    """One row per (group, bucket), in the rows' order: the rows of a bucket merged (counts and
    sums add, min and max fold, the last value, the workload and the node are those of the latest
    sample); `lead` columns come before n (`lead_columns`), `parts` names the columns after
    last_ts (sum, min, max or last each). Rows come ordered by group and bucket (`query_sql`), so
    the rows of one bucket are adjacent: one pass, and a bucket served by one table (most) is its
    row as it came. When `limit` cut the rows, the last group may be incomplete and is left out."""
    if len(rows) >= limit and rows:
        cut = rows[-1][0]
        rows = [r for r in rows if r[0] != cut]
    out: list[Partial] = []
    last: Partial = ()
    n, lts, first = lead, lead + 1, lead + 2
    for row in rows:
        if not last or row[0] != last[0] or row[1] != last[1]:
            out.append(row)
            last = row
            continue
        cur = [*last[:lead], *(float(v) for v in last[lead:])]
        new = [float(v) for v in row[lead:]]
        later = new[1] >= cur[lts]
        cur[n] += new[0]
        for k, part in enumerate(parts):
            v = new[2 + k]
            if part == "sum":
                cur[first + k] += v
            elif part == "min":
                cur[first + k] = min(cur[first + k], v)
            elif part == "max":
                cur[first + k] = max(cur[first + k], v)
            elif later:
                cur[first + k] = v
        if later:
            cur[2:lead] = row[2:lead]
            cur[lts] = new[1]
        out[-1] = last = cur
    return out


def literal(v: object, quote: Callable[[str], str]) -> str:
    return quote(v) if isinstance(v, str) else repr(float(v))  # type: ignore[arg-type]
