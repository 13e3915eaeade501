"""Micro-benchmark of the pure placement engine: decide() latency at N nodes, place_many throughput.

Run: PYTHONPATH=src .venv/bin/python bench/placement_micro.py [--nodes 5000] [--decisions 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from persys.scheduler.placement import (
    LabelConstraint,
    NodeInfo,
    PlacementConfig,
    Reservations,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRequest,
    decide,
    place_many,
)


def make_nodes(n: int, rng: random.Random) -> list[NodeInfo]:
    nodes = []
    for i in range(n):
        cpu = rng.choice([4000, 8000, 16000, 32000])
        mem = cpu * 4
        taints: tuple[Taint, ...] = (Taint("gpu", "true", "NoSchedule"),) if i % 20 == 0 else ()
        if i % 25 == 0:
            taints += (Taint("spot", "true", "PreferNoSchedule"),)
        nodes.append(
            NodeInfo(
                id=f"node-{i:05d}",
                ready=i % 97 != 0,
                schedulable=i % 89 != 0,
                runtimes=frozenset({"container", "process"} | ({"vm", "microvm"} if i % 3 == 0 else set())),
                runtime_features=frozenset({"vm:kvm"} if i % 6 == 0 else {"vm:tcg"}),
                storage_drivers=frozenset({"local", "zfs"} if i % 2 else {"local"}),
                cpu_millicores=cpu,
                memory_mb=mem,
                disk_mb=500_000,
                labels={"zone": f"z{i % 5}", "rack": str(i % 40), "disk": "ssd" if i % 2 else "hdd"},
                taints=taints,
                committed_cpu=rng.randrange(0, cpu),
                committed_memory_mb=rng.randrange(0, mem),
                committed_disk_mb=rng.randrange(0, 400_000),
                workload_count=rng.randrange(0, 30),
                service_counts={f"svc{rng.randrange(50)}": 1 for _ in range(rng.randrange(4))},
            )
        )
    return nodes


def make_request(i: int, rng: random.Random) -> WorkloadRequest:
    kind = i % 4
    return WorkloadRequest(
        id=f"wl-{i}",
        type="microvm" if kind == 3 else "container",
        cpu_millicores=rng.choice([100, 500, 1000, 2000]),
        memory_mb=rng.choice([128, 512, 2048]),
        disk_mb=rng.choice([0, 1024]),
        node_selector={"disk": "ssd"} if kind == 1 else {},
        constraints=(LabelConstraint("rack", "Gt", ("10",)),) if kind == 2 else (),
        tolerations=(Toleration("gpu", "Exists"),) if kind == 2 else (),
        required_features=frozenset({"vm:kvm"}) if kind == 3 else frozenset(),
        service=f"svc{rng.randrange(50)}",
        spread_label="zone" if kind != 0 else None,
    )


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--decisions", type=int, default=300)
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--percentage", type=int, default=None, help="percentage_of_nodes_to_score (100 = all)")
    args = ap.parse_args()
    rng = random.Random(42)
    t0 = time.perf_counter()
    snapshot = Snapshot(tuple(make_nodes(args.nodes, rng)))
    build_ms = (time.perf_counter() - t0) * 1000
    requests = [make_request(i, rng) for i in range(args.decisions)]
    config = PlacementConfig(percentage_of_nodes_to_score=args.percentage)
    for r in requests[:8]:  # warm the per-snapshot static caches (once per request type)
        decide(snapshot, r, config)
    lat = []
    for r in requests:
        t = time.perf_counter()
        decide(snapshot, r, config)
        lat.append((time.perf_counter() - t) * 1000)
    print(f"nodes={args.nodes} percentage_of_nodes_to_score={args.percentage} build {build_ms:.1f} ms")
    print(
        f"decide(): p50 {statistics.median(lat):.2f} ms  p99 {pct(lat, 0.99):.2f} ms  "
        f"max {max(lat):.2f} ms  ({len(lat)} decisions)"
    )
    # Pending decisions (no node has 64 cores free) evaluate every node and explain each.
    pending = [WorkloadRequest(id=f"big-{i}", type="container", cpu_millicores=64_000, memory_mb=512,
                               node_selector={"disk": "ssd"} if i % 2 else {}) for i in range(50)]
    decide(snapshot, pending[0], config)
    decide(snapshot, pending[1], config)
    plat = []
    for r in pending:
        t = time.perf_counter()
        decide(snapshot, r, config)
        plat.append((time.perf_counter() - t) * 1000)
    print(f"decide() pending: p50 {statistics.median(plat):.2f} ms  p99 {pct(plat, 0.99):.2f} ms  "
          f"({len(plat)} decisions)")
    burst = [make_request(10_000 + i, rng) for i in range(args.burst)]
    t = time.perf_counter()
    decisions = place_many(snapshot, burst, Reservations(), config)
    elapsed = time.perf_counter() - t
    placed = sum(d.placed for d in decisions)
    rate = args.burst / elapsed
    print(f"place_many(): {args.burst} requests in {elapsed * 1000:.0f} ms ({rate:.0f}/s), placed {placed}")


if __name__ == "__main__":
    main()
