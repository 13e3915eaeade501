"""Trace context over HTTP: an ASGI middleware opening one SERVER span per request, child of the
caller's `traceparent` header, named after the route template (`POST /v1/workloads`, never the
raw path: bounded names, no ids), and returning the trace to the caller in the response headers
`traceparent` (the gateway's span) and `x-persys-trace-id`, also when the caller sent none.

Installed only where tracing is enabled: off, there is no middleware and no header. The span
records method, route and status; never headers (a bearer token), query strings or bodies.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from persys.observability import trace_context, tracing

RouteOf = Callable[[str, str], str | None]  # (method, path) -> route template, None when unknown


class TracingMiddleware:
    def __init__(self, app: ASGIApp, route_of: RouteOf) -> None:
        self.app = app
        self.route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        route = self.route_of(method, str(scope["path"])) or "unmatched"
        parent = ""
        for key, value in scope.get("headers") or ():
            if key == b"traceparent":
                parent = value.decode("latin-1")
                break
        attributes = {"http.request.method": method, "http.route": route, "url.scheme": scope.get("scheme", "")}
        with tracing.span(f"{method} {route}", attributes, parent=parent, kind=SpanKind.SERVER, record=False) as s:
            header = trace_context.format_context(s.get_span_context())
            extra = [(b"traceparent", header.encode()),
                     (trace_context.TRACE_ID_HEADER.encode(), header[3:35].encode())] if header else []
            status: list[int] = []

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status.append(int(message["status"]))
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            except BaseException as err:
                s.set_status(Status(StatusCode.ERROR, type(err).__name__))
                raise
            if status:
                s.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    s.set_status(Status(StatusCode.ERROR, f"HTTP {status[0]}"))
