"""REST routes of Persys Intelligence (docs/intelligence.md): `why` for a workload, a node or
the cluster. Each answer is the investigation (ranked findings citing evidence ids, what was
looked at) and the evidence bundle itself, so a reader (the dashboard) shows each cited piece
beside the finding. The reads are made as the intelligence identity (viewer rights only),
whoever asked: the route's own rule (security.permissions) decides who may ask."""

from __future__ import annotations

from typing import Any

import grpc
from fastapi import APIRouter

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import fetch_logs
from persys.client import SchedulerClient
from persys.gateway.routes.common import NodeId, WorkloadId
from persys.gateway.routes.logs import instance_target
from persys.gateway.schemas import SCHEDULER_ERRORS
from persys.intelligence.retriever import Retriever
from persys.intelligence.why import why
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


def retriever_for(client: SchedulerClient, agent_tls: TLSFiles | None) -> Retriever:
    return Retriever(client, AgentLogs(client, agent_tls))


def intelligence_routes(client: SchedulerClient, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter(tags=["intelligence"])
    retriever = retriever_for(client, agent_tls)

    @router.get("/v1/why/workloads/{workload_id}", responses=SCHEDULER_ERRORS)
    async def why_workload(workload_id: str = WorkloadId) -> dict[str, Any]:
        """Why the workload is as it is: findings ranked (`findings[0]` the likeliest root cause),
        each citing evidence ids found in `evidence`; `inconclusive` with `lookedAt` when no rule
        found anything."""
        ev = await retriever.for_workload(workload_id)
        return {**why(ev, f"workload/{workload_id}").to_dict(), "evidence": ev.to_dict()}

    @router.get("/v1/why/nodes/{node_id}", responses=SCHEDULER_ERRORS)
    async def why_node(node_id: str = NodeId) -> dict[str, Any]:
        """What is wrong with the node (NotReady, disk, runtimes, taints, failures its workloads share)."""
        ev = await retriever.for_node(node_id)
        return {**why(ev, f"node/{node_id}").to_dict(), "evidence": ev.to_dict()}

    @router.get("/v1/why/cluster", responses=SCHEDULER_ERRORS)
    async def why_cluster() -> dict[str, Any]:
        """What is wrong with the control plane (store, event bus, secret store, meter, mode) and its nodes."""
        ev = await retriever.for_cluster()
        return {**why(ev, "cluster").to_dict(), "evidence": ev.to_dict()}

    return router
