"""Moving one instance to another node (docs/automation.md, "Moves"): operators and admins,
audited by the scheduler; the placement engine verifies the destination before anything moves."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient
from persys.gateway.routes.common import WorkloadId
from persys.gateway.schemas import SCHEDULER_ERRORS


def move_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/workloads/{workload_id}/instances/{instance}/move", tags=["workloads"],
                 responses=SCHEDULER_ERRORS)
    async def move_instance(workload_id: str = WorkloadId,
                            instance: str = Path(min_length=1, max_length=253,
                                                 description="the instance id (web.2) or its index (2)"),
                            to: str = Query("", max_length=253, description="the node; empty: where the "
                                            "placement engine places it, never its current node"),
                            dry_run: bool = Query(False, alias="dryRun", description="verify, move nothing"),
                            ) -> JSONResponse:
        """Move one instance: `{"workload", "instance", "from", "to", "verified", "dryRun",
        "movedAt"}`. Refused (409, nothing written) when no other node takes it, when its data
        is node-local or while it is being moved already. It stops on its node before it starts
        on the other (a single-writer volume is never attached twice)."""
        return JSONResponse(await client.move_instance(workload_id, instance, to, dry_run))

    return router
