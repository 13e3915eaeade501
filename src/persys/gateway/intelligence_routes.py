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
from persys.intelligence.api import BadInput, IntelligenceApi, problem
from persys.intelligence.narration import config_from
from persys.intelligence.retriever import Retriever, UsageReader
from persys.security import forwarding
from persys.tlsfiles import TLSFiles


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


def intelligence_api(client: SchedulerClient, agent_tls: TLSFiles | None) -> IntelligenceApi:
    """The one answerer the REST routes and the gRPC service share (one investigation record)."""
    return IntelligenceApi(retriever_for(client, agent_tls), UsageReader(client), config_from(os.environ), asked_by)


def _bad(err: BadInput) -> JSONResponse:
    return JSONResponse(dict(problem(err)), status_code=400)


def intelligence_routes(api: IntelligenceApi) -> APIRouter:
    """`why` and its investigations here; the analyses in `_analysis_routes`."""
    router = APIRouter(tags=["intelligence"])

    @router.get("/v1/investigations")
    async def investigations(subject: str = Query("", max_length=300), inconclusive: bool | None = None,
                             limit: int = Query(100, ge=1, le=500)) -> list[dict[str, Any]]:
        """The `why` investigations this gateway answered, newest first (the last 500), conclusive
        or not, each with what it looked at: an inconclusive run leaves a record."""
        return api.investigations(subject, inconclusive, limit)

    @router.get("/v1/why/workloads/{workload_id}", responses=SCHEDULER_ERRORS)
    async def why_workload(workload_id: str = WorkloadId, narrate: bool = False) -> dict[str, Any]:
        """Why the workload is as it is: findings ranked (`findings[0]` the likeliest root cause),
        each citing evidence ids found in `evidence`; `inconclusive` with `lookedAt` when no rule
        found anything. `narrate=true`: also prose from the configured endpoint (`narration`,
        with what was sent), when the gateway has one."""
        return await api.why_workload(workload_id, narrate)

    @router.get("/v1/why/nodes/{node_id}", responses=SCHEDULER_ERRORS)
    async def why_node(node_id: str = NodeId, narrate: bool = False) -> dict[str, Any]:
        """What is wrong with the node (NotReady, disk, runtimes, taints, failures its workloads share)."""
        return await api.why_node(node_id, narrate)

    @router.get("/v1/why/cluster", responses=SCHEDULER_ERRORS)
    async def why_cluster(narrate: bool = False) -> dict[str, Any]:
        """What is wrong with the control plane (store, event bus, secret store, meter, mode) and its nodes."""
        return await api.why_cluster(narrate)

    _analysis_routes(router, api)
    return router


def _analysis_routes(router: APIRouter, api: IntelligenceApi) -> None:
    """The read-only analyses: insights, rightsizing and forecasts."""

    @router.get("/v1/insights", responses=SCHEDULER_ERRORS)
    async def cluster_insights() -> dict[str, Any]:
        """Cluster-wide recommendations ranked, each with `evidence` and `expectedEffect`: the control
        plane's findings, failing workloads' likeliest causes, rightsizing, and nodes that could be
        emptied (`consolidation`: where each instance would go, capacity left, computed through the
        scheduler's own what-if plans)."""
        return await api.insights()

    @router.get("/v1/rightsize/workloads/{workload_id}", responses=SCHEDULER_ERRORS)
    async def rightsize_workload(workload_id: str = WorkloadId, since: str = "7d") -> Any:
        """Recommended CPU and memory requests from the last `since` of meter history: target,
        bounds (wide when history is short), confidence, and a backtest of the current request
        and of the target over the same samples (throttled CPU samples, memory samples over);
        `warnings` when an automation policy scales the workload on the same metric."""
        try:
            return await api.rightsize(workload_id, since)
        except BadInput as err:
            return _bad(err)

    @router.get("/v1/forecast/nodes/{node_id}", responses=SCHEDULER_ERRORS)
    async def forecast_node(node_id: str = NodeId, metric: str = "cpu", since: str = "14d", horizon: str = "1d"
                            ) -> Any:
        """The node's `metric` over the next `horizon` with 80 % intervals, from the last `since`;
        with its backtested MASE against seasonal naive and interval coverage ("unpredictable"
        when it does not beat seasonal naive or the history's mean)."""
        try:
            return await api.forecast("node", node_id, metric, since, horizon)
        except BadInput as err:
            return _bad(err)

    @router.get("/v1/forecast/cluster", responses=SCHEDULER_ERRORS)
    async def forecast_cluster(metric: str = "cpu", since: str = "14d", horizon: str = "1d") -> Any:
        """As for a node, over the sum of every node's series."""
        try:
            return await api.forecast("cluster", "", metric, since, horizon)
        except BadInput as err:
            return _bad(err)
