"""Consolidation: which nodes could be emptied and where their instances would go, through the
pure engine planner and through the scheduler's what-if plan answer (`SchedulerPlanner`, here
answered by the same pure `plan_operation` the scheduler's PlanOperation runs, so its answer's
form and the spread counts it keeps are the real ones; tests/e2e/test_intelligence_consolidation.py
runs it against a real scheduler and drain)."""

from __future__ import annotations

from typing import Any

from persys.intelligence.consolidation import EnginePlanner, SchedulerPlanner, consolidate, workloads_from_views
from persys.scheduler import placement as pl
from persys.scheduler.placing.engine_adapter import to_request


def node(name: str, cpu_used: int, instances: list[str], taints: list[dict[str, str]] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"id": name, "status": "Ready", "cordoned": False, "draining": False, "labels": labels or {},
            "taints": taints or [],
            "capabilities": {"runtimes": {"process": {"features": []}}, "cpuMillicores": 2000, "memoryMb": 4096,
                             "diskMb": 10000},
            "allocated": {"cpuMillicores": cpu_used, "memoryMb": 64 * len(instances), "diskMb": 0,
                          "workloads": len(instances)},
            "workloads": instances}


def workload(name: str, cpu: int, **spec: Any) -> dict[str, Any]:
    return {"id": name, "name": name, "revision": "r1", "generation": 1, "labels": {},
            "spec": {"type": "process", "replicas": 1, "resources": {"cpuMillicores": cpu, "memoryMb": 64},
                     "process": {"command": ["sleep", "1"]}, **spec}}


async def test_the_emptiest_nodes_are_emptied_while_the_rest_can_take_their_instances() -> None:
    nodes = [node("a", 1500, ["big"]), node("b", 300, ["s1", "s2"]), node("c", 200, ["s3"])]
    ws = workloads_from_views([workload("big", 1500), workload("s1", 150), workload("s2", 150), workload("s3", 200)])
    plan = await consolidate(nodes, EnginePlanner(nodes, ws))
    emptied = [p.node for p in plan.emptiable]
    assert emptied == ["c", "b"], plan.to_dict()
    moved = {m.instance: m.to for p in plan.emptiable for m in p.moves}
    assert moved == {"s3": "b", "s1": "a", "s2": "a"} or set(moved.values()) <= {"a", "b"}
    assert plan.capacity_left["a"]["cpuMillicores"] == 2000 - 1500 - 150 - 150 - 200 or moved["s3"] != "a"
    assert list(plan.capacity_left) == ["a"]


async def test_a_taint_keeps_a_node_from_taking_what_does_not_tolerate_it() -> None:
    taint = [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    nodes = [node("a", 100, ["w"]), node("gpu", 1000, ["g"], taints=taint)]
    ws = workloads_from_views([workload("w", 100), workload("g", 1000, tolerations=[{
        "key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}])])
    plan = await consolidate(nodes, EnginePlanner(nodes, ws))
    # "a" cannot be emptied (w does not tolerate gpu's taint); gpu can (g tolerates it and fits on a).
    assert plan.kept[0].node == "a" and plan.kept[0].moves[0].to is None
    assert "untolerated taint" in plan.kept[0].moves[0].why
    assert [(p.node, p.moves[0].to) for p in plan.emptiable] == [("gpu", "a")]


class PurePlanApi:
    """The scheduler's PlanOperation without the scheduler: the same pure plan on a snapshot
    that, unlike the API's views, carries the spread counts (service_counts) the mirror keeps."""

    def __init__(self, cluster: pl.Cluster) -> None:
        self.cluster, self.asked = cluster, []  # type: ignore[var-annotated]

    async def plan_operation(self, operation: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(operation)
        return pl.plan_operation(self.cluster, pl.Operation(operation["kind"], tuple(operation["nodes"]))).to_dict()


async def test_the_scheduler_plan_keeps_spread_and_loses_earlier_nodes_in_one_plan() -> None:
    """web (2 replicas, hard spread over the `host` label) has web.0 on a and web.1 on c: losing
    a, web.0 must go to b (c already runs web.1), though c is emptier. The engine planner over the
    views does not see the spread counts; the scheduler's plan does."""
    views = [workload("web", 300, replicas=2, topologySpread=[{"label": "host", "maxSkew": 1,
                                                               "whenUnsatisfiable": "DoNotSchedule"}]),
             workload("x", 1500), workload("y", 100)]
    ws = workloads_from_views(views)
    reqs = {i: to_request(ws[w], i) for w, i in (("web", "web.0"), ("web", "web.1"), ("x", "x"), ("y", "y"))}
    where = {"web.0": "a", "x": "b", "web.1": "c", "y": "c"}
    infos = []
    for n, cpu in (("a", 300), ("b", 1500), ("c", 400)):
        on = [reqs[i] for i, m in where.items() if m == n]
        infos.append(pl.NodeInfo(id=n, runtimes=frozenset({"process"}), cpu_millicores=2000, memory_mb=4096,
                                 disk_mb=10000, committed_cpu=cpu, committed_memory_mb=64 * len(on),
                                 workload_count=len(on), labels={"host": n},
                                 service_counts={r.group: 1 for r in on}))
    cluster = pl.Cluster(pl.Snapshot(tuple(infos)), tuple(pl.Running(reqs[i], m) for i, m in where.items()))
    nodes = [node("a", 300, ["web.0"], labels={"host": "a"}), node("b", 1500, ["x"], labels={"host": "b"}),
             node("c", 400, ["web.1", "y"], labels={"host": "c"})]
    api = PurePlanApi(cluster)
    plan = await consolidate(nodes, SchedulerPlanner(api, ws))
    first = plan.emptiable[0]
    assert first.node == "a" and {m.instance: m.to for m in first.moves} == {"web.0": "b"}, plan.to_dict()
    engine = await consolidate(nodes, EnginePlanner(nodes, ws))  # no spread counts in the views
    assert {m.instance: m.to for m in engine.emptiable[0].moves} == {"web.0": "c"}
    # The next node is asked with the first one lost too, in one plan (nothing assumed of earlier moves).
    assert api.asked[1] == {"kind": "lose-node", "nodes": ["a", "c"]}
    kept = {p.node: p for p in plan.kept}
    assert "c" in kept and not kept["c"].emptiable  # web.0, web.1 and y do not all fit on b
    assert any(m.to is None for m in (*kept["c"].moves, *kept["c"].also))
    assert list(plan.capacity_left) == ["b", "c"] and plan.capacity_left["b"]["cpuMillicores"] == 2000 - 1500 - 300
