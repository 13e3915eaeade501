"""The gateway's request spans: persys.observability's ASGI middleware, named after the route
templates of this app (the same table the authorization middleware matches on)."""

from __future__ import annotations

from typing import Any

from persys.gateway.authorization import RouteTable
from persys.observability.asgi_tracing import RouteOf, TracingMiddleware


def route_matcher(app: Any) -> RouteOf:
    """(method, path) -> the app's route template; the table is built on first use (the OpenAPI
    document lists every route only once all routers are included)."""
    table: list[RouteTable] = []

    def route_of(method: str, path: str) -> str | None:
        if not table:
            table.append(RouteTable(app.openapi()["paths"]))
        return table[0].match(method, path)[0]

    return route_of


def install(app: Any) -> None:
    """Outermost, so refused requests (401, 403, 413) are traced too, and every response of a
    traced request carries its trace id. Call only when tracing is enabled."""
    app.add_middleware(TracingMiddleware, route_of=route_matcher(app))
