"""Rightsizing and forecasts over what the UsageReader reads: the glue between the meter's
answers and the pure functions (rightsize.recommend, forecast.forecast)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from persys.intelligence.automation_overlap import annotate, overlaps
from persys.intelligence.evidence import Series
from persys.intelligence.forecast import ForecastError, forecast
from persys.intelligence.retriever import UsageReader, step_for
from persys.intelligence.rightsize import recommend
from persys.intelligence.signatures import SIGKILL_WORDS, classify

FORECAST_METRICS = {"cpu": ("cpu", "avg", "percent of one core"), "memory": ("memory", "avg", "bytes"),
                    "disk": ("disk-used", "avg", "bytes"),  # space used (the agent's filesystems)
                    "disk-read": ("disk-read", "avg", "bytes/s"), "disk-write": ("disk-write", "avg", "bytes/s")}


def _oom_kills(events: list[Any]) -> int:
    return sum(1 for e in events if e.kind == "WorkloadFailed" and (
        any(s.cause == "oom-kill" for s in classify(e.reason, e.text()))
        or any(w in e.message.lower() for w in SIGKILL_WORDS)))


async def rightsize(reader: UsageReader, name: str, window: float) -> dict[str, Any]:
    view = await reader.workload(name)
    res = ((view.get("spec") or {}).get("resources") or {})
    cpu, looked = await reader.series("workload", name, "cpu", "avg", window)
    mem, looked2 = await reader.series("workload", name, "memory", "max", window)
    events = await reader.events(f"workload/{name}")
    ooms = _oom_kills(events)
    rec = recommend(name, [p for s in cpu for p in s.points], [p for s in mem for p in s.points], time.time(),
                    float(res.get("cpuMillicores", 0) or 0), float(res.get("memoryMb", 0) or 0), ooms,
                    tuple([f"workload/{name}@{view.get('revision', '')}", *[s.id for s in (*cpu, *mem)]]))
    policies, looked3 = await reader.policies()
    return annotate({**rec.to_dict(), "lookedAt": looked + looked2 + looked3, "oomKills": ooms},
                    overlaps(policies, name))


def _scale(node: dict[str, Any], metric: str) -> float:
    """Node CPU samples are percent of the whole host (the agent's /proc/stat share); forecasts
    speak percent of one core, as workloads' do, so a cluster's sum adds like with like."""
    return float((node.get("capabilities") or {}).get("cpuMillicores", 1000) or 1000) / 1000 if metric == "cpu" else 1.0


async def forecast_usage(reader: UsageReader, kind: str, name: str, metric: str, window: float, horizon: float
                         ) -> dict[str, Any]:
    """`kind` node (one node's series) or cluster (the sum over nodes at each time)."""
    meter_metric, agg, _ = FORECAST_METRICS[metric]
    nodes = [n for n in await reader.nodes() if kind == "cluster" or n.get("id") == name]
    read = [(node, *await reader.series("node", str(node.get("id", "")), meter_metric, agg, window)) for node in nodes]
    return usage_forecast(kind, name, metric, window, horizon, read)


def usage_forecast(kind: str, name: str, metric: str, window: float, horizon: float,
                   read: Sequence[tuple[dict[str, Any], list[Series], list[str]]]) -> dict[str, Any]:
    """The forecast of what was read (pure, CPU-bound: each node with its meter series and what
    could not be read), summed over the nodes at each time for `kind` cluster."""
    _, _, unit = FORECAST_METRICS[metric]
    nodes = [node for node, _, _ in read]
    sums: dict[float, float] = defaultdict(float)
    looked: list[str] = []
    ids: list[str] = []
    step = None
    for node, series, more in read:
        looked += more
        ids += [s.id for s in series]
        scale = _scale(node, metric)
        for s in series:
            step = step or s.step
            for t, v in s.points:
                sums[t] += v * scale
    if not nodes:
        looked.append(f"node {name}: not found" if kind == "node" else "no nodes")
    points = sorted(sums.items())
    base = {"subject": f"{kind}/{name}" if kind == "node" else "cluster", "metric": metric, "unit": unit,
            "windowSeconds": window, "horizonSeconds": horizon, "evidence": ids, "lookedAt": looked}
    try:
        f = forecast(points, float(step or step_for(window)), horizon)
    except ForecastError as err:
        return {**base, "points": [], "verdict": "insufficient history", "unpredictable": True, "error": str(err),
                "mase": None, "coverage80": None}
    out = {**base, "step": step or step_for(window), **f.to_dict()}
    out["points"] = [[t, p, max(lo, 0.0), hi] for t, p, lo, hi in out["points"]]  # usage is never negative
    return out
