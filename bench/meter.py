"""Persys Meter: ingest rate, query latency and bytes on disk (a benchmark, not a test).

    .venv/bin/python bench/meter.py [--seconds 30] [--nodes 5000] [--workloads-per-node 10]
                                    [--history-workloads 100] [--queries 200] [--engines duckdb,chdb]
                                    [--skip-ingest]

Ingest: 5,000 nodes x 10 workloads sampled every 10 s is 5,000 samples/s. A producer builds that
many samples a second (a tenth of the instances every 100 ms) and offers them to the replicas'
SampleOutbox, which publishes batches on a private Redis (the RedisSampleBus stream and consumer
group); the meter's Ingester reads them back and writes the store, as in a scheduler running
`--meter`. Printed: the rate stored, the ingester's largest lag (age of the oldest sample of a
batch when stored) and backlog; the baseline is the same rows inserted into the bare engine in
the same run (no bus, no batching), so the ratio shows what the ingest path costs.

Query: 24 hours of samples of --history-workloads workloads (one every 10 s) are written and
rolled up, then one workload's 24 hours at a 1-minute step (avg) is asked --queries times three
ways, one of each in turn: through the store (planned: the 1-minute rollups, then raw for the
minutes after their watermark); through the store answering from the raw table alone (what the
planner chose the rollups over: same SQL builder, same merge, same answer); and the bare
aggregation over raw written by hand. Printed: p50 and p99 wall time of each, the process's CPU
time per query (p50; on a shared machine the figure others' load moves least), the ratios of
the rollups to both baselines (below 1: the rollups are faster) and the load average: compare
the ratios, not the absolute figures. `--history-workloads 1000` shows what the rollups' layout
is for (8.64 million raw samples). `--skip-ingest`: the query part only.

Bytes on disk per sample: the store's files after the history is loaded and rolled up (raw plus
rollups), divided by the raw samples.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis.asyncio as aioredis  # noqa: E402

from bench.scale import infra  # noqa: E402
from persys.events.sample_outbox import SampleOutbox  # noqa: E402
from persys.events.sample_redis import RedisSampleBus  # noqa: E402
from persys.events.samples import WORKLOAD, Sample, encode  # noqa: E402
from persys.meter import sql  # noqa: E402
from persys.meter.query import Query, Segment  # noqa: E402
from persys.meter.runner import Meter  # noqa: E402
from persys.meter.sql_store import SqlMeterStore  # noqa: E402

DAY = 86_400


def open_store(engine: str, path: Path) -> SqlMeterStore:
    if engine == "duckdb":
        from persys.meter.duckdb_store import open_duckdb

        return open_duckdb(path / "meter.duckdb")
    from persys.meter.clickhouse_store import open_chdb

    return open_chdb(path / "chdb")


def sample(node: int, w: int, ts: float) -> Sample:
    name = f"w{node:05d}-{w}"
    jitter = (int(ts * 7919) + node * 31 + w) % 997 / 997  # deterministic noise: real figures move
    return Sample(ts, WORKLOAD, f"node-{node:05d}", name, name, "container", "app=bench",
                  cpu=(node * 7 + w) % 100 * (0.5 + jitter), memory=1e8 * (1 + jitter / 10),
                  disk_read=1e4 * jitter, net_rx=1e5 * jitter)


async def ingest(engine: str, redis_url: str, tmp: Path, seconds: float, nodes: int, per_node: int
                 ) -> dict[str, Any]:
    store = open_store(engine, tmp / f"ingest-{engine}")
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    bus = RedisSampleBus(client, stream=f"persys:samples:{engine}", maxlen=100_000)
    await client.delete(bus.stream)
    meter = Meter(store, bus, "meter-bench", maintain_every=3600)
    outbox = SampleOutbox(bus)
    instances = [(n, w) for n in range(nodes) for w in range(per_node)]
    tick = 0.1
    per_tick = len(instances) / 10 * tick  # every instance once per 10 s
    meter.start()
    publisher = asyncio.create_task(outbox.run())
    t0 = time.monotonic()
    offered, i, max_backlog = 0, 0, 0
    while time.monotonic() - t0 < seconds:
        due = int((time.monotonic() - t0) / tick * per_tick) - offered
        now = time.time()
        batch = [sample(*instances[(i + k) % len(instances)], now) for k in range(due)]
        i += due
        offered += due
        outbox.offer(batch)
        max_backlog = max(max_backlog, meter.ingester.backlog)
        await asyncio.sleep(tick)
    produced_for = time.monotonic() - t0
    stored_at_end = meter.ingester.stats.samples
    drain_t0 = time.monotonic()
    for _ in range(1200):  # the rest the ingester has not stored yet, for up to a minute
        if meter.ingester.stats.samples >= offered - outbox.counts.dropped_full:
            break
        await asyncio.sleep(0.05)
    drain = time.monotonic() - drain_t0
    st = meter.ingester.stats
    publisher.cancel()
    await meter.stop()  # closes the store and the bus
    return {"offered": offered, "offered_per_s": round(offered / produced_for), "stored": st.samples,
            "stored_per_s_during_run": round(stored_at_end / produced_for),
            "dropped": outbox.counts.dropped_full + outbox.counts.dropped_bus, "drain_after_stop_s": round(drain, 2),
            "max_lag_s": round(st.max_lag_seconds, 2), "max_backlog_entries": max_backlog,
            "write_failures": st.write_failures}


async def bare_insert(engine: str, tmp: Path, rows: int) -> float:
    """Baseline: the same rows written straight into the engine, 5,000 at a time, no bus."""
    store = open_store(engine, tmp / f"bare-{engine}")
    now = time.time()
    batches = [[sample(n, w, now) for n in range(k, k + 500) for w in range(10)] for k in range(0, rows // 10, 500)]
    t0 = time.monotonic()
    for b in batches:
        await asyncio.to_thread(store.x.insert, b)
    rate = sum(map(len, batches)) / (time.monotonic() - t0)
    await store.close()
    return rate


async def history(engine: str, tmp: Path, workloads: int, queries: int) -> dict[str, Any]:
    store = open_store(engine, tmp / f"history-{engine}")
    end = (time.time() // 3600) * 3600
    start = end - DAY
    t0 = time.monotonic()
    rows = 0
    for k in range(0, DAY, 3600):  # an hour of every workload per write
        batch = [sample(n, 0, start + k + s) for n in range(workloads) for s in range(0, 3600, 10)]
        await store.write(batch)
        rows += len(batch)
    load_s = time.monotonic() - t0
    t0 = time.monotonic()
    await store.maintain(end + 120)
    rollup_s = time.monotonic() - t0
    size = await store.bytes_on_disk()
    one = f"w{min(7, workloads - 1):05d}-0"
    q = Query("workload", one, "cpu", start, end, 60, "avg")
    raw = store.tables[0]
    by_hand = (f"SELECT floor(ts / 60) * 60 AS b, avg(cpu) FROM {sql.table_name(store.d, raw)} WHERE kind = "
               f"'workload' AND workload = '{one}' AND ts >= {start} AND ts < {end} GROUP BY b ORDER BY b")
    # Three ways to the same minutes, one of each in turn (a change in the machine's load hits
    # them alike, so their ratios hold on a busy machine where the absolute figures do not):
    # the store's query (planned: the minute rollups, then raw after their watermark); the
    # store's query answered from the raw table alone (what the planner chose the rollups over:
    # the same SQL builder, merge and answer); the bare aggregation over raw, written by hand.
    ways: dict[str, Any] = {
        "rollups": lambda: store.query(q),
        "store_raw": lambda: asyncio.to_thread(store.answer, q, [Segment(raw, start, end)]),
        "by_hand": lambda: asyncio.to_thread(store.x.rows, by_hand),
    }
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    answers: dict[str, Any] = {}
    for _ in range(queries):
        for k, way in ways.items():
            c, t = time.process_time(), time.perf_counter()
            answers[k] = await way()
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)  # the process's CPU (every thread): not the machine's load
    got = answers["rollups"]
    assert len(got) == 1 and len(got[0].points) == DAY // 60, (len(got), len(got[0].points) if got else 0)
    await store.close()
    out: dict[str, Any] = {"rows": rows, "load_rows_per_s": round(rows / load_s), "rollup_s": round(rollup_s, 2),
                           "bytes_on_disk": size, "bytes_per_sample": round(size / rows, 2),
                           "bus_bytes_per_sample": round(len(encode([sample(1, 1, end)] * 1000)) / 1000, 1)}
    for k in ways:
        out[f"{k}_p50_ms"] = round(statistics.median(wall[k]) * 1e3, 2)
        out[f"{k}_p99_ms"] = round(p99(wall[k]) * 1e3, 2)
        out[f"{k}_cpu_p50_ms"] = round(statistics.median(cpu[k]) * 1e3, 2)
    return out


def report(h: dict[str, Any], load_before: float) -> str:
    def fig(k: str) -> str:
        return f"p50 {h[k + '_p50_ms']} ms, p99 {h[k + '_p99_ms']} ms, CPU p50 {h[k + '_cpu_p50_ms']} ms"

    def ratio(k: str) -> str:
        return " / ".join(f"{h['rollups' + s] / h[k + s]:.2f}" for s in ("_p50_ms", "_p99_ms", "_cpu_p50_ms"))

    return (f"24 h at 1 m, one workload, {h['rows']:,} samples: store (rollups) {fig('rollups')} (target < 100 ms "
            f"p99); store from raw alone {fig('store_raw')}; by hand over raw {fig('by_hand')}; rollups / store "
            f"from raw (p50 / p99 / CPU): {ratio('store_raw')}; rollups / by hand: {ratio('by_hand')} (below 1: "
            f"the rollups are faster); {h['bytes_per_sample']} bytes on disk per sample (raw + rollups); load "
            f"average {load_before:.1f} before the queries, {os.getloadavg()[0]:.1f} after")


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, int(len(xs) * 0.99) - 1)]


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="persys-meter-bench-"))
    redis, endpoint = infra.start_redis(tmp)
    try:
        for engine in args.engines.split(","):
            print(f"== {engine}", flush=True)
            if not args.skip_ingest:
                target = args.nodes * args.workloads_per_node / 10
                got = await ingest(engine, f"redis://{endpoint}/0", tmp, args.seconds, args.nodes,
                                   args.workloads_per_node)
                bare = await bare_insert(engine, tmp, 50_000)
                kept_up = got["dropped"] == 0 and got["drain_after_stop_s"] < 5 and got["max_lag_s"] < 30
                print(f"ingest: target {target:.0f} samples/s; {got}", flush=True)
                print(f"ingest baseline (bare insert, same rows, no bus): {bare:,.0f} samples/s; ingest path "
                      f"stored {got['stored_per_s_during_run'] / bare:.3f} of it at the target rate; kept up: "
                      f"{kept_up}", flush=True)
            load_before = os.getloadavg()[0]
            h = await history(engine, tmp, args.history_workloads, args.queries)
            print(f"history: {h}", flush=True)
            print(report(h, load_before), flush=True)
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--workloads-per-node", type=int, default=10)
    ap.add_argument("--history-workloads", type=int, default=100)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-ingest", action="store_true", help="only the history: load, roll up, query")
    ap.add_argument("--engines", default="duckdb,chdb")
    asyncio.run(main(ap.parse_args()))
