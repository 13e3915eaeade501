"""Disk-space forecasts (docs/intelligence.md, "Forecasts"): per node and per cluster, with the
backtested MASE and 80 % coverage like CPU and memory, on synthetic series (a filesystem that
grows, fills with a nightly backup and frees it, plus noise), and the meter's migration that
gives an older store the disk_used column. The real report path (agent -> scheduler -> meter
-> forecast) is tests/e2e/test_intelligence_disk.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persys.events.samples import NODE, Sample
from persys.intelligence.analyses import forecast_usage
from persys.intelligence.evidence import Series
from persys.meter.query import Query

STEP = 300.0
N = 14 * 288  # two weeks at five minutes
GIB = 2.0**30
NOW = 1_800_000_000.0


def disk_used(seed: int, base: float = 40.0) -> list[tuple[float, float]]:
    """Bytes used: +0.4 GiB a day (logs, images), a nightly backup of ~3 GiB written from 01:00 and
    removed by the morning (a daily bump with a harmonic), noise of 0.15 GiB."""
    rng = np.random.default_rng(seed)
    t = NOW - (N - np.arange(N)) * STEP
    day = 2 * np.pi * t / 86400
    y = (base + 0.4 * np.arange(N) * STEP / 86400 + 2.0 * np.sin(day) + 0.8 * np.sin(2 * day + 1)
         + rng.normal(0, 0.15, N)) * GIB
    return list(zip(t.tolist(), y.tolist(), strict=True))


class Reader:
    """The meter's node series as UsageReader answers them, from given points (a stand-in for the
    meter here; the e2e reads the real one)."""

    def __init__(self, nodes: dict[str, list[tuple[float, float]]]) -> None:
        self.points = nodes
        self.asked: list[tuple[str, str, str, str]] = []

    async def nodes(self) -> list[dict[str, Any]]:
        return [{"id": n, "status": "Ready", "capabilities": {"cpuMillicores": 2000, "diskMb": 200 * 1024}}
                for n in self.points]

    async def series(self, selector: str, name: str, metric: str, agg: str, window: float
                     ) -> tuple[list[Series], list[str]]:
        self.asked.append((selector, name, metric, agg))
        pts = tuple(self.points[name])
        return [Series(f"{selector}/{name}", metric, agg, int(STEP), pts[0][0], pts[-1][0], pts, name)], []


@pytest.mark.parametrize("seed", range(8))
async def test_a_node_disk_forecast_has_mase_under_1_and_80_percent_coverage(seed: int) -> None:
    reader = Reader({"n1": disk_used(seed)})
    f = await forecast_usage(reader, "node", "n1", "disk", 14 * 86400, 86400)  # type: ignore[arg-type]
    assert reader.asked == [("node", "n1", "disk-used", "avg")]  # the meter's disk-space series
    assert f["verdict"] == "forecast" and f["unit"] == "bytes", f
    assert f["mase"] < 1 and 0.70 <= f["coverage80"] <= 0.90, (f["mase"], f["coverage80"])
    assert f["evidence"] == [f"meter:node/n1/disk-used/avg/300s@{int(reader.points['n1'][0][0])}-"
                             f"{int(reader.points['n1'][-1][0])}"]
    # A day ahead: about the last day's level plus 0.4 GiB of growth.
    last_day = np.mean([v for _, v in reader.points["n1"][-288:]])
    assert abs(np.mean([p[1] for p in f["points"]]) - last_day - 0.4 * GIB) < 0.3 * GIB


@pytest.mark.parametrize("seed", range(4))
async def test_the_cluster_disk_forecast_sums_the_nodes(seed: int) -> None:
    reader = Reader({"n1": disk_used(seed), "n2": disk_used(50 + seed, base=90.0)})
    f = await forecast_usage(reader, "cluster", "", "disk", 14 * 86400, 86400)  # type: ignore[arg-type]
    assert f["subject"] == "cluster" and f["verdict"] == "forecast" and len(f["evidence"]) == 2
    assert f["mase"] < 1 and 0.70 <= f["coverage80"] <= 0.90, (f["mase"], f["coverage80"])
    assert 130 * GIB < f["points"][0][1] < 145 * GIB  # 40 + 90 GiB and two weeks of growth on each


async def test_flat_noise_on_disk_is_unpredictable() -> None:
    rng = np.random.default_rng(7)
    pts = [(NOW - (N - i) * STEP, (40 + rng.normal(0, 0.2)) * GIB) for i in range(N)]
    f = await forecast_usage(Reader({"n1": pts}), "node", "n1", "disk", 14 * 86400, 86400)  # type: ignore[arg-type]
    assert f["verdict"] == "unpredictable" and f["unpredictable"]


async def test_an_older_meter_store_gains_the_disk_used_column(tmp_path: Path) -> None:
    import duckdb

    from persys.meter.duckdb_store import open_duckdb

    old = ("cpu", "memory", "disk_read", "disk_write", "net_rx", "net_tx")  # the schema before disk_used
    con = duckdb.connect(str(tmp_path / "meter.duckdb"))
    keys = "kind VARCHAR, node VARCHAR, workload VARCHAR, instance VARCHAR, runtime VARCHAR, labels VARCHAR"
    con.execute(f"CREATE TABLE meter_raw (ts DOUBLE, {keys}, " + ", ".join(f"{m} DOUBLE" for m in old) + ")")
    con.execute("INSERT INTO meter_raw VALUES (?, 'node', 'n1', '', '', '', '', 5, 1, 0, 0, 0, 0)", [NOW - 120])
    con.close()
    store = open_duckdb(tmp_path / "meter.duckdb")
    try:
        await store.write([Sample(NOW - 60, NODE, "n1", cpu=7, memory=2, disk_used=40 * GIB)])
        ans = await store.query(Query("node", "n1", "disk_used", NOW - 600, NOW, 60, "max"))
        values = sorted(v for s in ans for _, v in s.points)
        assert values == [0.0, 40 * GIB], ans  # the old row reads 0, the new one its bytes
    finally:
        await store.close()


async def test_a_disk_forecast_crossing_capacity_is_a_capacity_insight() -> None:
    from persys.intelligence.insights import capacity_recommendation

    reader = Reader({"n1": disk_used(3)})
    f = await forecast_usage(reader, "cluster", "", "disk", 14 * 86400, 86400)  # type: ignore[arg-type]
    top = max(p[1] for p in f["points"])
    rec = capacity_recommendation(f, top * 0.99)  # a filesystem just under the forecast's peak
    assert rec is not None and rec["summary"].startswith("disk forecast reaches") and rec["evidence"] == f["evidence"]
    assert capacity_recommendation(f, top * 2) is None
