"""A workload's revision history and rollback (`persysctl rollout history|undo`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from persys.client import SchedulerClient
from persys.gateway.routes.common import WorkloadId
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE, RollbackRequest, answers
from persys.scheduler.views.models import RevisionList, RollbackView


def rollout_routes(client: SchedulerClient) -> APIRouter:
    """Included before the workload routes: their POST /v1/workloads/{id}/{action} would
    otherwise take `rollback` for an action (and refuse it)."""
    router = APIRouter()

    @router.get("/v1/workloads/{workload_id}/revisions", tags=["workloads"], response_model=None,
                responses={**answers(RevisionList), **SCHEDULER_ERRORS})
    async def revisions(workload_id: str = WorkloadId) -> dict[str, Any]:
        """The kept revisions of the workload's spec (at most 10), oldest first; the last is the
        spec in force. Each says what it changed from the one before it."""
        return {"workload": workload_id, "items": await client.revisions(workload_id)}

    @router.post("/v1/workloads/{workload_id}/rollback", tags=["workloads"], response_model=None,
                 responses={**answers(RollbackView), **SCHEDULER_ERRORS, **TOO_LARGE})
    async def rollback(body: RollbackRequest | None = None, workload_id: str = WorkloadId) -> dict[str, Any]:
        """Apply a kept revision's spec again, as a new generation (and revision record):
        `{"generation": N}`, or no body for the one before the newest. 400 naming `generation`
        when no such revision is kept."""
        return await client.rollback(workload_id, body.generation if body is not None else 0)

    return router
