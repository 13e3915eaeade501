"""Workloads: apply (one or a batch), plan and explain placement, read, delete, start/stop."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from persys.client import SchedulerClient
from persys.gateway import bodies
from persys.gateway.listing import list_response
from persys.gateway.routes.common import WorkloadId, bad_body
from persys.gateway.schemas import BATCH_BODY, MANIFEST_BODY, SCHEDULER_ERRORS, TOO_LARGE, answers
from persys.scheduler.views.models import Explanation, WorkloadView
from persys.scheduler.views.pages import MAX_PAGE, TOKEN_MAX_CHARS


def workload_routes(client: SchedulerClient, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter()

    _manifest_routes(router, client, parser)

    @router.get("/v1/workloads/{workload_id}/explain", tags=["placement"], response_model=None,
                responses={**answers(Explanation), **SCHEDULER_ERRORS,
                           410: {"description": "`at`: the store's history no longer holds that revision"}})
    async def explain(workload_id: str = WorkloadId, node: str = Query("", max_length=253),
                      at: int = Query(0, ge=0, le=2**63 - 1)) -> dict[str, Any]:
        """Why the workload is where it is (or Pending); with `node`, every filter's verdict there;
        with `at`, the decisions taken on the store at that revision, replayed (`agrees`)."""
        return await client.explain(workload_id, node, at)

    @router.get("/v1/workloads", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def list_workloads(node: str = Query("", max_length=253),
                             limit: int | None = Query(None, ge=0, le=MAX_PAGE),
                             token: str | None = Query(None, alias="continue", max_length=TOKEN_MAX_CHARS)
                             ) -> Response:
        """Workload summaries (no spec: GET one workload for it). With `limit` or `continue`: one
        page, `{"items": [...], "continue": "<token of the next page, empty after the last>"}`;
        with neither, every workload as one JSON list, streamed a page at a time."""
        return await list_response(client, "workloads", node, limit, token)

    @router.get("/v1/workloads/{workload_id}", tags=["workloads"], response_model=None,
                responses={**answers(WorkloadView), **SCHEDULER_ERRORS})
    async def get_workload(workload_id: str = WorkloadId) -> dict[str, Any]:
        return await client.get_workload(workload_id)

    @router.delete("/v1/workloads/{workload_id}", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def delete_workload(workload_id: str = WorkloadId) -> dict[str, Any]:
        return await client.delete(workload_id)

    @router.post("/v1/workloads/{workload_id}/{action}", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def control(workload_id: str = WorkloadId,
                      action: str = Path(pattern="^(start|stop|restart)$")) -> JSONResponse:
        """`start`, `stop` or `restart` a workload without editing its manifest."""
        return JSONResponse(await client.control(workload_id, action))

    return router


def _manifest_routes(router: APIRouter, client: SchedulerClient, parser: bodies.BodyParser) -> None:
    """The routes that take manifests in their body: apply, a batch, a plan."""

    @router.post("/v1/workloads", tags=["workloads"], openapi_extra=MANIFEST_BODY,
                 responses={201: {"description": "Created"}, **SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_workload(request: Request, dry_run: bool = Query(False, alias="dryRun")) -> JSONResponse:
        """Create or update a workload from a manifest (JSON, or YAML)."""
        try:
            doc = await parser.parse(bodies.manifest, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        result = await client.apply(doc, dry_run=dry_run)
        return JSONResponse(result, status_code=201 if result["created"] and not dry_run else 200)

    @router.post("/v1/workloads:batch", tags=["workloads"], openapi_extra=BATCH_BODY,
                 responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_workloads(request: Request) -> JSONResponse:
        """Create or update many workloads: a JSON (or YAML) list of manifests. New workloads are
        written many per store transaction; results come back in order. An invalid manifest
        refuses the whole batch before anything is written."""
        try:
            docs = await parser.parse(bodies.manifests, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        return JSONResponse({"items": await client.apply_many(docs)})

    @router.post("/v1/plan", tags=["placement"], openapi_extra=MANIFEST_BODY,
                 responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def plan(request: Request) -> JSONResponse:
        """Dry run: where a manifest's replicas would be placed now, and why. Writes nothing."""
        try:
            doc = await parser.parse(bodies.manifest, await request.body())
        except bodies.BodyError as err:
            return bad_body(err)
        return JSONResponse(await client.plan(doc))
