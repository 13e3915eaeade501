"""Liveness and readiness of the gateway, and the scheduler's health document."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.schemas import SCHEDULER_ERRORS, answers
from persys.observability.health_checks import readiness
from persys.scheduler.views.models import Health


def health_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @router.get("/readyz", tags=["health"], responses={
        503: {"description": "Cannot serve: `reason` is scheduler-unreachable, no-active-replica or "
                             "store-unreachable (docs/observability.md, Health); why, in /v1/health"}})
    async def readyz() -> JSONResponse:
        """Readiness, meaning "can serve": a scheduler replica answers, an active replica is known
        and the state store is reachable. A frozen or degraded mode is still ready (reads are
        served, changes refused with the reason). Needs no credentials (a load balancer's probe),
        so it says only the verdict and a reason code: the details (addresses, errors, the mode)
        are in /v1/health, for callers allowed `get health`."""
        try:
            h: dict[str, Any] | None = await client.health(as_self=True)
            error = ""
        except SchedulerError as err:
            h, error = None, err.message
        verdict = readiness(h, error)
        body: dict[str, Any] = {"ready": verdict.ready, **({"reason": verdict.reason} if not verdict.ready else {})}
        return JSONResponse(body, status_code=200 if verdict.ready else 503)

    @router.get("/v1/health", tags=["health"], response_model=None,
                responses={**answers(Health), **SCHEDULER_ERRORS})
    async def health() -> dict[str, Any]:
        return await client.health()

    return router
