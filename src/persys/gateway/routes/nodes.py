"""Nodes: list and read, delete, cordon and drain, operator labels and taints."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from persys.client import SchedulerClient
from persys.gateway.listing import list_response
from persys.gateway.routes.common import NodeId
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, LabelChange, TaintChange, answers
from persys.scheduler.views.models import DrainStatus, NodeView
from persys.scheduler.views.pages import MAX_PAGE, TOKEN_MAX_CHARS


def node_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/nodes", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def list_nodes(limit: int | None = Query(None, ge=0, le=MAX_PAGE),
                         token: str | None = Query(None, alias="continue", max_length=TOKEN_MAX_CHARS)) -> Response:
        """Nodes; paged like GET /v1/workloads."""
        return await list_response(client, "nodes", "", limit, token)

    @router.get("/v1/nodes/{node_id}", tags=["nodes"], response_model=None,
                responses={**answers(NodeView), **SCHEDULER_ERRORS})
    async def get_node(node_id: str = NodeId) -> dict[str, Any]:
        return await client.get_node(node_id)

    @router.delete("/v1/nodes/{node_id}", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def delete_node(node_id: str = NodeId, force: bool = False) -> dict[str, Any]:
        """Remove a node. 409 while instances are assigned to it (drain it first), unless `force`:
        then they are withdrawn and placed elsewhere. 404 if there is no such node."""
        return await client.delete_node(node_id, force)

    @router.post("/v1/nodes/{node_id}/cordon", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def cordon(node_id: str = NodeId) -> dict[str, Any]:
        """Stop placing new workloads on the node; what runs there stays."""
        return await client.cordon(node_id, True)

    @router.post("/v1/nodes/{node_id}/uncordon", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def uncordon(node_id: str = NodeId) -> dict[str, Any]:
        """Allow placements again (also ends a drain)."""
        return await client.cordon(node_id, False)

    @router.post("/v1/nodes/{node_id}/drain", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def drain(node_id: str = NodeId,
                    deadline: float = Query(0, ge=0, le=30 * 86400, allow_inf_nan=False)) -> dict[str, Any]:
        """Cordon the node and move every instance elsewhere; returns the drain's progress."""
        return await client.drain(node_id, deadline)

    @router.get("/v1/nodes/{node_id}/drain", tags=["nodes"], response_model=None,
                responses={**answers(DrainStatus), **SCHEDULER_ERRORS})
    async def drain_status(node_id: str = NodeId) -> dict[str, Any]:
        """What still runs on a draining node, what is moving, and what cannot move."""
        return await client.drain_status(node_id)

    @router.post("/v1/nodes/{node_id}/labels", tags=["nodes"], responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def label(body: LabelChange, node_id: str = NodeId) -> dict[str, Any]:
        """Set and remove operator labels: {"set": {"k": "v"}, "remove": ["k2"]}."""
        return await client.label(node_id, dict(body.set), list(body.remove))

    @router.post("/v1/nodes/{node_id}/taints", tags=["nodes"], responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def taint(body: TaintChange, node_id: str = NodeId) -> dict[str, Any]:
        """Add and remove operator taints: {"add": [{"key", "value", "effect"}], "remove": ["key" or "key:Effect"]}."""
        return await client.taint(node_id, [t.model_dump() for t in body.add], list(body.remove))

    return router
