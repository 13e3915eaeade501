"""Trace context over gRPC: a server interceptor opening one SERVER span per unary call (child of
the caller's `traceparent` metadata), and the metadata a client adds to a call.

Only unary calls get a span: the agents' long-lived streams (WatchAssignments, StreamUpdates)
would make spans hours long; what they deliver carries its own trace context instead (the
`traceparent` of an assignment). The interceptor goes first in the server's list, so the calls
the authorization interceptor refuses are traced as well, with their status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry.trace import SpanKind, Status, StatusCode

from persys.observability import trace_context, tracing

Metadata = tuple[tuple[str, str], ...]


def with_trace_context(metadata: Metadata) -> Metadata:
    """`metadata` plus the current span's traceparent (unchanged when tracing is off)."""
    if not tracing.enabled():
        return metadata
    parent = trace_context.current()
    return (*metadata, (trace_context.TRACEPARENT, parent)) if parent else metadata


def _code_of(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    try:
        code = context.code()
    except Exception:  # older grpcio without ServicerContext.code()
        return None
    return code if isinstance(code, grpc.StatusCode) else None


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc,unused-ignore]
    """Install only when `tracing.enabled()`: off, a server has no interceptor to pass."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _traced(str(details.method), handler.unary_unary),
            request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def _traced(method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
            ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    service, _, name = method.lstrip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        parent = trace_context.from_metadata(context.invocation_metadata())
        # record=False: an error's details may quote the caller's input; the status code says enough.
        with tracing.span(method.lstrip("/"), attributes, parent=parent, kind=SpanKind.SERVER, record=False) as s:
            try:
                response = await behavior(request, context)
            except BaseException as err:
                # context.abort() raises after setting the code: the span says which.
                code = _code_of(context)
                if code is not None and code is not grpc.StatusCode.OK:
                    s.set_attribute("rpc.grpc.status_code", code.value[0])
                    s.set_status(Status(StatusCode.ERROR, code.name))
                else:
                    s.set_status(Status(StatusCode.ERROR, type(err).__name__))
                raise
            s.set_attribute("rpc.grpc.status_code", 0)
            return response

    return run
