"""What-if questions (docs/placement.md): an operation's plan and a Pending workload's
counterfactuals. Both read the current snapshot and write nothing (the viewer role may ask)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.routes.common import WorkloadId, bad_body
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, answers, json_body
from persys.model.documents import DocumentError, parse_document
from persys.model.limits import GatewayLimits
from persys.scheduler.views.models import WhatIfPlanView, WhatIfView

OPERATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind"],
    "additionalProperties": False,
    "properties": {
        "kind": {"enum": ["drain", "cordon", "lose-node", "lose-label", "add-node"]},
        "nodes": {"type": "array", "maxItems": 1000, "description": "drain, cordon, lose-node: node names; "
                  "add-node: node descriptions {name, labels, taints, cpuMillicores, memoryMb, diskMb, runtimes, "
                  "runtimeFeatures, storageDrivers} (left out: runtimes, features and drivers of the ready nodes)",
                  "items": {"oneOf": [{"type": "string"}, {"type": "object"}]}},
        "label": {"type": "string", "description": "lose-label: key=value", "examples": ["zone=a"]},
    },
}


def operation(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    """The operation object (JSON, or YAML); its fields are checked by the scheduler."""
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
    except DocumentError as err:
        raise bodies.BodyError([str(err)]) from None
    if not isinstance(doc, dict):
        raise bodies.BodyError(["(document): expected an operation object with `kind`"])
    return doc


def whatif_routes(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/plan/operation", tags=["placement"], response_model=None,
                 openapi_extra=json_body(OPERATION_SCHEMA, "The operation to plan"),
                 responses={**answers(WhatIfPlanView), **SCHEDULER_ERRORS, **TOO_LARGE})
    async def plan_operation(request: Request) -> JSONResponse:
        """What-if: where every instance an operation affects would go, what would stay Pending
        and why, which Pending instances it would place; decided by the real engine on the
        current snapshot. Writes and reserves nothing."""
        try:
            doc = await parser.parse(operation, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        return JSONResponse(await client.plan_operation(doc))

    @router.get("/v1/workloads/{workload_id}/whatif", tags=["placement"], response_model=None,
                responses={**answers(WhatIfView), **SCHEDULER_ERRORS})
    async def what_if(workload_id: str = WorkloadId) -> dict[str, Any]:
        """Counterfactuals: for each Pending replica, the smallest changes that would make it fit,
        each checked by the engine on the changed snapshot, cheapest first. Writes nothing."""
        return await client.what_if(workload_id)

    return router
