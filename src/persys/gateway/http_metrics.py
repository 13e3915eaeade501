"""REST request metrics: an ASGI middleware (outermost, so refusals by authorization count
too) recording each request by route template, method and status, and its latency; and the
`GET /metrics` route, which serves the gateway's metrics on its HTTPS API under the same
rules as every route (`get metrics`: viewer and up)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from persys.gateway.authorization import RouteTable
from persys.observability.metrics import CONTENT_TYPE, Metrics

REQUESTS = "persys_http_requests_total"
DURATION = "persys_http_request_duration_seconds"
UNMATCHED = "unmatched"  # any path no route serves: one label value, whatever the path
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


class HttpMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics, paths: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.app = app
        self.paths = paths
        self.requests = metrics.counter(REQUESTS)
        self.duration = metrics.histogram(DURATION)
        self._table: RouteTable | None = None

    def template(self, method: str, path: str) -> str:
        if self._table is None:
            self._table = RouteTable(self.paths())
        template, _ = self._table.match(method, path)
        if template is None and path.startswith("/static-offline-docs/"):
            return "/static-offline-docs/{file}"
        return template or UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method = scope["method"] if scope["method"] in _METHODS else "OTHER"
        route = self.template(method, scope["path"])
        status = ["500"]  # what an exception that escapes every handler becomes

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
                self.duration.observe(time.perf_counter() - started, (route, method))
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            self.requests.inc((route, method, status[0]))


def metrics_router(metrics: Metrics) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics", tags=["health"], response_class=Response,
                responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}})
    async def prometheus_metrics() -> Response:
        """The gateway's metrics in the Prometheus text format (viewer and up)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    return router
