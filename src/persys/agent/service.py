"""The agent's own gRPC service (AgentService): data the control plane should not relay.

It sees the agent through `ServedNode` only (which runtimes may hold an instance, where the
agent keeps its files), so it imports nothing from the agent loop. The client side of these
calls is `persys.agent_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import grpc

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.agent.images_loader import LoadError, load_image
from persys.agent.runtimes.base import Runtime, RuntimeFailure
from persys.agent.runtimes.log_stream import LogQuery, UnsupportedQuery
from persys.model.limits import human_bytes
from persys.observability import tracing
from persys.observability.grpc_metrics import MetricsInterceptor
from persys.observability.grpc_tracing import TracingInterceptor
from persys.observability.metrics import Metrics
from persys.security.grpc_reload import reloading_file_credentials
from persys.security.grpc_tls import SERVER_KEEPALIVE_OPTIONS, peer_identity
from persys.tlsfiles import TLSFiles

ALLOWED = {"gateway", "scheduler", "admin"}


class ServedNode(Protocol):
    """What AgentService needs from the agent."""

    @property
    def node_id(self) -> str: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def image_max_bytes(self) -> int: ...

    def log_sources(self, workload_id: str) -> tuple[Sequence[Runtime], bool]:
        """Runtimes that may hold the instance, and whether it is desired here (if not, a
        runtime is asked only when it knows the instance)."""
        ...


class AgentServiceImpl(apb_grpc.AgentServiceServicer):
    def __init__(self, node: ServedNode) -> None:
        self.node = node

    async def _log_runtime(self, wid: str, context: grpc.aio.ServicerContext) -> Runtime:
        """The runtime holding instance `wid` here (aborts NOT_FOUND when none does)."""
        who = peer_identity(context)
        if who not in ALLOWED:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate {who or '(none)'} may not read logs")
        candidates, desired = self.node.log_sources(wid)
        for rt in candidates:
            try:
                if desired or await rt.inspect(wid) is not None:
                    return rt
            except RuntimeFailure as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        await context.abort(grpc.StatusCode.NOT_FOUND, f"{wid} is not on node {self.node.node_id}")
        raise AssertionError("unreachable")

    async def GetLogs(self, request: apb.LogsRequest, context: grpc.aio.ServicerContext) -> apb.LogsResponse:
        rt = await self._log_runtime(request.instance_id, context)
        query = _query(request, follow=False)
        try:
            if query == LogQuery(tail=query.tail):  # the plain tail every runtime has always served
                return apb.LogsResponse(text=await rt.logs(request.instance_id, query.tail), runtime=rt.name)
            pieces = [p async for p in rt.stream_logs(request.instance_id, query)]
        except UnsupportedQuery as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except RuntimeFailure as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return apb.LogsResponse(text="".join(pieces), runtime=rt.name)

    async def StreamLogs(self, request: apb.LogsRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[apb.LogsResponse]:
        """Each piece is written before the next is read: gRPC flow control paces the source to the
        caller. A caller that leaves cancels this handler, which closes the source."""
        rt = await self._log_runtime(request.instance_id, context)
        stream = rt.stream_logs(request.instance_id, _query(request, follow=True))
        try:
            await anext(stream, None)  # ACCEPTED, or the refusal as an error before any message
            yield apb.LogsResponse(runtime=rt.name)  # the caller knows now that output will follow
            async for piece in stream:
                yield apb.LogsResponse(text=piece)
        except UnsupportedQuery as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except RuntimeFailure as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def LoadImage(self, request_iterator: AsyncIterator[apb.ImageChunk], context: grpc.aio.ServicerContext
                        ) -> apb.ImageResult:
        who = peer_identity(context)
        if who not in ALLOWED:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate {who or '(none)'} may not load images")
        spool = self.node.state_dir / "incoming"
        spool.mkdir(parents=True, exist_ok=True)
        kind = name = ""
        received, cap = 0, self.node.image_max_bytes
        fd, tmp = tempfile.mkstemp(dir=spool)
        try:
            # Streamed to disk chunk by chunk, never whole in memory; the spool file goes in
            # `finally` whatever happens (over the cap, a cancelled upload, a failed load).
            with os.fdopen(fd, "wb") as f:
                async for chunk in request_iterator:
                    kind, name = kind or chunk.kind, name or chunk.name
                    received += len(chunk.data)
                    if received > cap:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            f"image exceeds the upload limit of {human_bytes(cap)}")
                    await asyncio.to_thread(f.write, chunk.data)
            try:
                detail = await load_image(kind, name, Path(tmp), self.node.state_dir / "runtimes")
            except LoadError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            return apb.ImageResult(name=name, detail=detail)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _query(request: apb.LogsRequest, *, follow: bool) -> LogQuery:
    # tail 0: none when following or with since (only new, or all since), else 100 as it always was
    tail = request.tail or (0 if follow or request.since else 100)
    return LogQuery(tail=tail, since=request.since, follow=follow, service=request.service,
                    timestamps=request.timestamps)


async def serve(node: ServedNode, listen: str, tls: TLSFiles, metrics: Metrics | None = None
                ) -> tuple[grpc.aio.Server, int]:
    # Traced (a span per unary call, e.g. GetLogs, child of the gateway's request) when tracing is on.
    interceptors = ([TracingInterceptor()] if tracing.enabled() else []) + \
        ([MetricsInterceptor(metrics)] if metrics is not None else [])
    server = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS, interceptors=interceptors)
    apb_grpc.add_AgentServiceServicer_to_server(AgentServiceImpl(node), server)
    # A renewed node certificate serves the next handshake (persys.agent.cert_renewal).
    port = server.add_secure_port(listen, reloading_file_credentials(tls))
    if port == 0:
        raise OSError(f"agent cannot listen on {listen}")
    await server.start()
    return server, port
