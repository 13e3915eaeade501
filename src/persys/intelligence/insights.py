"""`insights`: cluster-wide recommendations, each with its evidence and expected effect.

Gathered from the other analyses, bounded: the control plane's findings (why cluster), the
likeliest cause of each failing or pending workload (the rules over its summary, at most
MAX_WORKLOADS), rightsizing where the request is far from the use or the backtest shows
throttling or memory over the request (at most MAX_RIGHTSIZE workloads with meter history), and
consolidation (nodes that could be emptied, through a WhatIfPlanner)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from persys.client import SchedulerError
from persys.intelligence.analyses import forecast_usage
from persys.intelligence.consolidation import (
    Consolidation,
    SchedulerPlanner,
    WhatIfPlanner,
    consolidate,
    workloads_from_views,
)
from persys.intelligence.evidence import Document, Evidence
from persys.intelligence.retriever import Retriever, UsageReader, as_intelligence
from persys.intelligence.why import why

MAX_WORKLOADS = 200
MAX_RIGHTSIZE = 30
MAX_INVESTIGATED = 20  # failing workloads investigated in full (events, logs, meter); the rest from their summary
OVER_PROVISIONED = 0.5  # target below half the request: worth shrinking
RIGHTSIZE_WINDOW = 7 * 86400.0
FORECAST_WINDOW, FORECAST_HORIZON = 14 * 86400.0, 86400.0
MAX_FORECAST_NODES = 50


def _rec(kind: str, subject: str, summary: str, effect: str, evidence: list[str], score: float,
         detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": kind, "subject": subject, "summary": summary, "expectedEffect": effect, "evidence": evidence,
            "score": round(score, 1), "detail": detail or {}}


def troubled(w: dict[str, Any]) -> bool:
    insts = w.get("instances") or [w]
    return any(i.get("phase") in ("Failed", "Pending") or int(i.get("restarts", 0) or 0) >= 3 for i in insts)


def workload_recommendations(evidence: dict[str, Evidence], summaries: list[dict[str, Any]],
                             health: Document | None, now: float) -> list[dict[str, Any]]:
    """The first finding of each workload not running as asked: pure, over each one's evidence
    (the full bundle for the first MAX_INVESTIGATED, else its summary from the list)."""
    out = []
    for w in summaries[:MAX_WORKLOADS]:
        if not troubled(w):
            continue
        insts = w.get("instances") or [w]
        doc = Document("workload", str(w["id"]), str(w.get("revision", "")), w)
        ev = evidence.get(str(w["id"])) or Evidence(now, (doc, *([health] if health else [])))
        inv = why(ev, f"workload/{w['id']}")
        if not inv.findings:
            continue
        f = inv.findings[0]
        n = sum(1 for i in insts if i.get("phase") != "Running") or len(insts)  # crash-looping ones show Running
        out.append(_rec("fix-workload", f.subject, f"{f.cause}: {f.summary}",
                        f"{n} instance(s) of {w['id']} can run once fixed: {f.remedy}", list(f.evidence), f.score,
                        {"cause": f.cause}))
    return out


def rightsize_recommendations(name: str, r: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    cpu, mem = r.get("cpu"), r.get("memory")
    ev = list(r.get("evidence") or [])
    if cpu and r.get("confidence", 0) > 0:
        cur, tgt = cpu["current"], cpu["target"]
        throttled = cpu["backtest"]["atCurrent"]["over"]
        at = cpu["backtest"]["atTarget"]
        if cur and tgt < OVER_PROVISIONED * cur:
            out.append(_rec("rightsize-cpu", f"workload/{name}", f"CPU request {cur}m, p90 use needs {tgt}m",
                            f"frees {cur - tgt} millicores per instance; at {tgt}m the history shows "
                            f"{at['over']} throttled samples of {at['samples']}", ev, 40,
                            {"confidence": r["confidence"]}))
        elif throttled:
            out.append(_rec("rightsize-cpu", f"workload/{name}", f"{throttled} samples above the {cur}m request",
                            f"at {tgt}m: {cpu['backtest']['atTarget']['over']} samples above", ev, 55))
    if mem and mem["backtest"]["atCurrent"]["over"]:
        out.append(_rec("rightsize-memory", f"workload/{name}",
                        f"{mem['backtest']['atCurrent']['over']} memory samples above the {mem['current']} MiB request",
                        f"at {mem['target']} MiB: no sample above (never recommended below its peak)", ev, 65))
    elif mem and mem["current"] and mem["target"] < OVER_PROVISIONED * mem["current"] and r.get("confidence", 0) > 0.3:
        out.append(_rec("rightsize-memory", f"workload/{name}", f"memory request {mem['current']} MiB, peak needs "
                        f"{mem['target']} MiB", f"frees {mem['current'] - mem['target']} MiB per instance", ev, 35))
    return out


def capacity_recommendation(fc: dict[str, Any], capacity: float) -> dict[str, Any] | None:
    """A cluster forecast (analyses.forecast_usage's answer) whose point forecast crosses the
    Ready nodes' capacity within the horizon: when, with the backtest that makes it credible.
    An unpredictable forecast recommends nothing (never act on a forecast alone that failed its
    backtest)."""
    if fc.get("unpredictable", True) or capacity <= 0 or not fc.get("points"):
        return None
    over = [p for p in fc["points"] if p[1] >= capacity]
    if not over:
        return None
    hours = (over[0][0] - fc["points"][0][0]) / 3600 + fc["step"] / 3600
    return _rec("capacity", "cluster", f"{fc['metric']} forecast reaches the Ready nodes' capacity ({capacity:.0f} "
                f"{fc['unit']}) in {hours:.1f} h", f"add capacity (or shrink requests) before then; forecast MASE "
                f"{fc['mase']}, 80 % interval coverage {fc['coverage80']} on its backtest", list(fc["evidence"]), 75,
                {"metric": fc["metric"], "hours": round(hours, 1)})


async def consolidation(retriever: Retriever, nodes: list[Any], summaries: list[dict[str, Any]], looked: list[str],
                        planner_for: Callable[[list[dict[str, Any]], list[dict[str, Any]]], WhatIfPlanner] | None
                        ) -> Consolidation:
    """Nodes that could be emptied, through the scheduler's own what-if plans (SchedulerPlanner)
    unless a test gives another planner; what could not be read goes to `looked`."""
    views = []
    async with as_intelligence():
        for w in summaries[:MAX_WORKLOADS]:
            try:
                views.append(await retriever.api.get_workload(str(w["id"])))
            except SchedulerError as err:
                looked.append(f"workload {w['id']}: {err.code}: {err}")
    planner = (planner_for or (lambda n, v: SchedulerPlanner(retriever.api, workloads_from_views(v))))(
        [dict(n) for n in nodes], views)
    async with as_intelligence():  # the what-if plan is a read (`plan workloads`, a viewer's right)
        try:
            return await consolidate(nodes, planner)
        except SchedulerError as err:
            looked.append(f"consolidation: PlanOperation: {err.code}: {err}")
            return Consolidation((), (), {})


async def insights(retriever: Retriever, reader: UsageReader,
                   rightsize: Callable[[UsageReader, str, float], Awaitable[dict[str, Any]]],
                   planner_for: Callable[[list[dict[str, Any]], list[dict[str, Any]]], WhatIfPlanner] | None = None
                   ) -> dict[str, Any]:
    now = time.time()
    looked: list[str] = []
    cluster_ev = await retriever.for_cluster()
    recs = [_rec("control-plane", f.subject, f"{f.cause}: {f.summary}", f.remedy, list(f.evidence), f.score)
            for f in why(cluster_ev, "cluster").findings]
    summaries = await reader.workloads()
    bundles: dict[str, Evidence] = {}
    for w in [w for w in summaries if troubled(w)][:MAX_INVESTIGATED]:
        try:
            bundles[str(w["id"])] = await retriever.for_workload(str(w["id"]))
        except SchedulerError as err:
            looked.append(f"why {w['id']}: {err.code}: {err}")
    recs += workload_recommendations(bundles, summaries, cluster_ev.document("health"), now)
    running = [w for w in summaries if w.get("phase") == "Running"][:MAX_RIGHTSIZE]
    for w in running:
        try:
            recs += rightsize_recommendations(str(w["id"]), await rightsize(reader, str(w["id"]), RIGHTSIZE_WINDOW))
        except SchedulerError as err:
            looked.append(f"rightsize {w['id']}: {err.code}: {err}")
    nodes = [d.body for d in cluster_ev.docs("node")]
    plan = await consolidation(retriever, nodes, summaries, looked, planner_for)
    for p in plan.emptiable:
        node_doc = cluster_ev.document("node", p.node)
        moves = ", ".join(f"{m.instance} -> {m.to}" for m in p.moves) or "nothing runs there"
        recs.append(_rec("consolidate", f"node/{p.node}", f"node {p.node} could be emptied: {moves}",
                         f"one node fewer; capacity left on the others: {dict(plan.capacity_left)}",
                         [node_doc.id] if node_doc else [], 30, {"moves": [m.__dict__ for m in p.moves]}))
    ready = [n for n in nodes if n.get("status") == "Ready"]
    caps = {"cpu": sum((n.get("capabilities") or {}).get("cpuMillicores", 0) for n in ready) / 10.0,
            "memory": sum((n.get("capabilities") or {}).get("memoryMb", 0) for n in ready) * 2.0**20,
            # the filesystems the agents report (their state and volume folders): diskMb is the state's
            "disk": sum((n.get("capabilities") or {}).get("diskMb", 0) for n in ready) * 2.0**20}
    if len(ready) <= MAX_FORECAST_NODES:
        for metric, capacity in caps.items():
            fc = await forecast_usage(reader, "cluster", "", metric, FORECAST_WINDOW, FORECAST_HORIZON)
            rec = capacity_recommendation(fc, capacity)
            if rec is not None:
                recs.append(rec)
            elif fc.get("verdict") != "forecast":
                looked.append(f"cluster {metric} forecast: {fc.get('verdict')}")
    recs.sort(key=lambda r: (-r["score"], r["kind"], r["subject"]))
    return {"recommendations": [r for r in recs if r["evidence"]], "consolidation": plan.to_dict(),
            "lookedAt": cluster_ev.summary() + looked, "generatedAt": now}
