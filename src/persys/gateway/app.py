"""REST API (FastAPI). Serves its OpenAPI document and docs pages with no CDN.

Every route maps one-to-one onto an AgentControl call; scheduler errors become HTTP errors
with a JSON body `{"error": "...", "problems": [...]}`. Input is hostile by default: bodies are
size-limited before they are read (`body_limit`), parsed and validated off the event loop
(`bodies`), parameters are typed and bounded (`schemas`), so a bad request is a 4xx naming the
problem, never a 500. The routes live in `persys.gateway.routes`, one module per resource;
this module assembles the application: body limits, the OpenAPI document, error handlers.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from persys import __version__
from persys.client import SchedulerClient, SchedulerError
from persys.gateway import authorization, bodies, request_tracing
from persys.gateway.auth_routes import auth_router
from persys.gateway.automation_routes import automation_router
from persys.gateway.body_limit import BodyLimit, BodyTooLarge
from persys.gateway.bucket_routes import bucket_router
from persys.gateway.dashboard.routes import dashboard_router
from persys.gateway.dashboard.web import Dashboard
from persys.gateway.http_metrics import HttpMetrics, metrics_router
from persys.gateway.intelligence_routes import intelligence_api, intelligence_routes
from persys.gateway.join_routes import join_router
from persys.gateway.policy_routes import policy_router
from persys.gateway.read_budget import ReadBudget
from persys.gateway.routes.admin import admin_routes, event_routes
from persys.gateway.routes.agent_proxy import agent_routes
from persys.gateway.routes.common import HTTP_STATUS
from persys.gateway.routes.exec_routes import exec_routes
from persys.gateway.routes.health import health_routes
from persys.gateway.routes.logs import log_routes
from persys.gateway.routes.meter import meter_routes
from persys.gateway.routes.move_routes import move_routes
from persys.gateway.routes.nodes import node_routes
from persys.gateway.routes.rollout import rollout_routes
from persys.gateway.routes.streams import stream_routes
from persys.gateway.routes.terminal_routes import terminal_routes
from persys.gateway.routes.whatif_routes import whatif_routes
from persys.gateway.routes.workloads import workload_routes
from persys.gateway.scheduler_gate import SchedulerGate
from persys.gateway.schemas import add_components
from persys.gateway.secret_routes import SECRET_BODY_MAX_BYTES, secret_router
from persys.gateway.shedding import Shedding
from persys.gateway.volume_routes import volume_router
from persys.model.limits import EXEC_BODY_MAX_BYTES, GatewayLimits
from persys.observability import tracing
from persys.observability.metrics import Metrics
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)



def body_limit_for(limits: GatewayLimits) -> Any:
    """Which byte limit a request's body has, by route."""

    def limit(method: str, path: str) -> int:
        if method == "PUT" and path.startswith("/v1/secrets/"):
            return SECRET_BODY_MAX_BYTES
        if method == "PUT" and path.startswith("/v1/workloads/") and path.endswith("/files"):
            return limits.copy_bytes  # persysctl cp's tar archive, streamed through to the node
        if method != "POST":
            return limits.small_body_bytes
        return _post_body_limit(limits, path)

    return limit


def _post_body_limit(limits: GatewayLimits, path: str) -> int:
    """A POST body's byte limit: manifests, batches, backups and images have their own."""
    if path in ("/v1/workloads", "/v1/plan"):
        return limits.manifest_bytes
    if path == "/ui/apply":  # the dashboard's manifest form: URL-encoding can triple it
        return 3 * limits.manifest_bytes
    if path == "/v1/workloads:batch":
        return limits.batch_bytes
    if path == "/v1/admin/restore":
        return limits.restore_bytes
    if path.startswith("/v1/nodes/") and path.endswith("/images"):
        return limits.image_bytes
    if path.startswith("/v1/workloads/") and path.endswith("/exec"):
        return EXEC_BODY_MAX_BYTES  # persysctl exec -i: its input in base64
    return limits.small_body_bytes


async def _scheduler_error(_req: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, SchedulerError)
    problems = err.message.split("; ") if err.code == "INVALID_ARGUMENT" else []
    headers = {"retry-after": str(err.retry_after)} if err.retry_after else None  # shed: overloaded
    return JSONResponse({"error": err.message, "code": err.code, "problems": problems},
                        status_code=HTTP_STATUS.get(err.code, 502), headers=headers)


async def _too_large(_req: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, BodyTooLarge)
    return JSONResponse(err.body(), status_code=413, headers={"connection": "close"})


async def _unexpected(req: Request, err: Exception) -> JSONResponse:
    # The last resort: a bug. Logged with its traceback here, never sent to the client.
    log.error("%s %s failed", req.method, req.url.path, exc_info=err)
    return JSONResponse({"error": "internal error (logged by the gateway)", "problems": []}, status_code=500)


def create_app(client: SchedulerClient, agent_tls: TLSFiles | None = None,
               limits: GatewayLimits | None = None, metrics: Metrics | None = None) -> FastAPI:
    limits = limits or GatewayLimits()
    metrics = metrics or Metrics()
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
    app.add_exception_handler(SchedulerError, _scheduler_error)
    app.add_exception_handler(BodyTooLarge, _too_large)
    app.add_exception_handler(Exception, _unexpected)
    # In the order the OpenAPI document lists them.
    app.include_router(health_routes(client))
    app.include_router(metrics_router(metrics))
    app.include_router(rollout_routes(client))  # before workload_routes: see rollout_routes
    # Before the workload routes: POST .../{action} would take .../exec.
    app.include_router(exec_routes(client, agent_tls))
    app.include_router(terminal_routes(client, agent_tls))
    app.include_router(workload_routes(client, parser))
    app.include_router(whatif_routes(client, parser))  # what-if plans and counterfactuals
    app.include_router(move_routes(client))  # one instance to another node
    app.include_router(agent_routes(client, agent_tls))
    app.include_router(log_routes(client, agent_tls))  # JSON, or SSE with follow=true
    app.include_router(node_routes(client))
    app.include_router(stream_routes(client))  # SSE: events, workload and node watches
    app.include_router(event_routes(client))
    app.include_router(meter_routes(client))
    app.include_router(admin_routes(client, parser))
    app.include_router(auth_router(client))
    app.include_router(policy_router(client))
    app.include_router(secret_router(client))
    app.include_router(volume_router(client, parser))
    app.include_router(bucket_router(client, parser))
    app.include_router(automation_router(client, parser))
    app.include_router(join_router(client))
    app.state.intelligence = intelligence_api(client, agent_tls)  # also served over gRPC (intelligence_grpc)
    app.include_router(intelligence_routes(app.state.intelligence))
    app.state.dashboard = Dashboard(client)  # the web console at / (docs/dashboard.md)
    app.include_router(dashboard_router(app.state.dashboard, parser, agent_tls))
    # Who calls is checked before anything is read; the dashboard's terminal WebSockets by session.
    authorization.install(app, client, app.state.dashboard.websocket_caller)
    # Outside authorization (a token check asks the scheduler too), inside the metrics: a storm is
    # refused at once with 503 + Retry-After beyond the bound, and the refusals are counted.
    # Inside the shedding: an admitted read is answered within its budget (gateway.read_budget).
    gate = client.gate if isinstance(client.gate, SchedulerGate) else None
    app.add_middleware(ReadBudget, seconds=limits.read_budget_s, gate=gate)
    app.add_middleware(Shedding, max_in_flight=limits.max_in_flight)
    # Outside authorization: its refusals are counted and timed too.
    app.add_middleware(HttpMetrics, metrics=metrics, paths=lambda: app.openapi()["paths"])
    app.state.metrics = metrics
    if tracing.enabled():
        request_tracing.install(app)  # outermost: a refused request is traced and gets its trace id
    return app
