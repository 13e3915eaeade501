"""REST API (FastAPI). Serves its OpenAPI document and docs pages with no CDN.

Every route maps one-to-one onto an AgentControl call; scheduler errors become HTTP errors
with a JSON body `{"error": "...", "problems": [...]}`.
"""

from __future__ import annotations

from typing import Any

import grpc
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from persys import __version__
from persys.agent.service import fetch_logs, send_image
from persys.client import SchedulerClient, SchedulerError
from persys.security.pki import TLSFiles

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
}


async def _manifest_body(request: Request) -> dict[str, Any] | JSONResponse:
    body = await request.body()
    try:
        doc = yaml.safe_load(body) if body else None
    except yaml.YAMLError:
        return JSONResponse({"error": "(document): body is not valid JSON or YAML", "problems": []}, status_code=400)
    if not isinstance(doc, dict):
        return JSONResponse({"error": "(document): expected one manifest object", "problems": []}, status_code=400)
    return doc


def create_app(client: SchedulerClient, agent_tls: TLSFiles | None = None) -> FastAPI:
    app = FastAPIOffline(
        title="Persys API",
        version=__version__,
        description="Workloads, nodes and events of a Persys cluster.",
    )

    @app.exception_handler(SchedulerError)
    async def _scheduler_error(_req: Request, err: SchedulerError) -> JSONResponse:
        problems = err.message.split("; ") if err.code == "INVALID_ARGUMENT" else []
        return JSONResponse({"error": err.message, "code": err.code, "problems": problems},
                            status_code=HTTP_STATUS.get(err.code, 502))

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: the scheduler answers and is in normal mode."""
        try:
            h = await client.health()
        except SchedulerError as err:
            return JSONResponse({"ready": False, "error": err.message}, status_code=503)
        ready = h["mode"] == "normal" and h["storeOk"]
        return JSONResponse({"ready": ready, **h}, status_code=200 if ready else 503)

    @app.get("/v1/health", tags=["health"])
    async def health() -> dict[str, Any]:
        return await client.health()

    @app.post("/v1/workloads", tags=["workloads"])
    async def apply_workload(request: Request, dryRun: bool = False) -> JSONResponse:
        """Create or update a workload from a manifest (JSON, or YAML with a YAML content type)."""
        doc = await _manifest_body(request)
        if isinstance(doc, JSONResponse):
            return doc
        result = await client.apply(doc, dry_run=dryRun)
        return JSONResponse(result, status_code=201 if result["created"] and not dryRun else 200)

    @app.post("/v1/workloads:batch", tags=["workloads"])
    async def apply_workloads(request: Request) -> JSONResponse:
        """Create or update many workloads: a JSON (or YAML) list of manifests. New workloads are
        written many per store transaction; results come back in order. An invalid manifest
        refuses the whole batch before anything is written."""
        try:
            docs = yaml.safe_load(await request.body())
        except yaml.YAMLError:
            docs = None
        if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
            return JSONResponse({"error": "(document): expected a list of manifest objects", "problems": []},
                                status_code=400)
        return JSONResponse({"items": await client.apply_many(docs)})

    @app.post("/v1/plan", tags=["placement"])
    async def plan(request: Request) -> JSONResponse:
        """Dry run: where a manifest's replicas would be placed now, and why. Writes nothing."""
        doc = await _manifest_body(request)
        if isinstance(doc, JSONResponse):
            return doc
        return JSONResponse(await client.plan(doc))

    @app.get("/v1/workloads/{workload_id}/explain", tags=["placement"])
    async def explain(workload_id: str, node: str = "") -> dict[str, Any]:
        """Why the workload is where it is (or Pending); with `node`, every filter's verdict there."""
        return await client.explain(workload_id, node)

    @app.get("/v1/workloads", tags=["workloads"])
    async def list_workloads(node: str = "") -> list[dict[str, Any]]:
        return await client.list_workloads(node)

    @app.get("/v1/workloads/{workload_id}", tags=["workloads"])
    async def get_workload(workload_id: str) -> dict[str, Any]:
        return await client.get_workload(workload_id)

    @app.delete("/v1/workloads/{workload_id}", tags=["workloads"])
    async def delete_workload(workload_id: str) -> dict[str, Any]:
        return await client.delete(workload_id)

    @app.post("/v1/workloads/{workload_id}/{action}", tags=["workloads"])
    async def control(workload_id: str, action: str) -> JSONResponse:
        """`start`, `stop` or `restart` a workload without editing its manifest."""
        if action not in ("start", "stop", "restart"):
            return JSONResponse({"error": f"unknown action {action!r} (start, stop, restart)", "problems": []},
                                status_code=404)
        return JSONResponse(await client.control(workload_id, action))

    @app.get("/v1/workloads/{workload_id}/logs", tags=["workloads"])
    async def logs(workload_id: str, instance: str = "", tail: int = 100) -> JSONResponse:
        """The tail of an instance's output, fetched from its node's agent over mutual TLS."""
        view = await client.get_workload(workload_id)
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
            text = await fetch_logs(node["address"], agent_tls, inst, max(1, min(tail, 10_000)))
        except grpc.aio.AioRpcError as err:
            code = 404 if err.code() == grpc.StatusCode.NOT_FOUND else 502
            return JSONResponse({"error": f"agent on {node_id}: {err.details()}", "problems": []}, status_code=code)
        return JSONResponse({"instance": inst, "node": node_id, "text": text})

    @app.post("/v1/nodes/{node_id}/images", tags=["nodes"])
    async def load_image(node_id: str, request: Request, kind: str = "docker", name: str = "") -> JSONResponse:
        """Put an image on a node (the body is the file): kind docker (a `docker save` tarball), rootfs
        (a filesystem tarball imported as `name`), or disk / kernel / initrd for VMs (registered as `name`)."""
        node = await client.get_node(node_id)
        if not node.get("address") or agent_tls is None:
            return JSONResponse({"error": f"the agent on {node_id} serves no image endpoint", "problems": []},
                                status_code=501)
        try:
            detail = await send_image(node["address"], agent_tls, kind, name, await request.body())
        except grpc.aio.AioRpcError as err:
            code = 400 if err.code() == grpc.StatusCode.INVALID_ARGUMENT else 502
            return JSONResponse({"error": f"agent on {node_id}: {err.details()}", "problems": []}, status_code=code)
        return JSONResponse({"node": node_id, "detail": detail})

    @app.get("/v1/nodes", tags=["nodes"])
    async def list_nodes() -> list[dict[str, Any]]:
        return await client.list_nodes()

    @app.get("/v1/nodes/{node_id}", tags=["nodes"])
    async def get_node(node_id: str) -> dict[str, Any]:
        return await client.get_node(node_id)

    @app.delete("/v1/nodes/{node_id}", tags=["nodes"])
    async def delete_node(node_id: str, force: bool = False) -> dict[str, Any]:
        """Remove a node. 409 while instances are assigned to it (drain it first), unless `force`:
        then they are withdrawn and placed elsewhere. 404 if there is no such node."""
        return await client.delete_node(node_id, force)

    @app.post("/v1/nodes/{node_id}/cordon", tags=["nodes"])
    async def cordon(node_id: str) -> dict[str, Any]:
        """Stop placing new workloads on the node; what runs there stays."""
        return await client.cordon(node_id, True)

    @app.post("/v1/nodes/{node_id}/uncordon", tags=["nodes"])
    async def uncordon(node_id: str) -> dict[str, Any]:
        """Allow placements again (also ends a drain)."""
        return await client.cordon(node_id, False)

    @app.post("/v1/nodes/{node_id}/drain", tags=["nodes"])
    async def drain(node_id: str, deadline: float = 0) -> dict[str, Any]:
        """Cordon the node and move every instance elsewhere; returns the drain's progress."""
        return await client.drain(node_id, deadline)

    @app.get("/v1/nodes/{node_id}/drain", tags=["nodes"])
    async def drain_status(node_id: str) -> dict[str, Any]:
        """What still runs on a draining node, what is moving, and what cannot move."""
        return await client.drain_status(node_id)

    @app.post("/v1/nodes/{node_id}/labels", tags=["nodes"])
    async def label(node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Body: {"set": {"k": "v"}, "remove": ["k2"]}."""
        return await client.label(node_id, {str(k): str(v) for k, v in (body.get("set") or {}).items()},
                                  [str(k) for k in body.get("remove") or []])

    @app.post("/v1/nodes/{node_id}/taints", tags=["nodes"])
    async def taint(node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Body: {"add": [{"key", "value", "effect"}], "remove": ["key" or "key:Effect"]}."""
        return await client.taint(node_id, list(body.get("add") or []), [str(k) for k in body.get("remove") or []])

    @app.get("/v1/events", tags=["events"])
    async def events(limit: int = 100, subject: str = "") -> list[dict[str, Any]]:
        return await client.events(limit, subject)

    @app.get("/v1/admin/backup", tags=["admin"])
    async def backup() -> dict[str, Any]:
        """Every durable key at one revision (format persys-backup/v1)."""
        return await client.backup()

    @app.post("/v1/admin/restore", tags=["admin"])
    async def restore(request: Request, force: bool = False, latest: bool = False) -> JSONResponse:
        """Write a backup (the body) back; or, with `latest`, the scheduler's own rolling backup."""
        doc: dict[str, Any] | None = None
        if not latest:
            body = await request.body()
            try:
                parsed = yaml.safe_load(body) if body else None
            except yaml.YAMLError:
                parsed = None
            if not isinstance(parsed, dict):
                return JSONResponse({"error": "the body must be a backup document", "problems": []}, status_code=400)
            doc = parsed
        return JSONResponse(await client.restore(doc, force=force))

    @app.post("/v1/admin/liveness/resume", tags=["admin"])
    async def resume_liveness() -> dict[str, Any]:
        """End the mass-loss guard's suspension of liveness on every scheduler replica: silent
        nodes are judged one by one again (marked NotReady, their work relocated)."""
        return {"replicas": await client.resume_liveness()}

    @app.post("/v1/admin/recover", tags=["admin"])
    async def recover() -> dict[str, Any]:
        """Leave recovery mode accepting the state store's current contents."""
        return await client.recover()

    return app
