"""REST routes of Persys Meter for the dashboard and persysctl: a workload's, a node's or a
label's series (`GET /v1/meter/workloads/{name}?since=1h&step=1m&metric=cpu&agg=avg`) and a
top-style summary over a window (`GET /v1/meter/top?kind=workloads&since=1h`). Durations are
parsed here (400 naming the parameter); every other bound is the scheduler's (meter/query.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient
from persys.gateway.schemas import SCHEDULER_ERRORS
from persys.meter.query import QueryError, seconds


def _bad(err: QueryError) -> JSONResponse:
    return JSONResponse({"error": str(err), "code": "INVALID_ARGUMENT", "problems": [str(err)]}, status_code=400)


def meter_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter(tags=["meter"])

    async def series(selector: str, value: str, since: str, step: str, metric: str, agg: str
                     ) -> dict[str, Any] | JSONResponse:
        try:
            window, step_s = seconds(since, "since"), seconds(step, "step")
        except QueryError as err:
            return _bad(err)
        return await client.meter_query(selector, value, metric, window, step_s, agg)

    @router.get("/v1/meter/workloads/{name}", responses=SCHEDULER_ERRORS)
    async def workload_series(name: str, since: str = "1h", step: str = "1m", metric: str = "cpu",
                              agg: str = "avg") -> Any:
        """One series per instance of the workload: `metric` (cpu, memory, disk-read, disk-write,
        net-rx, net-tx; CPU in percent of one core, memory in bytes, I/O in bytes per second)
        aggregated with `agg` (avg, max, min, sum, last) per `step` over the last `since`."""
        return await series("workload", name, since, step, metric, agg)

    @router.get("/v1/meter/nodes/{name}", responses=SCHEDULER_ERRORS)
    async def node_series(name: str, since: str = "1h", step: str = "1m", metric: str = "cpu",
                          agg: str = "avg") -> Any:
        """The node's own usage (from its heartbeats) over the last `since`; also `disk-used`, the
        bytes used on the filesystems of the agent's state and volume folders."""
        return await series("node", name, since, step, metric, agg)

    @router.get("/v1/meter/labels/{label}", responses=SCHEDULER_ERRORS)
    async def label_series(label: str, since: str = "1h", step: str = "1m", metric: str = "cpu",
                           agg: str = "avg") -> Any:
        """One series per instance of the workloads labelled `key=value`."""
        return await series("label", label, since, step, metric, agg)

    @router.get("/v1/meter/top", responses=SCHEDULER_ERRORS)
    async def top(kind: str = "workloads", since: str = "1h", limit: int = 500) -> Any:
        """Average and maximum of every metric per workload (or node) over the last `since`."""
        try:
            window = seconds(since, "since")
        except QueryError as err:
            return _bad(err)
        return await client.meter_summary(kind, window, max(0, min(limit, 5_000)))

    @router.get("/v1/meter/status", responses=SCHEDULER_ERRORS)
    async def status() -> dict[str, Any]:
        """The answering replica's side of the meter: samples published and dropped (a full queue,
        a bus down), and where it runs the meter, the engine, ingest backlog and lag."""
        return await client.meter_status()

    return router
