"""Persys Intelligence's disk forecasts in the automation process (seams.DiskForecasts): each
node's used disk bytes forecast by Intelligence's own model (`intelligence.analyses.
usage_forecast`, what `persysctl forecast node N --metric disk` answers) over the meter's
`disk-used` series, against the node's advertised disk (capabilities.diskMb).

Read as the automation's own identity, with a viewer's reads only (`list nodes`, `get telemetry`):
not through Intelligence's UsageReader, whose calls are forwarded as user:persys-intelligence, a
forwarding the scheduler believes only from a gateway (from the automation it would silently
read as the automation anyway; saying who reads is clearer than relying on that).

The fit is CPU work (~130 ms for a week of 3-minute samples): it runs in a worker thread, and a
node's forecast is kept for one meter step (no newer sample can change it before then).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from persys.intelligence.analyses import FORECAST_METRICS, usage_forecast
from persys.intelligence.api import MAX_FORECAST_POINTS
from persys.intelligence.retriever import read_series, step_for

MIB = 2**20
MAX_NODES = 256  # forecasts per call: the nodes first by id (a bigger cluster: say so, below)


class NodeReads(Protocol):
    """What the adapter calls (a subset of SchedulerClient, reads only)."""

    async def list_nodes(self) -> list[dict[str, Any]]: ...
    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]: ...


def capacity_bytes(node: dict[str, Any]) -> int:
    """A node's disk as it advertises it (capabilities.diskMb, MiB), 0 when it does not say or
    says nonsense: a forecast with no capacity never calls the node full (remediate.filling)."""
    caps = node.get("capabilities")
    raw = caps.get("diskMb", 0) if isinstance(caps, dict) else 0
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        return 0
    return int(raw) * MIB


def horizon_for(history_seconds: float, horizon_seconds: float) -> float:
    """The horizon actually forecast: at most MAX_FORECAST_POINTS steps of the history's step
    (the cap the forecast API has); a shorter horizon only looks less far ahead."""
    return min(horizon_seconds, float(MAX_FORECAST_POINTS * step_for(history_seconds)))


def entry(node: dict[str, Any], forecast: dict[str, Any]) -> dict[str, Any]:
    """One item of the seam: the node, its capacity, the series the forecast cites, the forecast."""
    cited = forecast.get("evidence") or []
    return {"node": str(node.get("id", "")), "capacityBytes": capacity_bytes(node),
            "evidence": str(cited[0]) if cited else "", "forecast": forecast}


@dataclass
class _Kept:
    until: float
    item: dict[str, Any]


class NodeDiskForecasts:
    def __init__(self, api: NodeReads, clock: Callable[[], float] = time.time, max_nodes: int = MAX_NODES) -> None:
        self.api = api
        self.clock = clock
        self.max_nodes = max_nodes
        self.kept: dict[tuple[str, float, float], _Kept] = {}
        self.note = ""  # what the last call left out, if anything

    async def disk_forecasts(self, history_seconds: float, horizon_seconds: float) -> list[dict[str, Any]]:
        metric, agg, _ = FORECAST_METRICS["disk"]
        horizon = horizon_for(history_seconds, horizon_seconds)
        nodes = sorted(await self.api.list_nodes(), key=lambda n: str(n.get("id", "")))
        self.note = (f"{len(nodes) - self.max_nodes} nodes past the first {self.max_nodes} not forecast"
                     if len(nodes) > self.max_nodes else "")
        now = self.clock()
        out = []
        seen = set()
        for node in nodes[:self.max_nodes]:
            name = str(node.get("id", ""))
            key = (name, history_seconds, horizon)
            seen.add(key)
            kept = self.kept.get(key)
            if kept is not None and now < kept.until:
                out.append({**kept.item, "capacityBytes": capacity_bytes(node)})
                continue
            series, looked = await read_series(self.api, "node", name, metric, agg, history_seconds)
            f = await asyncio.to_thread(usage_forecast, "node", name, "disk", history_seconds, horizon,
                                        [(node, series, looked)])
            item = entry(node, f)
            self.kept[key] = _Kept(now + step_for(history_seconds), item)
            out.append(item)
        self.kept = {k: v for k, v in self.kept.items() if k in seen}  # nodes gone, policies changed
        return out
