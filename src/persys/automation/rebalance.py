"""The rebalance plan: pure. Nodes above `highPercent` of a resource (requested / allocatable)
shed instances to nodes below `lowPercent`, the descheduler's LowNodeUtilization with two
differences its users asked for: every move names its destination, checked by the scheduler's own
placement engine (`scheduler.placement.decide`, the pure engine) over the cluster as it will be
after the moves planned before it; and a workload moved in the last `holdMinutes` is not moved
again. Budgets: per source node and per run (`maxMovesPerNode`, `maxMovesPerRun`) and per hour
(`maxMovesPerHour`, counting this policy's moves done) and cluster-wide (`maxClusterMovesPerHour`,
counting every rebalance move of any policy). Lower priorities move first (the highest are
disturbed last). Instances with node-local data stay (a local inline volume, or a claim, whose
volume may be local); shared volumes move, stopped before they start elsewhere (the scheduler's
move). Nothing here moves anything: `rebalance_run` executes the plan through the move API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from persys.model.automation import Rebalance
from persys.scheduler import placement as pl

HOUR = 3600


@dataclass(frozen=True)
class Placed:
    workload: str
    instance: str
    node: str
    type: str
    cpu_millicores: int
    memory_mb: int
    has_volumes: bool = False
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[pl.Toleration, ...] = ()
    required_features: frozenset[str] = frozenset()
    priority: int = 0
    moved_at: float = 0.0  # recorded on the instance by its last move (0: never)


@dataclass(frozen=True)
class Move:
    workload: str
    instance: str
    source: str
    dest: str | None
    held_by: str  # "" (a verified move) | hold | budget | verify
    reason: str


def utilisation(n: pl.NodeInfo, resource: str) -> float:
    alloc, used = ((n.cpu_millicores, n.committed_cpu) if resource == "cpu"
                   else (n.memory_mb, n.committed_memory_mb))
    return 100.0 * used / alloc if alloc else 0.0


def _shift(nodes: list[pl.NodeInfo], p: Placed, source: str, dest: str) -> list[pl.NodeInfo]:
    out = []
    for n in nodes:
        sign = -1 if n.id == source else 1 if n.id == dest else 0
        if sign:
            n = dataclasses.replace(n, committed_cpu=n.committed_cpu + sign * p.cpu_millicores,
                                    committed_memory_mb=n.committed_memory_mb + sign * p.memory_mb,
                                    workload_count=n.workload_count + sign)
        out.append(n)
    return out


def _size(p: Placed, resource: str) -> int:
    return p.cpu_millicores if resource == "cpu" else p.memory_mb


def plan(spec: Rebalance, now: float, nodes: Sequence[pl.NodeInfo], placed: Sequence[Placed],
         moved: Sequence[tuple[float, str]], cluster_moves: int = 0) -> list[Move]:
    """The moves to make now, and the candidates held back (with the limit that held each).
    `moved`: this policy's moves done (time, workload); `cluster_moves`: every rebalance move in
    the last hour, of any policy."""
    cur = list(nodes)
    by_id = {n.id: n for n in cur}
    over = sorted((n for n in cur if n.ready and utilisation(n, spec.resource) > spec.high_percent),
                  key=lambda n: (-utilisation(n, spec.resource), n.id))
    under = {n.id for n in cur if n.ready and n.schedulable and utilisation(n, spec.resource) < spec.low_percent}
    if not over or not under:
        return []
    hour_left = spec.max_moves_per_hour - sum(1 for ts, _ in moved if ts > now - HOUR)
    held_since = now - spec.hold_minutes * 60
    held_workloads = {w for ts, w in moved if ts > held_since} | {p.workload for p in placed if p.moved_at > held_since}
    cluster_left = spec.max_cluster_moves_per_hour - cluster_moves
    out: list[Move] = []
    run_moves = 0
    for src in over:
        node_moves = 0
        for p in sorted((p for p in placed if p.node == src.id),
                        key=lambda p: (p.priority, -_size(p, spec.resource), p.instance)):
            now_src = next(n for n in cur if n.id == src.id)
            if utilisation(now_src, spec.resource) <= spec.high_percent:
                break
            util = f"{src.id} at {utilisation(now_src, spec.resource):.0f}% {spec.resource} (high {spec.high_percent}%)"
            if p.has_volumes:
                continue
            if p.workload in held_workloads:
                out.append(Move(p.workload, p.instance, src.id, None, "hold",
                                f"{util}; {p.workload} moved within the last {spec.hold_minutes} min"))
                continue
            limit = ("maxMovesPerRun" if run_moves >= spec.max_moves_per_run else
                     "maxMovesPerNode" if node_moves >= spec.max_moves_per_node else
                     "maxMovesPerHour" if hour_left <= 0 else
                     "maxClusterMovesPerHour" if cluster_left <= 0 else "")
            if limit:  # one record says so; the node's (or the run's) other candidates wait too
                out.append(Move(p.workload, p.instance, src.id, None, "budget", f"{util}; {limit} reached"))
                if limit == "maxMovesPerNode":
                    break
                return out
            move, moved_cur = _try_move(spec, cur, under, by_id, p, src.id, util)
            out.append(move)
            if moved_cur is None:
                continue
            cur = moved_cur
            run_moves, node_moves, hour_left, cluster_left = run_moves + 1, node_moves + 1, hour_left - 1, \
                cluster_left - 1
            held_workloads.add(p.workload)  # never twice in one plan either
    return out


def _try_move(spec: Rebalance, cur: list[pl.NodeInfo], under: set[str], by_id: dict[str, pl.NodeInfo], p: Placed,
              src: str, util: str) -> tuple[Move, list[pl.NodeInfo] | None]:
    """One candidate placed on the nodes under the low threshold: the move and the nodes after it,
    or a `verify` record (and None) when no node takes it or the taker would only carry the
    overload."""
    # Only the nodes under the low threshold may take it, the source never.
    req = pl.WorkloadRequest(id=p.instance, type=p.type, cpu_millicores=p.cpu_millicores,
                             memory_mb=p.memory_mb, service=p.workload, priority=p.priority,
                             node_selector=dict(p.node_selector),
                             tolerations=p.tolerations, required_features=p.required_features,
                             excluded_nodes=frozenset(n.id for n in cur if n.id not in under))
    decision = pl.decide(pl.Snapshot(tuple(cur)), req)
    if decision.node_id is None:
        return Move(p.workload, p.instance, src, None, "verify",
                    f"{util}; no node below {spec.low_percent}% takes {p.instance}: {decision.explain()}"), None
    dest = decision.node_id
    moved_cur = _shift(cur, p, src, dest)
    after = utilisation(next(n for n in moved_cur if n.id == dest), spec.resource)
    if after > spec.high_percent:  # it would only move the overload
        return Move(p.workload, p.instance, src, None, "verify",
                    f"{util}; {dest} would be at {after:.0f}% after taking {p.instance}"), None
    return Move(p.workload, p.instance, src, dest, "",
                f"{util}; {p.instance} ({p.cpu_millicores}m, {p.memory_mb} MiB) to {dest} "
                f"(at {utilisation(by_id[dest], spec.resource):.0f}% -> {after:.0f}%), placement: "
                f"{decision.explain()[:300]}"), moved_cur
