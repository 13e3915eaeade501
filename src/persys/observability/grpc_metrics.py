"""A gRPC server interceptor counting calls by service, method and status code, and timing
unary calls. Put it first in the server's interceptor list: it then sees what the ones after it
(the scheduler's `AuthorizationInterceptor`) refuse, with their codes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from persys.observability.metrics import Labels, LoopCounter, LoopHistogram, Metrics

REQUESTS = "persys_grpc_server_requests_total"
DURATION = "persys_grpc_server_request_duration_seconds"


def split_method(full: str) -> Labels:
    """`/persys.v1.AgentControl/ApplyWorkload` -> (`persys.v1.AgentControl`, `ApplyWorkload`);
    anything else is one bounded bucket (a caller must not mint label values)."""
    parts = full.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2] or len(full) > 200:
        return ("unknown", "unknown")
    return (parts[1], parts[2])


def _code(context: grpc.aio.ServicerContext, failed: BaseException | None) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if failed is None:
        return "OK"
    # The client went away (a stream's end, a deadline): the task is cancelled, no code set.
    return "CANCELLED" if isinstance(failed, (asyncio.CancelledError, GeneratorExit)) else "UNKNOWN"


class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc,unused-ignore]
    def __init__(self, metrics: Metrics) -> None:
        self.requests: LoopCounter = metrics.counter(REQUESTS)
        self.duration: LoopHistogram = metrics.histogram(DURATION)
        self._known: dict[str, Labels] = {}  # method path -> labels, for methods the server serves

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # UNIMPLEMENTED, answered by gRPC itself
        method = str(details.method)
        labels = self._known.get(method)
        if labels is None:
            labels = self._known[method] = split_method(method)
        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(labels, handler.unary_unary), **kwargs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(self._streaming(labels, handler.unary_stream), **kwargs)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._unary(labels, handler.stream_unary), **kwargs)
        return grpc.stream_stream_rpc_method_handler(self._streaming(labels, handler.stream_stream), **kwargs)

    def _unary(self, labels: Labels, behavior: Callable[[Any, Any], Awaitable[Any]]
               ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            failed: BaseException | None = None
            try:
                return await behavior(request, context)
            except BaseException as err:
                failed = err
                raise
            finally:
                self.duration.observe(time.perf_counter() - started, labels)
                self.requests.inc((*labels, _code(context, failed)))

        return call

    def _streaming(self, labels: Labels, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            failed: BaseException | None = None
            try:
                result = behavior(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:  # a servicer that writes with context.write() and returns
                    await result
            except BaseException as err:
                failed = err
                raise
            finally:
                self.requests.inc((*labels, _code(context, failed)))

        return call
