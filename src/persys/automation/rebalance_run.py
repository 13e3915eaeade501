"""The rebalance policy at the edge: nodes and workloads through the client API into the pure
plan (`rebalance.plan`), every candidate recorded with its destination or the limit that held it,
and each verified move executed through the scheduler's move API (`persysctl move`), which checks
it again with the placement engine on the live snapshot, stops the instance before it starts
elsewhere and records `movedAt` on it. A dry run records the plan and moves nothing.

The budgets count what was done: this policy's moves in the last hour and every rebalance move
(all policies) from the decision log; the hold reads each instance's `movedAt` (any mover's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from persys.automation import rebalance as rb
from persys.automation.seams import AutomationApi
from persys.client import SchedulerError
from persys.model.automation import Decision, Evidence, Outcome, Policy
from persys.scheduler import placement as pl

MAX_DETAILS = 50  # workloads read in full per pass (those on overloaded nodes)
HISTORY = 5_000  # decisions read back to count the moves of the last hour


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


def node_local_data(spec: dict[str, Any]) -> bool:
    """Whether an instance's data may be node-local: an inline local volume, or a claim (whose
    Volume may be local: the automation does not read volume records; they stay)."""
    return any(v.get("claim") or v.get("driver", "local") == "local" for v in spec.get("volumes") or [])


def placed_of(w: dict[str, Any]) -> list[rb.Placed]:
    """The workload's instances that sit on a node (one being moved or placed is not a candidate)."""
    spec = w.get("spec") or {}
    res = spec.get("resources") or {}
    tolerations = tuple(pl.Toleration(t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""),
                                      t.get("effect", "")) for t in spec.get("tolerations") or [])
    replicas = int(w.get("replicas", spec.get("replicas", 1)) or 1)
    return [rb.Placed(w["name"], i["instance"], i["node"], spec.get("type", ""), int(res.get("cpuMillicores", 0)),
                      int(res.get("memoryMb", 0)), node_local_data(spec),
                      tuple(sorted((spec.get("nodeSelector") or {}).items())), tolerations,
                      frozenset(spec.get("requiredFeatures") or []), int(spec.get("priority") or 0),
                      float(i.get("movedAt") or 0.0))
            for i in w.get("instances", [])[:replicas] if i.get("node") and i.get("phase") != "Pending"]


def moves_done(decisions: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(time, policy, workload) of each move done, from the decision log."""
    return [(float(d["ts"]), str(d.get("policy", "")), str((d.get("action") or {}).get("workload", "")))
            for d in decisions if d.get("outcome") == Outcome.ACTED.value
            and (d.get("action") or {}).get("type") == "move"]


class RebalanceLoop:
    def __init__(self, api: AutomationApi, may_act: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.may_act = may_act  # still the cluster's one automation (its lease: leadership.py)

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
        done = moves_done(await self.api.list_decisions("", now - rb.HOUR, HISTORY, Outcome.ACTED.value)) if hot else []
        mine = [(ts, w) for ts, policy, w in done if policy == p.name]
        moves = rb.plan(spec, now, nodes, placed, mine, len(done))
        evidence = [Evidence(source="store", ref=f"node/{n.id}") for n in nodes if n.id in hot][:16]
        inputs = {"resource": spec.resource, "utilisation": {n.id: round(rb.utilisation(n, spec.resource), 1)
                                                             for n in nodes},
                  "movesLastHour": len(mine), "clusterMovesLastHour": len(done)}
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
            elif not self.may_act():
                outcome, held, reason = Outcome.NONE, "lease", f"{m.reason}; not moved: this automation lost its lease"
            else:
                outcome, held, reason = await self._move(m)
            out.append(Decision(**base, inputs=inputs, evidence=evidence, action=action, outcome=outcome,
                                held_by=held, reason=reason[:1000]))
        return out

    async def _move(self, m: rb.Move) -> tuple[Outcome, str, str]:
        """Execute one verified move; the scheduler checks it again on its live snapshot."""
        assert m.dest is not None
        try:
            r = await self.api.move_instance(m.workload, m.instance, m.dest)
        except SchedulerError as err:
            return Outcome.FAILED, "", f"{m.reason}; move refused: {err.code}: {err.message}"
        return Outcome.ACTED, "", f"{m.reason}; moving {r['instance']} {r['from']} -> {r['to']}"
