"""REST API (FastAPI). Serves its OpenAPI document and docs pages with no CDN.

Every route maps one-to-one onto an AgentControl call; scheduler errors become HTTP errors
with a JSON body `{"error": "...", "problems": [...]}`. Input is hostile by default: bodies are
size-limited before they are read (`body_limit`), parsed and validated off the event loop
(`bodies`), parameters are typed and bounded (`schemas`), so a bad request is a 4xx naming the
problem, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import FastAPI, Path, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline

from persys import __version__
from persys.agent.service import fetch_logs, send_image
from persys.client import SchedulerClient, SchedulerError
from persys.gateway import bodies
from persys.gateway.body_limit import BodyLimit, BodyTooLarge
from persys.gateway.listing import list_response
from persys.gateway.schemas import (
    AGENT_ERRORS,
    BACKUP_BODY,
    BATCH_BODY,
    IMAGE_BODY,
    INSTANCE_ID,
    MANIFEST_BODY,
    SCHEDULER_ERRORS,
    TOO_LARGE,
    WORKLOAD_ID,
    ImageKind,
    LabelChange,
    TaintChange,
    add_components,
    answers,
)
from persys.model.limits import GatewayLimits
from persys.scheduler.pages import MAX_PAGE, TOKEN_MAX_CHARS
from persys.scheduler.view_models import DrainStatus, Explanation, Health, NodeView, WorkloadView
from persys.security.pki import TLSFiles

log = logging.getLogger(__name__)

HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "FAILED_PRECONDITION": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "RESOURCE_EXHAUSTED": 413,
}
NodeId = Path(min_length=1, max_length=253)
WorkloadId = Path(pattern=WORKLOAD_ID)


def body_limit_for(limits: GatewayLimits) -> Any:
    """Which byte limit a request's body has, by route."""

    def limit(method: str, path: str) -> int:
        if method != "POST":
            return limits.small_body_bytes
        if path in ("/v1/workloads", "/v1/plan"):
            return limits.manifest_bytes
        if path == "/v1/workloads:batch":
            return limits.batch_bytes
        if path == "/v1/admin/restore":
            return limits.restore_bytes
        if path.startswith("/v1/nodes/") and path.endswith("/images"):
            return limits.image_bytes
        return limits.small_body_bytes

    return limit


def _bad(err: bodies.BodyError) -> JSONResponse:
    return JSONResponse({"error": str(err), "problems": err.problems}, status_code=400)


def create_app(client: SchedulerClient, agent_tls: TLSFiles | None = None,
               limits: GatewayLimits | None = None) -> FastAPI:
    limits = limits or GatewayLimits()
    parser = bodies.BodyParser(limits)
    app = FastAPIOffline(
        title="Persys API",
        version=__version__,
        description="Workloads, nodes and events of a Persys cluster.",
    )
    app.add_middleware(BodyLimit, limit_for=body_limit_for(limits))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_components(get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(SchedulerError)
    async def _scheduler_error(_req: Request, err: SchedulerError) -> JSONResponse:
        problems = err.message.split("; ") if err.code == "INVALID_ARGUMENT" else []
        return JSONResponse({"error": err.message, "code": err.code, "problems": problems},
                            status_code=HTTP_STATUS.get(err.code, 502))

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_req: Request, err: BodyTooLarge) -> JSONResponse:
        return JSONResponse(err.body(), status_code=413, headers={"connection": "close"})

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, err: Exception) -> JSONResponse:
        # The last resort: a bug. Logged with its traceback here, never sent to the client.
        log.error("%s %s failed", req.method, req.url.path, exc_info=err)
        return JSONResponse({"error": "internal error (logged by the gateway)", "problems": []}, status_code=500)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "Not ready"}})
    async def readyz() -> JSONResponse:
        """Readiness: the scheduler answers and is in normal mode."""
        try:
            h = await client.health()
        except SchedulerError as err:
            return JSONResponse({"ready": False, "error": err.message}, status_code=503)
        ready = h["mode"] == "normal" and h["storeOk"]
        return JSONResponse({"ready": ready, **h}, status_code=200 if ready else 503)

    @app.get("/v1/health", tags=["health"], response_model=None, responses={**answers(Health), **SCHEDULER_ERRORS})
    async def health() -> dict[str, Any]:
        return await client.health()

    @app.post("/v1/workloads", tags=["workloads"], openapi_extra=MANIFEST_BODY,
              responses={201: {"description": "Created"}, **SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_workload(request: Request, dryRun: bool = False) -> JSONResponse:
        """Create or update a workload from a manifest (JSON, or YAML)."""
        try:
            doc = await parser.parse(bodies.manifest, await request.body())
        except bodies.BodyError as err:
            return _bad(err)
        result = await client.apply(doc, dry_run=dryRun)
        return JSONResponse(result, status_code=201 if result["created"] and not dryRun else 200)

    @app.post("/v1/workloads:batch", tags=["workloads"], openapi_extra=BATCH_BODY,
              responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def apply_workloads(request: Request) -> JSONResponse:
        """Create or update many workloads: a JSON (or YAML) list of manifests. New workloads are
        written many per store transaction; results come back in order. An invalid manifest
        refuses the whole batch before anything is written."""
        try:
            docs = await parser.parse(bodies.manifests, await request.body())
        except bodies.BodyError as err:
            return _bad(err)
        return JSONResponse({"items": await client.apply_many(docs)})

    @app.post("/v1/plan", tags=["placement"], openapi_extra=MANIFEST_BODY,
              responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def plan(request: Request) -> JSONResponse:
        """Dry run: where a manifest's replicas would be placed now, and why. Writes nothing."""
        try:
            doc = await parser.parse(bodies.manifest, await request.body())
        except bodies.BodyError as err:
            return _bad(err)
        return JSONResponse(await client.plan(doc))

    @app.get("/v1/workloads/{workload_id}/explain", tags=["placement"], response_model=None,
             responses={**answers(Explanation), **SCHEDULER_ERRORS})
    async def explain(workload_id: str = WorkloadId, node: str = Query("", max_length=253)) -> dict[str, Any]:
        """Why the workload is where it is (or Pending); with `node`, every filter's verdict there."""
        return await client.explain(workload_id, node)

    @app.get("/v1/workloads", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def list_workloads(node: str = Query("", max_length=253), limit: int | None = Query(None, ge=0, le=MAX_PAGE),
                             token: str | None = Query(None, alias="continue", max_length=TOKEN_MAX_CHARS)
                             ) -> Response:
        """Workload summaries (no spec: GET one workload for it). With `limit` or `continue`: one
        page, `{"items": [...], "continue": "<token of the next page, empty after the last>"}`;
        with neither, every workload as one JSON list, streamed a page at a time."""
        return await list_response(client, "workloads", node, limit, token)

    @app.get("/v1/workloads/{workload_id}", tags=["workloads"], response_model=None,
             responses={**answers(WorkloadView), **SCHEDULER_ERRORS})
    async def get_workload(workload_id: str = WorkloadId) -> dict[str, Any]:
        return await client.get_workload(workload_id)

    @app.delete("/v1/workloads/{workload_id}", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def delete_workload(workload_id: str = WorkloadId) -> dict[str, Any]:
        return await client.delete(workload_id)

    @app.post("/v1/workloads/{workload_id}/{action}", tags=["workloads"], responses=SCHEDULER_ERRORS)
    async def control(workload_id: str = WorkloadId,
                      action: str = Path(pattern="^(start|stop|restart)$")) -> JSONResponse:
        """`start`, `stop` or `restart` a workload without editing its manifest."""
        return JSONResponse(await client.control(workload_id, action))

    @app.get("/v1/workloads/{workload_id}/logs", tags=["workloads"], responses={**SCHEDULER_ERRORS, **AGENT_ERRORS})
    async def logs(workload_id: str = WorkloadId,
                   instance: str = Query("", pattern=f"^$|{INSTANCE_ID}", description="empty: the first instance"),
                   tail: int = Query(100, ge=1, le=10_000)) -> JSONResponse:
        """The tail of an instance's output, fetched from its node's agent over mutual TLS."""
        view = await client.get_workload(workload_id)
        if not instance and not view["instances"]:
            return JSONResponse({"error": f"{workload_id} has no instances", "problems": []}, status_code=404)
        inst = instance or view["instances"][0]["instance"]
        match = [i for i in view["instances"] if i["instance"] == inst]
        if not match:
            return JSONResponse({"error": f"{workload_id} has no instance {inst}", "problems": []}, status_code=404)
        node_id = match[0]["node"]
        if not node_id:
            return JSONResponse({"error": f"{inst} is not placed on any node ({match[0]['reason']})",
                                 "problems": []}, status_code=409)
        node = await client.get_node(node_id)
        if not node.get("address") or agent_tls is None:
            return JSONResponse({"error": f"the agent on {node_id} serves no logs endpoint", "problems": []},
                                status_code=501)
        try:
            text = await fetch_logs(node["address"], agent_tls, inst, tail)
        except grpc.aio.AioRpcError as err:
            code = 404 if err.code() == grpc.StatusCode.NOT_FOUND else 502
            return JSONResponse({"error": f"agent on {node_id}: {err.details()}", "problems": []}, status_code=code)
        return JSONResponse({"instance": inst, "node": node_id, "text": text})

    @app.post("/v1/nodes/{node_id}/images", tags=["nodes"], openapi_extra=IMAGE_BODY,
              responses={**SCHEDULER_ERRORS, **TOO_LARGE, **AGENT_ERRORS})
    async def load_image(request: Request, node_id: str = NodeId, kind: ImageKind = "docker",
                         name: str = Query("", max_length=255)) -> JSONResponse:
        """Put an image on a node (the body is the file, streamed through to the node's disk): kind docker
        (a `docker save` tarball), rootfs (a filesystem tarball imported as `name`), or disk / kernel / initrd
        for VMs (registered as `name`)."""
        node = await client.get_node(node_id)
        if not node.get("address") or agent_tls is None:
            return JSONResponse({"error": f"the agent on {node_id} serves no image endpoint", "problems": []},
                                status_code=501)

        too_large: list[BodyTooLarge] = []

        async def body() -> AsyncIterator[bytes]:
            try:
                async for piece in request.stream():  # counted against the image limit by BodyLimit
                    if piece:
                        yield piece
            except BodyTooLarge as err:
                too_large.append(err)
                raise  # gRPC cancels the upload; the agent deletes what it spooled

        try:
            detail = await send_image(node["address"], agent_tls, kind, name, body())
        except asyncio.CancelledError:
            if too_large:  # the cancellation is the upload's, not this request's
                raise too_large[0] from None
            raise
        except grpc.aio.AioRpcError as err:
            codes = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.RESOURCE_EXHAUSTED: 413}
            return JSONResponse({"error": f"agent on {node_id}: {err.details()}", "problems": []},
                                status_code=codes.get(err.code(), 502))
        return JSONResponse({"node": node_id, "detail": detail})

    @app.get("/v1/nodes", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def list_nodes(limit: int | None = Query(None, ge=0, le=MAX_PAGE),
                         token: str | None = Query(None, alias="continue", max_length=TOKEN_MAX_CHARS)) -> Response:
        """Nodes; paged like GET /v1/workloads."""
        return await list_response(client, "nodes", "", limit, token)

    @app.get("/v1/nodes/{node_id}", tags=["nodes"], response_model=None,
             responses={**answers(NodeView), **SCHEDULER_ERRORS})
    async def get_node(node_id: str = NodeId) -> dict[str, Any]:
        return await client.get_node(node_id)

    @app.delete("/v1/nodes/{node_id}", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def delete_node(node_id: str = NodeId, force: bool = False) -> dict[str, Any]:
        """Remove a node. 409 while instances are assigned to it (drain it first), unless `force`:
        then they are withdrawn and placed elsewhere. 404 if there is no such node."""
        return await client.delete_node(node_id, force)

    @app.post("/v1/nodes/{node_id}/cordon", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def cordon(node_id: str = NodeId) -> dict[str, Any]:
        """Stop placing new workloads on the node; what runs there stays."""
        return await client.cordon(node_id, True)

    @app.post("/v1/nodes/{node_id}/uncordon", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def uncordon(node_id: str = NodeId) -> dict[str, Any]:
        """Allow placements again (also ends a drain)."""
        return await client.cordon(node_id, False)

    @app.post("/v1/nodes/{node_id}/drain", tags=["nodes"], responses=SCHEDULER_ERRORS)
    async def drain(node_id: str = NodeId,
                    deadline: float = Query(0, ge=0, le=30 * 86400, allow_inf_nan=False)) -> dict[str, Any]:
        """Cordon the node and move every instance elsewhere; returns the drain's progress."""
        return await client.drain(node_id, deadline)

    @app.get("/v1/nodes/{node_id}/drain", tags=["nodes"], response_model=None,
             responses={**answers(DrainStatus), **SCHEDULER_ERRORS})
    async def drain_status(node_id: str = NodeId) -> dict[str, Any]:
        """What still runs on a draining node, what is moving, and what cannot move."""
        return await client.drain_status(node_id)

    @app.post("/v1/nodes/{node_id}/labels", tags=["nodes"], responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def label(body: LabelChange, node_id: str = NodeId) -> dict[str, Any]:
        """Set and remove operator labels: {"set": {"k": "v"}, "remove": ["k2"]}."""
        return await client.label(node_id, dict(body.set), list(body.remove))

    @app.post("/v1/nodes/{node_id}/taints", tags=["nodes"], responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def taint(body: TaintChange, node_id: str = NodeId) -> dict[str, Any]:
        """Add and remove operator taints: {"add": [{"key", "value", "effect"}], "remove": ["key" or "key:Effect"]}."""
        return await client.taint(node_id, [t.model_dump() for t in body.add], list(body.remove))

    @app.get("/v1/events", tags=["events"], responses=SCHEDULER_ERRORS)
    async def events(limit: int = Query(100, ge=1, le=10_000),
                     subject: str = Query("", max_length=512)) -> list[dict[str, Any]]:
        return await client.events(limit, subject)

    @app.get("/v1/admin/backup", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def backup() -> dict[str, Any]:
        """Every durable key at one revision (format persys-backup/v1)."""
        return await client.backup()

    @app.post("/v1/admin/restore", tags=["admin"], openapi_extra=BACKUP_BODY,
              responses={**SCHEDULER_ERRORS, **TOO_LARGE})
    async def restore(request: Request, force: bool = False, latest: bool = False) -> JSONResponse:
        """Write a backup (the body) back; or, with `latest`, the scheduler's own rolling backup."""
        doc: dict[str, Any] | None = None
        if not latest:
            try:
                doc = await parser.parse(bodies.backup, await request.body())
            except bodies.BodyError as err:
                return _bad(err)
        return JSONResponse(await client.restore(doc, force=force))

    @app.post("/v1/admin/liveness/resume", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def resume_liveness() -> dict[str, Any]:
        """End the mass-loss guard's suspension of liveness on every scheduler replica: silent
        nodes are judged one by one again (marked NotReady, their work relocated)."""
        return {"replicas": await client.resume_liveness()}

    @app.post("/v1/admin/recover", tags=["admin"], responses=SCHEDULER_ERRORS)
    async def recover() -> dict[str, Any]:
        """Leave recovery mode accepting the state store's current contents."""
        return await client.recover()

    return app
