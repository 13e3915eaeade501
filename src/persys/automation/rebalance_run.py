"""The rebalance policy at the edge: nodes and workloads through the client API into the pure
plan (`rebalance.plan`), every candidate recorded with its destination or the limit that held it.

Moves are planned and verified, not executed: the scheduler has no API to move one instance
yet (a what-if plan and a move are being added; `seams.WhatIfPlanner`). So a rebalance policy
records `dry-run` decisions in dry run and `none` (held by `verify`, saying so) otherwise."""

from __future__ import annotations

from typing import Any

from persys.automation import rebalance as rb
from persys.automation.seams import AutomationApi
from persys.model.automation import Decision, Evidence, Outcome, Policy
from persys.scheduler import placement as pl

MAX_DETAILS = 50  # workloads read in full per pass (those on overloaded nodes)


def node_info(doc: dict[str, Any]) -> pl.NodeInfo:
    caps = doc.get("capabilities") or {}
    alloc = doc.get("allocated") or {}
    return pl.NodeInfo(
        id=doc["id"], ready=doc.get("status") == "Ready",
        schedulable=not doc.get("cordoned") and not doc.get("draining"),
        runtimes=frozenset((caps.get("runtimes") or {}).keys()),
        runtime_features=frozenset(f"{t}:{f}" for t, r in (caps.get("runtimes") or {}).items()
                                   for f in (r or {}).get("features", [])),
        cpu_millicores=int(caps.get("cpuMillicores", 0)), memory_mb=int(caps.get("memoryMb", 0)),
        disk_mb=int(caps.get("diskMb", 0)), labels=doc.get("labels") or {},
        taints=tuple(pl.Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
                     for t in doc.get("taints") or []),
        committed_cpu=int(alloc.get("cpuMillicores", 0)), committed_memory_mb=int(alloc.get("memoryMb", 0)),
        committed_disk_mb=int(alloc.get("diskMb", 0)), workload_count=int(alloc.get("workloads", 0)))


def placed_of(w: dict[str, Any]) -> list[rb.Placed]:
    spec = w.get("spec") or {}
    res = spec.get("resources") or {}
    tolerations = tuple(pl.Toleration(t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""),
                                      t.get("effect", "")) for t in spec.get("tolerations") or [])
    return [rb.Placed(w["name"], i["instance"], i["node"], spec.get("type", ""), int(res.get("cpuMillicores", 0)),
                      int(res.get("memoryMb", 0)), bool(spec.get("volumes")),
                      tuple(sorted((spec.get("nodeSelector") or {}).items())), tolerations,
                      frozenset(spec.get("requiredFeatures") or []))
            for i in w.get("instances", []) if i.get("node")]


class RebalanceLoop:
    def __init__(self, api: AutomationApi) -> None:
        self.api = api

    async def decide(self, p: Policy, now: float, base: dict[str, Any]) -> list[Decision]:
        spec = p.spec.rebalance
        assert spec is not None
        docs = [await self.api.get_node(n["id"]) for n in await self.api.list_nodes()]
        nodes = [node_info(d) for d in docs]
        hot = {n.id for n in nodes if rb.utilisation(n, spec.resource) > spec.high_percent}
        placed: list[rb.Placed] = []
        if hot:
            names = sorted({w["id"] for w in await self.api.list_workloads()
                            if hot & set(w.get("nodes") or [])})[:MAX_DETAILS]
            for name in names:
                placed += placed_of(await self.api.get_workload(name))
        moves = rb.plan(spec, now, nodes, placed, [])
        evidence = [Evidence(source="store", ref=f"node/{n.id}") for n in nodes if n.id in hot][:16]
        inputs = {"resource": spec.resource, "utilisation": {n.id: round(rb.utilisation(n, spec.resource), 1)
                                                             for n in nodes}}
        if not moves:
            return [Decision(**base, inputs=inputs, evidence=evidence, outcome=Outcome.NONE,
                             reason=f"no node above {spec.high_percent}% with a node below {spec.low_percent}%"
                             if not hot else "nothing movable")]
        out = []
        for m in moves:
            action = {"type": "move", "workload": m.workload, "target": m.instance, "from": m.source, "to": m.dest}
            if m.held_by:
                outcome, held, reason = Outcome.NONE, m.held_by, m.reason
            elif p.spec.dry_run:
                outcome, held, reason = Outcome.DRY_RUN, "", m.reason
            else:
                outcome, held, reason = Outcome.NONE, "verify", (f"{m.reason}; planned and verified, not executed: "
                                                                 "the scheduler has no instance move yet")
            out.append(Decision(**base, inputs=inputs, evidence=evidence, action=action, outcome=outcome,
                                held_by=held, reason=reason[:1000]))
        return out
