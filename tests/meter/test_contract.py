"""One contract over every MeterStore backend: embedded DuckDB and ClickHouse (on chDB, the
ClickHouse engine in-process, sending the same statements as the server backend: meter/
clickhouse_sql.py). Each backend's store is shared by the module; each test writes its own
workloads, and the retention test, which deletes, runs last."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest

from persys.events.samples import NODE, WORKLOAD, Sample
from persys.meter.base import MeterStore
from persys.meter.query import MAX_SERIES, Query, QueryError, Retention

T0 = 1_700_006_400.0  # a whole hour
RUN = asyncio.run


@pytest.fixture(scope="module", params=["duckdb", "chdb"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeterStore]:
    path = tmp_path_factory.mktemp(f"meter-{request.param}")
    s: MeterStore
    if request.param == "duckdb":
        from persys.meter.duckdb_store import open_duckdb

        s = open_duckdb(path / "meter.duckdb", Retention(raw=86_400, minute=7 * 86_400, hour=30 * 86_400))
    else:
        from persys.meter.clickhouse_store import open_chdb

        s = open_chdb(path / "ch", Retention(raw=86_400, minute=7 * 86_400, hour=30 * 86_400))
    yield s
    RUN(s.close())


def cpu_at(i: int) -> float:
    return float((i * 7) % 13)  # varies within every minute: avg, min, max, last all differ


def samples(workload: str, instances: int, start: float, count: int, *, labels: str = "", node: str = "n1"
            ) -> list[Sample]:
    return [Sample(start + 10 * i, WORKLOAD, node, workload, f"{workload}.{r}" if r else workload, "container",
                   labels, cpu=cpu_at(i) + r, memory=1e6 * (r + 1), net_rx=100.0 * i)
            for r in range(instances) for i in range(count)]


def expected(values: list[tuple[float, float]], step: int, agg: str) -> list[tuple[float, float]]:
    """The reference answer, computed here from the samples: bucket, then aggregate."""
    buckets: dict[float, list[tuple[float, float]]] = {}
    for ts, v in values:
        buckets.setdefault(math.floor(ts / step) * step, []).append((ts, v))
    out = []
    for b, pts in sorted(buckets.items()):
        vs = [v for _, v in pts]
        value = {"avg": sum(vs) / len(vs), "max": max(vs), "min": min(vs), "sum": sum(vs),
                 "last": max(pts)[1]}[agg]
        out.append((b, value))
    return out


def close(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and math.isclose(x[1], y[1], abs_tol=1e-9)
                                    for x, y in zip(a, b, strict=True))


def test_a_workloads_instances_at_a_step(store: MeterStore) -> None:
    name = "agg"
    batch = samples(name, 2, T0, 60)  # 10 minutes of two instances
    RUN(store.write(batch))
    for agg in ("avg", "max", "min", "sum", "last"):
        got = RUN(store.query(Query("workload", name, "cpu", T0, T0 + 600, 60, agg)))
        assert sorted(s.key for s in got) == [name, f"{name}.1"]
        for s in got:
            mine = [(x.ts, x.cpu) for x in batch if x.instance == s.key]
            assert s.workload == name and s.node == "n1"
            assert close(s.points, expected(mine, 60, agg)), (agg, s.key, s.points)


def test_node_and_label_selectors(store: MeterStore) -> None:
    RUN(store.write(samples("lbl-a", 1, T0, 12, labels="app=shop,tier=web")
                    + samples("lbl-b", 1, T0, 12, labels="app=shop2")
                    + [Sample(T0 + 10 * i, NODE, "sel-node", cpu=30.0 + i) for i in range(12)]))
    shop = RUN(store.query(Query("label", "app=shop", "cpu", T0, T0 + 120, 60, "avg")))
    assert [s.key for s in shop] == ["lbl-a"]  # app=shop2 is another label
    web = RUN(store.query(Query("label", "tier=web", "net_rx", T0, T0 + 120, 60, "max")))
    assert web[0].points == [(T0, 500.0), (T0 + 60, 1100.0)]
    node = RUN(store.query(Query("node", "sel-node", "cpu", T0, T0 + 120, 60, "min")))
    assert [(s.key, s.points) for s in node] == [("sel-node", [(T0, 30.0), (T0 + 60, 36.0)])]


def test_a_range_selects_only_its_buckets(store: MeterStore) -> None:
    RUN(store.write(samples("rng", 1, T0, 60)))
    got = RUN(store.query(Query("workload", "rng", "cpu", T0 + 120, T0 + 300, 60, "avg")))
    assert [p[0] for p in got[0].points] == [T0 + 120, T0 + 180, T0 + 240]
    assert RUN(store.query(Query("workload", "nobody", "cpu", T0, T0 + 600, 60, "avg"))) == []


def test_summary_over_a_window(store: MeterStore) -> None:
    batch = samples("sum-w", 1, T0, 30)
    RUN(store.write(batch))
    rows = {r.name: r for r in RUN(store.summary(WORKLOAD, T0, T0 + 300))}
    got = rows["sum-w"]
    assert got.samples == 30 and got.node == "n1"
    assert math.isclose(got.avg["cpu"], sum(s.cpu for s in batch) / 30)
    assert got.max["cpu"] == max(s.cpu for s in batch) and got.avg["memory"] == 1e6
    nodes = {r.name for r in RUN(store.summary(NODE, T0, T0 + 300))}
    assert "sel-node" in nodes and "sum-w" not in nodes


def test_hostile_values_are_refused_not_run(store: MeterStore) -> None:
    for bad in ("x' OR '1'='1", "a;DROP TABLE meter_raw", "UPPER"):
        with pytest.raises(QueryError):
            RUN(store.query(Query("workload", bad, "cpu", T0, T0 + 600, 60, "avg")))
    assert RUN(store.query(Query("workload", "rng", "cpu", T0, T0 + 600, 60, "avg")))  # still there


def test_series_are_bounded(store: MeterStore) -> None:
    many = MAX_SERIES + 5
    RUN(store.write([Sample(T0, WORKLOAD, "n1", "wide", f"wide.{i}", labels="fan=out") for i in range(many)]))
    assert len(RUN(store.query(Query("label", "fan=out", "cpu", T0, T0 + 60, 60, "avg")))) == MAX_SERIES


def test_series_read_as_rows_are_whole(store: MeterStore) -> None:
    """The last minutes come from raw as rows (several per bucket): the row limit still lets
    every one of MAX_SERIES series through whole."""
    many = MAX_SERIES + 5
    RUN(store.write([Sample(T0 + 10 * k, WORKLOAD, "n1", "tall", f"tall.{i:03d}", labels="tall=yes", cpu=float(k))
                     for i in range(many) for k in range(60)]))
    got = RUN(store.query(Query("label", "tall=yes", "cpu", T0, T0 + 600, 60, "avg")))
    assert len(got) == MAX_SERIES and all(len(s.points) == 10 for s in got)
    assert got[0].key == "tall.000" and got[0].points[:2] == [(T0, 2.5), (T0 + 60, 8.5)]


def test_rollups_answer_as_raw_did_then_retention_deletes(store: MeterStore) -> None:
    name = "roll"
    batch = samples(name, 1, T0, 3 * 360)  # three hours at 10 s
    # A later sample (another node's) tells the store those hours are over: rollups close buckets
    # only once a minute has passed after them in the samples stored.
    RUN(store.write([*batch, Sample(T0 + 3 * 3600 + 300, NODE, "tick")]))
    values = [(s.ts, s.cpu) for s in batch]
    queries = [(60, "avg"), (60, "last"), (300, "max"), (3600, "avg"), (3600, "min"), (3600, "sum")]

    def answers() -> list[list[tuple[float, float]]]:
        return [RUN(store.query(Query("workload", name, "cpu", T0, T0 + 3 * 3600, step, agg)))[0].points
                for step, agg in queries]

    before = answers()
    for (step, agg), got in zip(queries, before, strict=True):
        assert close(got, expected(values, step, agg)), (step, agg)
    done = RUN(store.maintain(T0 + 4 * 3600))  # rolls minutes and hours up; nothing is old enough to delete
    assert done.rolled["m1"] >= T0 + 3 * 3600 and done.rolled["h1"] >= T0 + 3 * 3600
    assert all(close(a, b) for a, b in zip(answers(), before, strict=True))
    # A day later raw samples are gone, the rollups still answer steps they divide.
    RUN(store.maintain(T0 + 86_400 + 4 * 3600))
    assert RUN(store.query(Query("workload", name, "cpu", T0, T0 + 3 * 3600, 10, "avg"))) == []
    assert all(close(a, b) for a, b in zip(answers(), before, strict=True))
    # Past the minute rollups' retention only hours remain.
    RUN(store.maintain(T0 + 8 * 86_400))
    assert RUN(store.query(Query("workload", name, "cpu", T0, T0 + 3 * 3600, 60, "avg"))) == []
    assert close(RUN(store.query(Query("workload", name, "cpu", T0, T0 + 3 * 3600, 3600, "max")))[0].points,
                 expected(values, 3600, "max"))
    assert RUN(store.bytes_on_disk()) > 0


def test_engine_is_named(store: MeterStore) -> None:
    assert store.engine.split()[0] in ("duckdb", "clickhouse")
    print(f"meter contract engine: {store.engine}")


