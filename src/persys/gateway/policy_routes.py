"""REST routes of the cluster's workload policy: `GET /v1/policy`, `PUT /v1/policy`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from persys.client import SchedulerClient
from persys.gateway.schemas import SCHEDULER_ERRORS, TOO_LARGE
from persys.policy import WorkloadPolicy


def policy_router(client: SchedulerClient) -> APIRouter:
    router = APIRouter(tags=["policy"])

    @router.get("/v1/policy", responses=SCHEDULER_ERRORS)
    async def get_policy() -> dict[str, Any]:
        """The workload policy in force (`stored: false`: no policy is stored, the defaults hold)."""
        return await client.get_policy()

    @router.put("/v1/policy", responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def set_policy(body: WorkloadPolicy) -> dict[str, Any]:
        """Replace the workload policy (admins only). Omitted fields take their safe defaults."""
        return await client.set_policy(body.model_dump(mode="json", by_alias=True))

    return router
