"""Liveness and readiness of the gateway, and the scheduler's health document."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.schemas import SCHEDULER_ERRORS, answers
from persys.scheduler.view_models import Health


def health_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @router.get("/readyz", tags=["health"], responses={503: {"description": "Not ready"}})
    async def readyz() -> JSONResponse:
        """Readiness: the scheduler answers and is in normal mode."""
        try:
            h = await client.health()
        except SchedulerError as err:
            return JSONResponse({"ready": False, "error": err.message}, status_code=503)
        ready = h["mode"] == "normal" and h["storeOk"]
        return JSONResponse({"ready": ready, **h}, status_code=200 if ready else 503)

    @router.get("/v1/health", tags=["health"], response_model=None,
                responses={**answers(Health), **SCHEDULER_ERRORS})
    async def health() -> dict[str, Any]:
        return await client.health()

    return router
