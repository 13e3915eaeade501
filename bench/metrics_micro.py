"""What each metrics seam costs, measured in-process with no other load in the measurement:

* one `LoopCounter.inc` and one `LoopHistogram.observe` (the hot-path helpers);
* one unary gRPC call through a real server (127.0.0.1, port 0) with and without
  `MetricsInterceptor`, alternating blocks of calls so drift hits both alike;
* one scrape of a scheduler-sized mirror (500 nodes, 5,000 workloads with status and usage):
  the scrape-time gauges and the text exposition, the event-loop time a Prometheus scrape takes.

    .venv/bin/python bench/metrics_micro.py [--calls 3000] [--workloads 5000] [--nodes 500]

bench/metrics_overhead.py runs it first, then the scale benchmark with metrics off and on.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import grpc

from persys.model import Node, NodeStatus, Phase, WorkloadManifest, WorkloadStatus, WorkloadUsage
from persys.model.workload import Workload
from persys.observability.grpc_metrics import MetricsInterceptor
from persys.observability.metrics import Metrics
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.work import metrics as replica_metrics


def helpers(n: int = 1_000_000) -> dict[str, float]:
    m = Metrics(process=False)
    c, h = m.counter("persys_reconcile_total"), m.histogram("persys_placement_decision_duration_seconds")
    labels = ("ok",)
    t0 = time.perf_counter()
    for _ in range(n):
        c.inc(labels)
    t1 = time.perf_counter()
    for i in range(n):
        h.observe(i * 1e-9)
    t2 = time.perf_counter()
    return {"counter_inc_ns": round((t1 - t0) / n * 1e9, 1), "histogram_observe_ns": round((t2 - t1) / n * 1e9, 1)}


async def grpc_calls(calls: int, rounds: int = 10) -> dict[str, float]:
    async def echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})
    servers, channels = [], []
    for interceptors in ([], [MetricsInterceptor(Metrics(process=False))]):
        server = grpc.aio.server(interceptors=interceptors)
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    per: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for r in range(rounds):
            for name, ch in (("without", channels[0]), ("with", channels[1]))[:: 1 if r % 2 == 0 else -1]:
                call = ch.unary_unary("/bench.Echo/Call")
                await call(b"x")
                t0 = time.perf_counter()
                for _ in range(calls // rounds):
                    await call(b"x")
                per[name].append((time.perf_counter() - t0) / (calls // rounds) * 1e6)
    finally:
        for ch in channels:
            await ch.close()
        for s in servers:
            await s.stop(0)
    without, with_ = statistics.median(per["without"]), statistics.median(per["with"])
    return {"call_us_without": round(without, 1), "call_us_with": round(with_, 1),
            "interceptor_us_per_call": round(with_ - without, 1)}


def mirror(nodes: int, workloads: int) -> tuple[Mirror, dict[str, WorkloadUsage]]:
    state = Mirror()  # filled by hand: the scrape reads, never the store
    m = WorkloadManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
                                         "spec": {"type": "process", "process": {"command": ["sleep", "60"]}}})
    proto = Workload.from_manifest(m, 0.0)
    for i in range(nodes):
        state.nodes[f"n{i}"] = Versioned(Node(id=f"n{i}", status=NodeStatus.READY), 1)
    usage = {}
    for i in range(workloads):
        wid = f"w{i}"
        state.workloads[wid] = Versioned(proto.model_copy(update={"id": wid, "name": wid}), 1)
        state.statuses[wid] = Versioned(WorkloadStatus(phase=Phase.RUNNING, node_id=f"n{i % nodes}"), 1)
        usage[wid] = WorkloadUsage(cpu_percent=12.5, memory_bytes=1 << 24, net_rx_bytes=i)
    return state, usage


def scrape(nodes: int, workloads: int, n: int = 20) -> dict[str, Any]:
    state, usage = mirror(nodes, workloads)
    m = Metrics()
    m.on_scrape(lambda: replica_metrics.cluster_samples(state))
    m.on_scrape(lambda: replica_metrics.usage_samples(usage))
    times = []
    size = 0
    for _ in range(n):
        t0 = time.perf_counter()
        size = len(m.exposition())
        times.append(time.perf_counter() - t0)
    return {"nodes": nodes, "workloads": workloads, "scrape_ms_median": round(statistics.median(times) * 1000, 2),
            "scrape_ms_max": round(max(times) * 1000, 2), "bytes": size}


def measure(calls: int = 5000, nodes: int = 500, workloads: int = 5000) -> dict[str, Any]:
    return {"helpers": helpers(), "grpc": asyncio.run(grpc_calls(calls)), "scrape": scrape(nodes, workloads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--workloads", type=int, default=5000)
    a = ap.parse_args()
    r = measure(a.calls, a.nodes, a.workloads)
    h, g, s = r["helpers"], r["grpc"], r["scrape"]
    print(f"counter inc: {h['counter_inc_ns']} ns; histogram observe: {h['histogram_observe_ns']} ns")
    print(f"unary gRPC call: {g['call_us_without']} us without the interceptor, {g['call_us_with']} us with "
          f"(+{g['interceptor_us_per_call']} us)")
    print(f"scrape of {s['nodes']} nodes / {s['workloads']} workloads with usage: {s['scrape_ms_median']} ms "
          f"median, {s['scrape_ms_max']} ms max, {s['bytes']} bytes (usage series capped)")


if __name__ == "__main__":
    main()
