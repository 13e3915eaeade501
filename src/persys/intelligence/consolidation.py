"""Consolidation: which nodes could be emptied, and where their workloads would go.

The seam is `WhatIfPlanner` (a Protocol): given the cluster and a node to lose, where each of
its instances would be placed, or why it could not be. `SchedulerPlanner` asks the scheduler's
own what-if plan (`PlanOperation`, what `persysctl plan --lose-node` shows): the scheduler's
mirror, its placement config, spread counts, node-local volume pins and priorities, the same
engine run; for the nodes emptied before, one plan losing all of them at once. `EnginePlanner`
runs the pure engine on a snapshot built from the API's views: kept for the pure tests (its
views lack spread counts and volume pins, so it is not what the gateway uses).

`consolidate` is greedy, its only I/O the planner's: nodes are tried emptiest first (by CPU allocated); a node is
emptiable when every instance on it finds a place on the nodes that remain (earlier emptied
nodes excluded, earlier moves counted as placed there); at least one node always remains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from persys.model.workload import Workload, workload_of
from persys.scheduler import placement as pl
from persys.scheduler.placing.engine_adapter import to_request


@dataclass(frozen=True)
class Move:
    instance: str
    to: str | None  # None: no node would take it
    why: str  # the engine's explanation


def cached_request(workloads: Mapping[str, Workload], cache: dict[str, pl.WorkloadRequest],
                   instance: str) -> pl.WorkloadRequest | None:
    """The engine's request for `instance` (built once per planner), None if its workload is unknown."""
    if instance not in cache:
        w = workloads.get(workload_of(instance))
        if w is None:
            return None
        cache[instance] = to_request(w, instance)
    return cache[instance]


@dataclass(frozen=True)
class NodePlan:
    node: str
    moves: tuple[Move, ...]
    # The instances of the nodes emptied before, placed again by the same plan (the scheduler's
    # plan loses them all at once); empty for a planner that keeps earlier moves as made.
    also: tuple[Move, ...] = ()

    @property
    def emptiable(self) -> bool:
        return all(m.to for m in (*self.moves, *self.also))


class WhatIfPlanner(Protocol):
    """Where the instances on `lose` would go if it were lost, with `gone` already emptied and
    `placed` (instance -> node) moves already made; and an instance's CPU and memory request."""

    async def lose_node(self, lose: str, gone: frozenset[str], placed: Mapping[str, str]) -> NodePlan: ...

    def request(self, instance: str) -> pl.WorkloadRequest | None: ...


def node_info(view: Mapping[str, Any]) -> pl.NodeInfo:
    caps = view.get("capabilities") or {}
    runtimes = caps.get("runtimes") or {}
    alloc = view.get("allocated") or {}
    return pl.NodeInfo(
        id=str(view["id"]), ready=view.get("status") == "Ready",
        schedulable=not (view.get("cordoned") or view.get("draining")),
        runtimes=frozenset(runtimes),
        runtime_features=frozenset(f"{t}:{f}" for t, info in runtimes.items()
                                   for f in (info or {}).get("features", ())),
        storage_drivers=frozenset(caps.get("storageDrivers") or ()),
        storage_missing=dict(caps.get("storageMissing") or {}),
        cpu_millicores=int(caps.get("cpuMillicores", 0) or 0), memory_mb=int(caps.get("memoryMb", 0) or 0),
        disk_mb=int(caps.get("diskMb", 0) or 0), labels=dict(view.get("labels") or {}),
        taints=tuple(pl.Taint(str(t.get("key", "")), str(t.get("value", "")), t.get("effect", "NoSchedule"))
                     for t in view.get("taints") or ()),
        committed_cpu=int(alloc.get("cpuMillicores", 0) or 0), committed_memory_mb=int(alloc.get("memoryMb", 0) or 0),
        committed_disk_mb=int(alloc.get("diskMb", 0) or 0), workload_count=int(alloc.get("workloads", 0) or 0))


def _with(n: pl.NodeInfo, r: pl.WorkloadRequest, sign: int) -> pl.NodeInfo:
    return replace(n, committed_cpu=n.committed_cpu + sign * r.cpu_millicores,
                   committed_memory_mb=n.committed_memory_mb + sign * r.memory_mb,
                   committed_disk_mb=n.committed_disk_mb + sign * r.disk_mb,
                   workload_count=n.workload_count + sign)


@dataclass
class EnginePlanner:
    """The pure placement engine over the views (nodes as GET /v1/nodes shows them, workloads
    as GET /v1/workloads/{id} with their spec)."""

    nodes: Sequence[Mapping[str, Any]]
    workloads: Mapping[str, Workload]
    config: pl.PlacementConfig = pl.DEFAULT_CONFIG
    requests: dict[str, pl.WorkloadRequest] = field(default_factory=dict)

    def request(self, instance: str) -> pl.WorkloadRequest | None:
        return cached_request(self.workloads, self.requests, instance)

    async def lose_node(self, lose: str, gone: frozenset[str], placed: Mapping[str, str]) -> NodePlan:
        infos = {str(v["id"]): node_info(v) for v in self.nodes}
        on = {str(v["id"]): [str(i) for i in v.get("workloads") or ()] for v in self.nodes}
        for inst, dest in placed.items():  # earlier moves: off their node, onto their destination
            r = self.request(inst)
            if r is not None and dest in infos:
                infos[dest] = _with(infos[dest], r, +1)
        moves = []
        for inst in sorted({i for n in (lose, *gone) for i in on.get(n, ())} - set(placed)):
            if inst not in on.get(lose, ()):
                continue
            r = self.request(inst)
            if r is None:
                moves.append(Move(inst, None, "its workload could not be read"))
                continue
            snap = pl.Snapshot(tuple(n for k, n in sorted(infos.items()) if k != lose and k not in gone))
            d = pl.decide(snap, r, self.config)
            moves.append(Move(inst, d.node_id, d.explain()))
            if d.node_id is not None:
                infos[d.node_id] = _with(infos[d.node_id], r, +1)
        return NodePlan(lose, tuple(moves))


class PlanApi(Protocol):
    async def plan_operation(self, operation: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class SchedulerPlanner:
    """The scheduler's what-if plan (`PlanOperation`): losing `lose` and every node emptied before
    in one plan, so where each instance goes is what the scheduler decides with all of them gone
    (earlier `placed` moves are decided again in that plan, not assumed)."""

    api: PlanApi
    workloads: Mapping[str, Workload]
    requests: dict[str, pl.WorkloadRequest] = field(default_factory=dict)
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> the plan's answer (evidence)

    def request(self, instance: str) -> pl.WorkloadRequest | None:
        return cached_request(self.workloads, self.requests, instance)

    async def lose_node(self, lose: str, gone: frozenset[str], placed: Mapping[str, str]) -> NodePlan:
        answer = await self.api.plan_operation({"kind": "lose-node", "nodes": sorted({lose, *gone})})
        self.plans[lose] = answer
        return plan_of(answer, lose)


def plan_of(answer: Mapping[str, Any], lose: str) -> NodePlan:
    """A `PlanOperation` answer as the moves off `lose` (and those off the other lost nodes)."""
    outcomes = [Move(str(o["instance"]), o.get("to") or None, str(o.get("explanation", "")), ) for o in
                (*answer.get("moves", ()), *answer.get("pending", ()))]
    origin = {str(o["instance"]): str(o.get("from", "")) for o in (*answer.get("moves", ()),
                                                                  *answer.get("pending", ()))}
    stays = [Move(str(s["instance"]), None, f"stays on {s.get('node', '')}: {s.get('reason', '')}")
             for s in answer.get("stays", ())]
    origin.update({str(s["instance"]): str(s.get("node", "")) for s in answer.get("stays", ())})
    every = sorted((*outcomes, *stays), key=lambda m: m.instance)
    return NodePlan(lose, tuple(m for m in every if origin[m.instance] == lose),
                    tuple(m for m in every if origin[m.instance] != lose))


@dataclass(frozen=True)
class Consolidation:
    emptiable: tuple[NodePlan, ...]
    kept: tuple[NodePlan, ...]  # tried and not emptiable (the first move that found no node says why)
    capacity_left: Mapping[str, Mapping[str, int]]  # per remaining node: free cpu/memory after the moves

    def to_dict(self) -> dict[str, Any]:
        def plan(p: NodePlan) -> dict[str, Any]:
            return {"node": p.node, "emptiable": p.emptiable,
                    "moves": [{"instance": m.instance, "to": m.to, "why": m.why} for m in p.moves]}

        return {"emptiable": [plan(p) for p in self.emptiable], "kept": [plan(p) for p in self.kept],
                "capacityLeft": {k: dict(v) for k, v in sorted(self.capacity_left.items())}}


async def consolidate(nodes: Sequence[Mapping[str, Any]], planner: WhatIfPlanner) -> Consolidation:
    ready = [n for n in nodes if n.get("status") == "Ready" and not n.get("cordoned")]
    order = sorted(ready, key=lambda n: (int((n.get("allocated") or {}).get("cpuMillicores", 0) or 0), str(n["id"])))
    gone: set[str] = set()
    placed: dict[str, str] = {}
    emptiable, kept = [], []
    for n in order:
        if len(ready) - len(gone) <= 1:
            break
        p = await planner.lose_node(str(n["id"]), frozenset(gone), placed)
        if p.emptiable:
            emptiable.append(p)
            gone.add(p.node)
            placed.update({m.instance: str(m.to) for m in (*p.moves, *p.also)})
        else:
            kept.append(p)
    left: dict[str, dict[str, int]] = {}
    for n in ready:
        if n["id"] in gone:
            continue
        info = node_info(n)
        moved_cpu = moved_mem = 0
        for inst, dest in placed.items():
            r = planner.request(inst)
            if dest == n["id"] and r is not None:
                moved_cpu, moved_mem = moved_cpu + r.cpu_millicores, moved_mem + r.memory_mb
        left[str(n["id"])] = {"cpuMillicores": info.free_cpu - moved_cpu, "memoryMb": info.free_memory_mb - moved_mem}
    return Consolidation(tuple(emptiable), tuple(kept), left)


def workloads_from_views(views: Sequence[Mapping[str, Any]]) -> dict[str, Workload]:
    """Workload models from GET /v1/workloads/{id} answers (with `spec`); others are skipped."""
    out = {}
    for v in views:
        if not v.get("spec"):
            continue
        out[str(v["id"])] = Workload.model_validate({
            "id": v["id"], "name": v.get("name", v["id"]), "labels": v.get("labels") or {}, "spec": v["spec"],
            "revision": v.get("revision", "") or "r", "generation": v.get("generation", 1) or 1,
            "created_at": 0.0, "updated_at": 0.0})
    return out
