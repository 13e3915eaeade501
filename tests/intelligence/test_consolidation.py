"""Consolidation through the pure placement engine (the WhatIfPlanner seam's engine
implementation): which nodes could be emptied and where their instances would go."""

from __future__ import annotations

from typing import Any

from persys.intelligence.consolidation import EnginePlanner, consolidate, workloads_from_views


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


def test_the_emptiest_nodes_are_emptied_while_the_rest_can_take_their_instances() -> None:
    nodes = [node("a", 1500, ["big"]), node("b", 300, ["s1", "s2"]), node("c", 200, ["s3"])]
    ws = workloads_from_views([workload("big", 1500), workload("s1", 150), workload("s2", 150), workload("s3", 200)])
    plan = consolidate(nodes, EnginePlanner(nodes, ws))
    emptied = [p.node for p in plan.emptiable]
    assert emptied == ["c", "b"], plan.to_dict()
    moved = {m.instance: m.to for p in plan.emptiable for m in p.moves}
    assert moved == {"s3": "b", "s1": "a", "s2": "a"} or set(moved.values()) <= {"a", "b"}
    assert plan.capacity_left["a"]["cpuMillicores"] == 2000 - 1500 - 150 - 150 - 200 or moved["s3"] != "a"
    assert list(plan.capacity_left) == ["a"]


def test_a_taint_keeps_a_node_from_taking_what_does_not_tolerate_it() -> None:
    taint = [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    nodes = [node("a", 100, ["w"]), node("gpu", 1000, ["g"], taints=taint)]
    ws = workloads_from_views([workload("w", 100), workload("g", 1000, tolerations=[{
        "key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}])])
    plan = consolidate(nodes, EnginePlanner(nodes, ws))
    # "a" cannot be emptied (w does not tolerate gpu's taint); gpu can (g tolerates it and fits on a).
    assert plan.kept[0].node == "a" and plan.kept[0].moves[0].to is None
    assert "untolerated taint" in plan.kept[0].moves[0].why
    assert [(p.node, p.moves[0].to) for p in plan.emptiable] == [("gpu", "a")]
