"""The rollups' row order on DuckDB (no clustered index): a meter that rolls up every few minutes
appends a few minutes of every workload each time; once an hour is closed its minutes are
rewritten in (kind, workload, instance, bucket) order, so DuckDB's zone maps skip the other
workloads' rows. Answers stay the same."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from persys.meter import sql_store
from persys.meter.duckdb_store import open_duckdb
from persys.meter.query import Query
from tests.meter.test_contract import T0, close, expected, samples

RUN = asyncio.run


def _runs_in_order(keys: list[tuple[Any, ...]]) -> bool:
    """Each hour's rows: every workload's rows in one run, in (instance, bucket) order."""
    for hour in sorted({k[3] // 3600 for k in keys}):
        rows = [k for k in keys if k[3] // 3600 == hour]
        runs = [k[1] for i, k in enumerate(rows) if i == 0 or rows[i - 1][1] != k[1]]
        if len(runs) != len(set(runs)) or any(rows[i - 1] > rows[i] for i in range(1, len(rows))
                                              if rows[i - 1][1] == rows[i][1]):
            return False
    return True


@pytest.mark.parametrize("slice_rows", [100_000, 100])  # one transaction an hour; four, by workload hash
def test_closed_hours_are_rewritten_in_key_order_and_answer_the_same(tmp_path: Path, slice_rows: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_store, "COMPACT_SLICE_ROWS", slice_rows)
    store = open_duckdb(tmp_path / "meter.duckdb")
    names = ["lay-c", "lay-a", "lay-b"]
    batch = [s for n in names for s in samples(n, 2, T0, 3 * 360)]  # three hours of 3 workloads x 2 instances
    for minute in range(0, 3 * 60, 5):  # as the meter runs: samples arrive, rollups every 5 minutes
        lo, hi = T0 + minute * 60, T0 + (minute + 5) * 60
        RUN(store.write([s for s in batch if lo <= s.ts < hi]))
        RUN(store.maintain(hi + 120))
    marks = store._marks(fresh=True)
    assert marks["h1"] >= T0 + 2 * 3600  # two closed hours: their minutes were rewritten
    keys = store.x.rows(f"SELECT kind, workload, instance, bucket FROM meter_m1 WHERE bucket < {marks['h1']!r}")
    # Hour after hour (each rewritten when it closed), each hour's minutes in key order (by
    # slices of workloads when an hour has more rows than a slice).
    assert len(keys) == 2 * 60 * 6 and _runs_in_order(keys)
    assert [k[3] // 3600 for k in keys] == sorted(k[3] // 3600 for k in keys)
    if slice_rows > len(keys):
        assert keys == sorted(keys, key=lambda k: (k[3] // 3600, k))
    assert not _runs_in_order(sorted(keys, key=lambda k: k[3]))  # (as the passes appended them: by time first)
    for step, agg in ((60, "avg"), (60, "last"), (300, "max"), (3600, "sum")):
        got = RUN(store.query(Query("workload", "lay-a", "cpu", T0, T0 + 3 * 3600, step, agg)))
        assert sorted(s.key for s in got) == ["lay-a", "lay-a.1"]
        for series in got:
            mine = [(x.ts, x.cpu) for x in batch if x.instance == series.key]
            want = [p for p in expected(mine, step, agg) if p[0] < T0 + 3 * 3600]
            assert close(series.points, want), (step, agg, series.key)
    RUN(store.close())
