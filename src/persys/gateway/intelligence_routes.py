"""REST routes of Persys Intelligence (docs/intelligence.md): `why` for a workload, a node or
the cluster. Each answer is the investigation (ranked findings citing evidence ids, what was
looked at) and the evidence bundle itself, so a reader (the dashboard) shows each cited piece
beside the finding. The reads are made as the intelligence identity (viewer rights only),
whoever asked: the route's own rule (security.permissions) decides who may ask."""

from __future__ import annotations

import os
from typing import Any

import grpc
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import fetch_logs
from persys.client import SchedulerClient
from persys.gateway.routes.common import NodeId, WorkloadId
from persys.gateway.routes.logs import instance_target
from persys.gateway.schemas import SCHEDULER_ERRORS
from persys.intelligence.analyses import FORECAST_METRICS, forecast_usage, rightsize
from persys.intelligence.evidence import Evidence
from persys.intelligence.insights import insights
from persys.intelligence.narration import config_from, narrate
from persys.intelligence.record import InvestigationRecord
from persys.intelligence.retriever import Retriever, UsageReader, step_for
from persys.intelligence.why import why
from persys.meter.query import QueryError, seconds
from persys.security import forwarding
from persys.tlsfiles import TLSFiles

MAX_FORECAST_POINTS = 5000


class AgentLogs:
    """The last lines of an instance's output, read from its node's agent as the logs route does."""

    def __init__(self, client: SchedulerClient, agent_tls: TLSFiles | None) -> None:
        self.client, self.agent_tls = client, agent_tls

    async def tail(self, workload: dict[str, Any], instance: str, lines: int) -> str | None:
        target = await instance_target(self.client, self.agent_tls, workload, str(workload.get("id", "")), instance,
                                       "logs")
        address, node = getattr(target, "address", ""), getattr(target, "node", "")
        if self.agent_tls is None or not address:
            return None  # an answer saying why not (not placed, no agent endpoint)
        try:
            return await fetch_logs(address, self.agent_tls, apb.LogsRequest(instance_id=instance, tail=lines),
                                    node_id=node)
        except grpc.aio.AioRpcError:
            return None


def asked_by() -> str:
    """Who asked, for the record: the principal, never a bearer token itself."""
    md = dict(forwarding.current())
    if forwarding.ON_BEHALF_OF in md:
        return forwarding.principal_from(md[forwarding.ON_BEHALF_OF])
    return "an API token" if forwarding.AUTHORIZATION in md else "unknown"


def retriever_for(client: SchedulerClient, agent_tls: TLSFiles | None) -> Retriever:
    return Retriever(client, AgentLogs(client, agent_tls))


def intelligence_routes(client: SchedulerClient, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter(tags=["intelligence"])
    retriever = retriever_for(client, agent_tls)

    narration = config_from(os.environ)

    record = InvestigationRecord()

    async def answer(ev: Evidence, subject: str, narrate_it: bool) -> dict[str, Any]:
        investigation = why(ev, subject)
        entry = record.add(investigation, ev.now, asked_by())
        inv = investigation.to_dict()  # the findings are final before any narration is asked for
        out = {**inv, "evidence": ev.to_dict(), "record": entry["id"]}
        if narrate_it:
            out["narration"] = await narrate(inv, narration)
        return out

    @router.get("/v1/investigations")
    async def investigations(subject: str = Query("", max_length=300), inconclusive: bool | None = None,
                             limit: int = Query(100, ge=1, le=500)) -> list[dict[str, Any]]:
        """The `why` investigations this gateway answered, newest first (the last 500), conclusive
        or not, each with what it looked at: an inconclusive run leaves a record."""
        return record.list(subject, inconclusive, limit)

    @router.get("/v1/why/workloads/{workload_id}", responses=SCHEDULER_ERRORS)
    async def why_workload(workload_id: str = WorkloadId, narrate: bool = False) -> dict[str, Any]:
        """Why the workload is as it is: findings ranked (`findings[0]` the likeliest root cause),
        each citing evidence ids found in `evidence`; `inconclusive` with `lookedAt` when no rule
        found anything. `narrate=true`: also prose from the configured endpoint (`narration`,
        with what was sent), when the gateway has one."""
        return await answer(await retriever.for_workload(workload_id), f"workload/{workload_id}", narrate)

    @router.get("/v1/why/nodes/{node_id}", responses=SCHEDULER_ERRORS)
    async def why_node(node_id: str = NodeId, narrate: bool = False) -> dict[str, Any]:
        """What is wrong with the node (NotReady, disk, runtimes, taints, failures its workloads share)."""
        return await answer(await retriever.for_node(node_id), f"node/{node_id}", narrate)

    @router.get("/v1/why/cluster", responses=SCHEDULER_ERRORS)
    async def why_cluster(narrate: bool = False) -> dict[str, Any]:
        """What is wrong with the control plane (store, event bus, secret store, meter, mode) and its nodes."""
        return await answer(await retriever.for_cluster(), "cluster", narrate)

    @router.get("/v1/insights", responses=SCHEDULER_ERRORS)
    async def cluster_insights() -> dict[str, Any]:
        """Cluster-wide recommendations ranked, each with `evidence` and `expectedEffect`: the control
        plane's findings, failing workloads' likeliest causes, rightsizing, and nodes that could be
        emptied (`consolidation`: where each instance would go, capacity left)."""
        return await insights(retriever, UsageReader(client), rightsize)

    router.include_router(usage_routes(client))
    return router


def usage_routes(client: SchedulerClient) -> APIRouter:
    """Rightsizing and forecasts: analyses of Persys Meter's history."""
    router = APIRouter(tags=["intelligence"])
    reader = UsageReader(client)

    def durations(**given: str) -> dict[str, float] | JSONResponse:
        try:
            return {k: seconds(v, k) for k, v in given.items()}
        except QueryError as err:
            return JSONResponse({"error": str(err), "code": "INVALID_ARGUMENT", "problems": [str(err)]},
                                status_code=400)

    @router.get("/v1/rightsize/workloads/{workload_id}", responses=SCHEDULER_ERRORS)
    async def rightsize_workload(workload_id: str = WorkloadId, since: str = "7d") -> Any:
        """Recommended CPU and memory requests from the last `since` of meter history: target,
        bounds (wide when history is short), confidence, and a backtest of the current request
        and of the target over the same samples (throttled CPU samples, memory samples over)."""
        d = durations(since=since)
        if isinstance(d, JSONResponse):
            return d
        return await rightsize(reader, workload_id, d["since"])

    async def forecast_answer(kind: str, name: str, metric: str, since: str, horizon: str) -> Any:
        if metric not in FORECAST_METRICS:
            problem = f"metric: {metric!r} is not one of {', '.join(FORECAST_METRICS)}"
            return JSONResponse({"error": problem, "code": "INVALID_ARGUMENT", "problems": [problem]}, status_code=400)
        d = durations(since=since, horizon=horizon)
        if isinstance(d, JSONResponse):
            return d
        if d["horizon"] > d["since"] or d["horizon"] / step_for(d["since"]) > MAX_FORECAST_POINTS:
            problem = (f"horizon: {horizon} is longer than the history it is fitted on ({since}) or would be over "
                       f"{MAX_FORECAST_POINTS} points")
            return JSONResponse({"error": problem, "code": "INVALID_ARGUMENT", "problems": [problem]}, status_code=400)
        return await forecast_usage(reader, kind, name, metric, d["since"], d["horizon"])

    @router.get("/v1/forecast/nodes/{node_id}", responses=SCHEDULER_ERRORS)
    async def forecast_node(node_id: str = NodeId, metric: str = "cpu", since: str = "14d", horizon: str = "1d"
                            ) -> Any:
        """The node's `metric` over the next `horizon` with 80 % intervals, from the last `since`;
        with its backtested MASE against seasonal naive and interval coverage ("unpredictable"
        when it does not beat seasonal naive or the history's mean)."""
        return await forecast_answer("node", node_id, metric, since, horizon)

    @router.get("/v1/forecast/cluster", responses=SCHEDULER_ERRORS)
    async def forecast_cluster(metric: str = "cpu", since: str = "14d", horizon: str = "1d") -> Any:
        """As for a node, over the sum of every node's series."""
        return await forecast_answer("cluster", "", metric, since, horizon)

    return router
