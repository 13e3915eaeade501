"""The dashboard overview's server time at 5,000 nodes and 50,000 workloads (target: < 300 ms).

What the overview does per request besides two small scheduler calls (Health, the last 20
events: ~1-2 ms each on loopback, not included here) is measured on the real code: the figures
over the gateway's live view (persys.gateway.dashboard.cluster_view, filled here with node and
workload documents shaped as the scheduler's views, the scale benchmark's mix of sizes) and the
page's rendering. Also the workloads list filtered by label and the topology page's markup, the
two other pages that walk every object. Prints the median and max of --runs runs.

    .venv/bin/python bench/dashboard_overview.py [--nodes 5000] [--workloads 50000] [--runs 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from persys.gateway.dashboard import figures
from persys.gateway.dashboard.cluster_view import ClusterView
from persys.gateway.dashboard.html import join, tag
from persys.gateway.dashboard.nodes_page import node_rows
from persys.gateway.dashboard.overview_page import counts, meter
from persys.gateway.dashboard.workloads_page import workload_rows


def node_doc(i: int) -> dict[str, Any]:
    return {"id": f"n{i:05d}", "address": f"10.0.{i // 250}.{i % 250}:7443", "agentVersion": "0.1",
            "capabilities": {"cpuMillicores": 8000, "memoryMb": 32768, "diskMb": 512000,
                             "runtimes": {"process": {"version": "1"}, "container": {"version": "20.10"}},
                             "storageDrivers": ["local"]},
            "labels": {"zone": f"z{i % 8}", "rack": f"r{i % 100}"}, "taints": [],
            "status": "Ready" if i % 97 else "NotReady", "statusReason": "", "cordoned": i % 211 == 0,
            "draining": False, "drainDeadline": 0, "adminLabels": {}, "adminTaints": [], "registeredAt": 1.7e9,
            "lastHeartbeat": 1.7e9, "usage": {"cpuPercent": 31.5, "memoryUsedMb": 9000},
            "allocated": {"cpuMillicores": 1000, "memoryMb": 1600, "diskMb": 0, "workloads": 10},
            "workloads": [f"w{i * 10 + k}" for k in range(10)]}


def workload_doc(i: int, nodes: int) -> dict[str, Any]:
    node = f"n{i % nodes:05d}"
    usage = {"cpuPercent": 1.0, "memoryBytes": 1 << 24, "diskReadBytes": 0, "diskWriteBytes": 0, "netRxBytes": 0,
             "netTxBytes": 0}
    inst = {"instance": f"w{i}", "node": node, "phase": "Running", "reason": "Started", "message": "",
            "observedRevision": "abc", "runtimeId": "x", "restarts": 0, "usage": usage,
            "placement": {"node_id": node, "feasible": nodes, "total": nodes, "evaluated": 100, "scores": [],
                          "explanation": f"placed on {node}"}, "drift": {}, "updatedAt": 1.7e9}
    phase = random.choice(("Running",) * 18 + ("Pending", "Failed"))
    return {"id": f"w{i}", "name": f"w{i}", "type": "process", "labels": {"app": f"a{i % 50}", "tier": "web"},
            "desiredState": "Running", "revision": "abc", "generation": 1, "replicas": 1,
            "ready": "1/1" if phase == "Running" else "0/1", "phase": phase, "node": node, "nodes": [node],
            "reason": "", "message": "", "observedRevision": "abc", "runtimeId": "x", "restarts": 0,
            "usage": usage, "placement": inst["placement"], "drift": [], "instances": [inst],
            "createdAt": 1.7e9, "updatedAt": 1.7e9}


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took), max(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--workloads", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    random.seed(7)
    nodes = {d["id"]: d for d in (node_doc(i) for i in range(args.nodes))}
    workloads = {d["id"]: d for d in (workload_doc(i, args.nodes) for i in range(args.workloads))}

    def overview() -> str:
        o = figures.overview(nodes.values(), workloads.values())
        return join((counts("Nodes", o.nodes_by_status, "/ui/nodes", "status"),
                     counts("Workloads", o.workloads_by_phase, "/ui/workloads", "phase"),
                     meter("CPU", o.cpu, "m"), meter("Memory", o.memory, "MiB"), meter("Disk", o.disk, "MiB")))

    view = ClusterView(None)  # type: ignore[arg-type]  # filled directly: no watch here
    view.nodes, view.workloads, view.phases = nodes, workloads, figures.phase_counts(workloads.values())
    view.node_sums = figures.NodeSums(nodes.values())

    def overview_live() -> str:
        view.version += 1  # as if something changed since the last page: no cached figures
        o = view.overview()
        return join((counts("Nodes", o.nodes_by_status, "/ui/nodes", "status"),
                     counts("Workloads", o.workloads_by_phase, "/ui/workloads", "phase"),
                     meter("CPU", o.cpu, "m"), meter("Memory", o.memory, "MiB"), meter("Disk", o.disk, "MiB")))

    def workload_list() -> str:
        return workload_rows(figures.filter_workloads(workloads.values(), label="app=a7"))

    def node_list() -> str:
        return node_rows(figures.filter_nodes(nodes.values(), "z3"))

    def topology() -> str:
        return join(tag("li", tag("a", n["id"], href=f"/ui/nodes/{n['id']}"), class_="tile")
                    for n in figures.filter_nodes(nodes.values()))

    print(f"{args.nodes} nodes, {args.workloads} workloads, {args.runs} runs (median / max ms):")
    for name, fn in (("overview, walking every workload", overview),
                     ("overview, counts kept by the live view", overview_live),
                     ("workloads list, label filter", workload_list),
                     ("nodes list, search", node_list), ("topology markup (every node)", topology)):
        med, worst = timed(fn, args.runs)
        print(f"  {name:<40} {med:7.1f} / {worst:7.1f}")


if __name__ == "__main__":
    main()
