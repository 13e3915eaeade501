"""Disk space on the real report path: an agent (its state folder on this machine's filesystem)
reports the bytes used with its usage, the scheduler publishes them as the node's `disk_used`
sample, Persys Meter (DuckDB) stores them, `persysctl meter query --metric disk-used` reads them
back at what the filesystem says, and `persysctl forecast node N --metric disk` forecasts from
that series (citing it). OS processes: a scheduler with the meter, one agent, the gateway."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.e2e.harness import Components, eventually

pytestmark = pytest.mark.e2e
MIB = 2**20


def test_an_agents_disk_space_reaches_the_meter_and_its_forecast(tmp_path: Path) -> None:
    c = Components(tmp_path, f"sqlite:///{tmp_path / 'state.db'}", nodes=("dk1",),
                   scheduler_args=("--meter", f"duckdb:{tmp_path / 'meter.duckdb'}"))
    try:
        t0 = time.monotonic()

        def disk_points() -> list[float] | None:
            ans = json.loads(c.ctl("meter", "query", "--node", "dk1", "--metric", "disk-used", "--since", "10m",
                                   "--step", "10s", "--agg", "max", "-o", "json").stdout)
            values = [v for s in ans["series"] for _, v in s["points"] if v > 0]
            return values or None

        # Agents report usage at least every 10 s, the meter ingests in batches: generous under load.
        values, took = eventually(disk_points, 120, "the node's disk-used samples in the meter")
        truth = shutil.disk_usage(tmp_path / "agent-dk1").used
        print(f"\ndisk-used: first sample {took:.1f} s after asking ({time.monotonic() - t0:.1f} s), meter "
              f"{values[-1] / MIB:.0f} MiB, statvfs now {truth / MIB:.0f} MiB")
        # The same filesystem, measured a few seconds apart on a machine others write to as well.
        assert abs(values[-1] - truth) <= max(0.02 * truth, 512 * MIB), (values[-1], truth)
        assert values[-1] % MIB == 0  # the agent reports whole MiB

        f = json.loads(c.ctl("forecast", "node", "dk1", "--metric", "disk", "--since", "10m", "--horizon", "1m",
                             "-o", "json").stdout)
        assert f["metric"] == "disk" and f["unit"] == "bytes" and f["subject"] == "node/dk1", f
        assert f["evidence"] and all(e.startswith("meter:node/dk1/disk-used/avg/") for e in f["evidence"]), f
        # Minutes of history: too little to forecast (or a forecast with its backtest); never an error.
        assert f["verdict"] in ("insufficient history", "forecast", "unpredictable"), f
        cluster = json.loads(c.ctl("forecast", "cluster", "--metric", "disk", "--since", "10m", "--horizon", "1m",
                                   "-o", "json").stdout)
        assert cluster["subject"] == "cluster" and cluster["evidence"], cluster
        assert all(e.startswith("meter:node/dk1/disk-used/") for e in cluster["evidence"]), cluster
    finally:
        c.stop()
