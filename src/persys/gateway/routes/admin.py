"""Events, and the admin operations: backup, restore, liveness resume, recovery."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.routes.common import bad_body
from persys.gateway.schemas import BACKUP_BODY, SCHEDULER_ERRORS, TOO_LARGE


def event_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/events", tags=["events"], responses=SCHEDULER_ERRORS)
    async def events(limit: int = Query(100, ge=1, le=10_000),
                     subject: str = Query("", max_length=512)) -> list[dict[str, Any]]:
        return await client.events(limit, subject)

    return router


def admin_routes(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/admin/backup", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def backup() -> dict[str, Any]:
        """Every durable key at one revision (format persys-backup/v1)."""
        return await client.backup()

    @router.post("/v1/admin/restore", tags=["admin"], openapi_extra=BACKUP_BODY,
                 responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def restore(request: Request, force: bool = False, latest: bool = False) -> JSONResponse:
        """Write a backup (the body) back; or, with `latest`, the scheduler's own rolling backup."""
        doc: dict[str, Any] | None = None
        if not latest:
            try:
                doc = await parser.parse(bodies.backup, await request.body())
            except bodies.BodyError as err:
                return bad_body(err)
        return JSONResponse(await client.restore(doc, force=force))

    @router.post("/v1/admin/liveness/resume", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def resume_liveness() -> dict[str, Any]:
        """End the mass-loss guard's suspension of liveness on every scheduler replica: silent
        nodes are judged one by one again (marked NotReady, their work relocated)."""
        return {"replicas": await client.resume_liveness()}

    @router.post("/v1/admin/recover", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def recover() -> dict[str, Any]:
        """Leave recovery mode accepting the state store's current contents."""
        return await client.recover()

    return router
