"""Micro-benchmark of what-if plans and counterfactuals (pure) at N nodes.

Run: PYTHONPATH=src .venv/bin/python bench/whatif_micro.py [--nodes 5000] [--per-node 4]
"""

from __future__ import annotations

import argparse
import random
import time

from placement_micro import make_nodes

from persys.scheduler.placement import (
    Cluster,
    NodeInfo,
    Operation,
    PlacementConfig,
    Running,
    Snapshot,
    WorkloadRequest,
    counterfactuals,
    plan_operation,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--per-node", type=int, default=4)
    args = ap.parse_args()
    rng = random.Random(7)
    nodes = make_nodes(args.nodes, rng)
    snapshot = Snapshot(tuple(nodes))
    running = tuple(Running(WorkloadRequest(id=f"{n.id}-w{k}", cpu_millicores=100, memory_mb=128, service=f"s{k}"),
                            n.id) for n in nodes for k in range(args.per_node))
    pending = tuple(WorkloadRequest(id=f"p{i}", cpu_millicores=40_000) for i in range(100))
    cluster = Cluster(snapshot, running, pending)
    config = PlacementConfig(percentage_of_nodes_to_score=2)  # the scheduler's default
    for label, op in (("drain 1 node", Operation("drain", nodes=(nodes[1].id,))),
                      ("lose-label zone=z0", Operation("lose-label", label=("zone", "z0"))),
                      ("add-node", Operation("add-node", add=(NodeInfo(id="new", cpu_millicores=64_000,
                                                                         memory_mb=262_144,
                                                                         runtimes=frozenset({"container"})),)))):
        t = time.perf_counter()
        plan = plan_operation(cluster, op, config)
        ms = (time.perf_counter() - t) * 1000
        print(f"{label}: {ms:.0f} ms ({len(plan.moves)} moves, {len(plan.stranded)} stranded, "
              f"{len(plan.newly_placed)} placed, {len(plan.still_pending)} still pending)")
    t = time.perf_counter()
    found = counterfactuals(Cluster(snapshot, running), WorkloadRequest(id="big", cpu_millicores=33_000), config)
    ms = (time.perf_counter() - t) * 1000
    print(f"counterfactuals: {ms:.0f} ms ({len(found.changes)} changes: {[c.kind for c in found.changes]})")


if __name__ == "__main__":
    main()
