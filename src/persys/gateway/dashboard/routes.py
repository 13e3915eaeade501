"""The dashboard's routes, assembled: pages (GET), forms (POST), the live stream, the sign-in
and the package's static assets. None is in the OpenAPI document: the REST API is the contract,
this is one of its clients (in-process, as the signed-in user)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.agent_client import fetch_logs
from persys.gateway import bodies
from persys.gateway.dashboard.actions import action_routes
from persys.gateway.dashboard.events_page import events_page
from persys.gateway.dashboard.html import tag
from persys.gateway.dashboard.layout import Page, Section
from persys.gateway.dashboard.live import live_routes
from persys.gateway.dashboard.log_follow import LogFollows
from persys.gateway.dashboard.nodes_page import node_page, nodes_page, topology_page
from persys.gateway.dashboard.overview_page import overview_page
from persys.gateway.dashboard.signin import signin_routes
from persys.gateway.dashboard.storage_page import audit_page, buckets_page, secrets_page, volumes_page
from persys.gateway.dashboard.web import Ctx, Dashboard, Refused
from persys.gateway.dashboard.workloads_page import apply_page, terminal_page, workload_page, workloads_page
from persys.gateway.routes.common import NodeId, WorkloadId
from persys.gateway.routes.logs import instance_target
from persys.tlsfiles import TLSFiles

CSS, JS = "text/css; charset=utf-8", "text/javascript; charset=utf-8"
STATIC_TYPES = {"app.css": CSS, "app.js": JS, "terminal.js": JS, "vendor/xterm.js": JS, "vendor/xterm.css": CSS}
LOG_LINES = 200


def _static(name: str) -> bytes:
    return resources.files("persys.gateway.dashboard").joinpath("static", name).read_bytes()


async def _logs_page(ctx: Ctx, agent_tls: TLSFiles | None, workload_id: str) -> Page:
    """The last lines of the first instance's output, from its node's agent (as GET .../logs)."""
    ctx.require("logs", "workloads")
    target = await instance_target(ctx.client, agent_tls, await ctx.client.get_workload(workload_id),
                                   workload_id, "", "logs")
    if isinstance(target, JSONResponse):
        raise Refused(target.status_code, str(json.loads(bytes(target.body)).get("error", "")))
    assert agent_tls is not None  # instance_target answered 501 otherwise
    try:
        text = await fetch_logs(target.address, agent_tls, apb.LogsRequest(
            instance_id=target.instance, tail=LOG_LINES), node_id=target.node)
    except grpc.aio.AioRpcError as err:
        raise Refused(502, f"agent on {target.node}: {err.details()}") from None
    return Page(f"Logs of {workload_id}", "workloads", [Section(
        "logs", tag("p", f"{target.instance} on {target.node}, last {LOG_LINES} lines", class_="muted") +
        tag("pre", text or "(no output)", class_="logs"))])


def dashboard_router(dash: Dashboard, parser: bodies.BodyParser, agent_tls: TLSFiles | None) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    router.include_router(signin_routes(dash))
    router.include_router(live_routes(dash, LogFollows(dash.client, agent_tls)))
    router.include_router(action_routes(dash, parser))
    assets = {name: _static(name) for name in STATIC_TYPES}  # read once: they ship with the package

    @router.get("/ui/static/{name:path}")
    async def static(name: str) -> Response:
        if name not in assets:
            return Response("not found", status_code=404)
        return Response(assets[name], media_type=STATIC_TYPES[name],
                        headers={"cache-control": "public, max-age=3600", "x-content-type-options": "nosniff"})

    @router.get("/")
    async def overview(request: Request) -> Response:
        return await dash.serve(request, overview_page)

    @router.get("/ui/workloads")
    async def workloads(request: Request) -> Response:
        return await dash.serve(request, workloads_page)

    @router.get("/ui/workloads/{workload_id}")
    async def workload(request: Request, workload_id: str = WorkloadId) -> Response:
        return await dash.serve(request, lambda ctx: workload_page(ctx, workload_id, agent_tls))

    _workload_subpages(router, dash, agent_tls)

    @router.get("/ui/apply")
    async def apply(request: Request) -> Response:
        return await dash.serve(request, apply_page)

    @router.get("/ui/nodes")
    async def nodes(request: Request) -> Response:
        return await dash.serve(request, nodes_page)

    @router.get("/ui/nodes/{node_id}")
    async def node(request: Request, node_id: str = NodeId) -> Response:
        return await dash.serve(request, lambda ctx: node_page(ctx, node_id))

    for path, build in (("/ui/topology", topology_page), ("/ui/volumes", volumes_page),
                        ("/ui/buckets", buckets_page), ("/ui/secrets", secrets_page), ("/ui/events", events_page),
                        ("/ui/audit", audit_page)):
        router.add_api_route(path, _page_route(dash, build), methods=["GET"])
    return router


def _workload_subpages(router: APIRouter, dash: Dashboard, agent_tls: TLSFiles | None) -> None:
    """A workload's logs, terminal (exec) and serial console (VMs) pages."""

    @router.get("/ui/workloads/{workload_id}/logs")
    async def logs(request: Request, workload_id: str = WorkloadId) -> Response:
        return await dash.serve(request, lambda ctx: _logs_page(ctx, agent_tls, workload_id))

    @router.get("/ui/workloads/{workload_id}/terminal")
    async def terminal(request: Request, workload_id: str = WorkloadId) -> Response:
        return await dash.serve(request, lambda ctx: terminal_page(ctx, workload_id))

    @router.get("/ui/workloads/{workload_id}/console")
    async def console(request: Request, workload_id: str = WorkloadId) -> Response:
        return await dash.serve(request, lambda ctx: terminal_page(ctx, workload_id, console=True))


def _page_route(dash: Dashboard, build: Callable[[Ctx], Awaitable[Page]]) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return await dash.serve(request, build)

    return route
