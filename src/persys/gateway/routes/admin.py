"""Events, and the admin operations: backup, restore, liveness resume, recovery."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from persys.client import SchedulerClient
from persys.events.filters import FilterError, keep_last, make_filter, parse_since
from persys.gateway import bodies
from persys.gateway.routes.common import bad_body
from persys.gateway.routes.streams import KINDS
from persys.gateway.schemas import BACKUP_BODY, SCHEDULER_ERRORS, TOO_LARGE

MAX_EVENTS = 10_000  # the scheduler's bound on one listing (scheduler.pages.MAX_EVENTS)


def event_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/events", tags=["events"], responses=SCHEDULER_ERRORS, response_model=None)
    async def events(limit: int = Query(100, ge=1, le=10_000),
                     subject: str = Query("", max_length=512),
                     kind: list[str] | None = KINDS,
                     node: str = Query("", max_length=253, description="Events about this node or naming it"),
                     since: str = Query("", max_length=64, description="10m, 2h, 1d or an RFC 3339 time")
                     ) -> list[dict[str, Any]] | JSONResponse:
        """Recent events, newest last; with kind/node/since, the newest `limit` of those the bus
        retains that match (the filters apply to at most the last 10,000 events)."""
        if not (kind or node or since):
            return await client.events(limit, subject)
        try:
            flt = make_filter(kind or [], subject, node)
            after = parse_since(since, time.time()) if since else 0.0
        except FilterError as err:
            return JSONResponse({"error": str(err), "problems": [str(err)]}, status_code=400)
        return [dict(d) for d in keep_last(await client.events(MAX_EVENTS, subject), flt, after, limit)]

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
