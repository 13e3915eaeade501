"""A MeterStore over an SQL engine (sql.py builds the statements; an `Executor` runs them).

The engines' calls block, so every operation runs in a worker thread (asyncio.to_thread), one
at a time per store (DuckDB connections are not shared across threads; chDB sessions neither).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from persys.events.samples import ADDED_METRICS, METRICS, NODE, WORKLOAD, Sample
from persys.meter import sql
from persys.meter.base import Maintenance, Summary
from persys.meter.query import (
    MAX_POINTS,
    MAX_SERIES,
    Query,
    Retention,
    Segment,
    Series,
    check,
    check_window,
    finish,
    plan,
    rollup_target,
)

MARKS_TTL = 30.0
COMPACT_SLICE_ROWS = 100_000  # minute rows rewritten per transaction (~0.4 s on DuckDB here)
ROLLUP_GRACE_SECONDS = 60.0  # a bucket is closed this long after the newest sample stored passed it


class Executor(Protocol):
    engine: str
    dialect: sql.Dialect
    transactional: bool  # rollup insert and its watermark land together

    def rows(self, statement: str) -> list[tuple[Any, ...]]: ...

    def run(self, statement: str) -> None: ...

    def insert(self, samples: Sequence[Sample]) -> None: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


def summary_step(window: float) -> int:
    """The resolution a window summary may be served at: rollup boundaries misalign its start by
    at most a minute (an hour for windows of a week or more)."""
    return 3600 if window >= 7 * 86_400 else 60 if window >= 600 else 10


class SqlMeterStore:
    def __init__(self, executor: Executor, retention: Retention | None = None,
                 grace: float = ROLLUP_GRACE_SECONDS) -> None:
        self.x = executor
        self.d = executor.dialect
        self.retention = retention or Retention()
        self.tables = self.retention.tables()
        self.engine = executor.engine
        self.grace = grace
        self._lock = threading.Lock()
        self._newest: float | None = None
        self._marks_cache: dict[str, float] = {}
        self._marks_at = float("-inf")
        self._to_compact: list[tuple[float, float]] = []  # closed hours of m1 to rewrite in key order
        for t in self.tables:
            executor.run(self.d.create(sql.table_name(self.d, t), t.resolution > 0))
            for m in ADDED_METRICS:  # a store made before these metrics gains their columns (0 before)
                for col in ([f"{m}_{p}" for p in ("sum", "min", "max", "last")] if t.resolution > 0 else [m]):
                    executor.run(self.d.add_column(sql.table_name(self.d, t), col))
        executor.run(self.d.create_marks)

    async def _off_loop(self, fn: Any, *args: Any) -> Any:
        def locked() -> Any:
            with self._lock:
                return fn(*args)
        return await asyncio.to_thread(locked)

    # ------------------------------------------------------------------ writes

    async def write(self, batch: Sequence[Sample]) -> None:
        if batch:
            await self._off_loop(self._write, batch)

    def _write(self, batch: Sequence[Sample]) -> None:
        self.x.insert(batch)
        newest = max(s.ts for s in batch)
        self._newest = newest if self._newest is None else max(self._newest, newest)

    # ------------------------------------------------------------------ reads

    def _marks(self, fresh: bool = False) -> dict[str, float]:
        """The rollup watermarks, read at most every MARKS_TTL seconds for queries: a stale mark
        is safe, the finer tables still hold what it has not caught up with (they keep longer
        than rollups lag), so a query only reads a little more of them."""
        if fresh or time.monotonic() - self._marks_at > MARKS_TTL:
            self._marks_cache = {str(name): float(v) for name, v in self.x.rows(sql.marks_sql(self.d))}
            self._marks_at = time.monotonic()
        return dict(self._marks_cache)

    async def query(self, q: Query) -> list[Series]:
        return list(await self._off_loop(self._query, check(q)))

    def _query(self, q: Query) -> list[Series]:
        return self.answer(q, plan(self.tables, self._marks(), q.step, q.start, q.end))

    def answer(self, q: Query, segments: Sequence[Segment]) -> list[Series]:
        """A checked query answered from these segments (blocking; `query` plans them: the
        coarsest table that answers the step, then the finer ones after its watermark). The
        benchmark also asks it for the raw table alone, to compare the planner's choice with."""
        if not segments:
            return []
        group = "node" if q.selector == "node" else "instance"
        limit = (MAX_SERIES + 1) * sql.rows_per_series(segments, q.step)
        one = q.value if q.selector == "workload" and q.value != "*" else ""
        statement = sql.query_sql(self.d, segments, sql.selection(self.d, q.selector, q.value), group, q.step,
                                  [q.metric], limit, sql.NEEDS[q.agg], one)
        out: dict[str, Series] = {}
        series, key = Series(""), None
        lead = sql.lead_columns(one)
        for row in sql.merge_partials(self.x.rows(statement), sql.NEEDS[q.agg], limit, lead):
            g, b, nd, n, v = row[0], row[1], row[lead - 1], row[lead], row[lead + 2]
            if g != key:  # rows come ordered by series, then time
                if len(out) >= MAX_SERIES:
                    break
                series, key = Series(str(g), one or str(row[2]), str(nd)), g
                out[series.key] = series
            series.points.append((float(b), finish(q.agg, float(n), float(v))))
            series.node = nd  # the latest bucket's: an instance may have moved
        for series in out.values():
            series.node = str(series.node)
            del series.points[MAX_POINTS:]
        return list(out.values())

    async def summary(self, kind: str, start: float, end: float, limit: int = 500) -> list[Summary]:
        check_window(start, end)
        return list(await self._off_loop(self._summary, kind, start, end, max(1, min(limit, 5_000))))

    def _summary(self, kind: str, start: float, end: float, limit: int) -> list[Summary]:
        node = kind == NODE
        segments = plan(self.tables, self._marks(), summary_step(end - start), start, end)
        if not segments:
            return []
        where = sql.selection(self.d, "node" if node else "workload", "*")
        rows = (limit + 1) * len(segments)
        statement = sql.query_sql(self.d, segments, where, "node" if node else "workload", 0, METRICS, rows)
        out = []
        merged = sorted(sql.merge_partials(self.x.rows(statement), sql.PARTS * len(METRICS), rows),
                        key=lambda r: str(r[0]))
        for p in merged[:limit]:
            n = float(p[4])
            item = Summary(str(p[0]), int(n), node=str(p[3]) if not node else "")
            for i, m in enumerate(METRICS):
                item.avg[m] = float(p[6 + 4 * i]) / n if n else 0.0
                item.max[m] = float(p[8 + 4 * i])
            out.append(item)
        return out

    # ------------------------------------------------------------------ rollups and retention

    async def maintain(self, now: float) -> Maintenance:
        done: Maintenance = await self._off_loop(self._maintain, now)
        # The closed hours' minutes rewritten in key order, a slice of workloads per transaction,
        # the lock released between slices: queries wait for one slice, not for the hour's rows.
        while self._to_compact:
            lo, hi = self._to_compact[0]
            slices = await self._off_loop(self._slices, lo, hi)
            for i in range(slices):
                await self._off_loop(self._compact, lo, hi, i, slices)
            self._to_compact.pop(0)
        return done

    def _slices(self, lo: float, hi: float) -> int:
        got = self.x.rows(f"SELECT count(*) FROM {sql.table_name(self.d, self.tables[1])} "
                          f"WHERE bucket >= {lo!r} AND bucket < {hi!r}")
        return max(1, -(-int(got[0][0]) // COMPACT_SLICE_ROWS))

    def _compact(self, lo: float, hi: float, i: int, slices: int) -> None:
        """One slice, all or nothing. (An hour not rewritten, after a failure or a restart, holds
        the same rows in the order they came: only its reads are slower.)"""
        self.x.run("BEGIN TRANSACTION")
        try:
            for statement in sql.compact_sql(self.d, self.tables[1], lo, hi, i, slices):
                self.x.run(statement)
        except BaseException:
            self.x.run("ROLLBACK")
            raise
        self.x.run("COMMIT")

    def _maintain(self, now: float) -> Maintenance:
        raw, m1, h1 = self.tables
        if self._newest is None:
            got = self.x.rows(f"SELECT max(ts) FROM {sql.table_name(self.d, raw)}")
            self._newest = float(got[0][0]) if got and got[0][0] is not None else 0.0
        marks = self._marks(fresh=True)
        m1_before = marks.get(m1.name, 0.0)
        rolled: dict[str, float] = {}
        target_m1 = rollup_target(m1.resolution, now, self._newest, self.grace)
        for src, dst, target in ((raw, m1, target_m1), (m1, h1, None)):
            if target is None:  # hours close once their minutes are rolled up
                target = (marks.get(m1.name, 0.0) // h1.resolution) * h1.resolution
            since = marks.get(dst.name, 0.0)
            if target > since:
                # The minutes of these hours are rewritten in order unless this pass wrote them all
                # at once (sorted already: a backfill, or a meter catching up).
                self._roll(src, dst, since, target)
                if self.d.sorted_rollups and src is m1 and m1_before > since:
                    self._to_compact.append((since, target))
                marks[dst.name] = rolled[dst.name] = target
        deleted = {}
        for t in self.tables:
            before = now - t.retention
            self.x.run(sql.delete_sql(self.d, t, before))
            deleted[t.name] = before
        self._marks_cache, self._marks_at = marks, time.monotonic()
        return Maintenance(rolled, deleted)

    def _roll(self, src: Any, dst: Any, since: float, target: float) -> None:
        statements = [sql.rollup_sql(self.d, src, dst, since, target), sql.mark_sql(self.d, dst.name, target)]
        if self.x.transactional:
            statements = ["BEGIN TRANSACTION", *statements, "COMMIT"]
        for s in statements:
            self.x.run(s)

    async def bytes_on_disk(self) -> int:
        return int(await self._off_loop(self.x.size))

    async def close(self) -> None:
        await self._off_loop(self.x.close)


__all__ = ["WORKLOAD", "Executor", "SqlMeterStore", "summary_step"]
