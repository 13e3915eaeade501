"""The agent's own gRPC service (AgentService): data the control plane should not relay."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.agent.images_loader import LoadError, load_image
from persys.agent.runtimes.base import RuntimeFailure
from persys.model.limits import MiB, human_bytes
from persys.security import peer_names
from persys.security.grpc_tls import SERVER_KEEPALIVE_OPTIONS, peer_identity, secure_channel, server_credentials
from persys.security.pki import TLSFiles

if TYPE_CHECKING:
    from persys.agent.agent import Agent

ALLOWED = {"gateway", "scheduler", "admin"}


class AgentServiceImpl(apb_grpc.AgentServiceServicer):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def GetLogs(self, request: apb.LogsRequest, context: grpc.aio.ServicerContext) -> apb.LogsResponse:
        who = peer_identity(context)
        if who not in ALLOWED:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate {who or '(none)'} may not read logs")
        wid, tail = request.workload_id, request.tail or 100
        desired = self.agent.desired.get(wid)
        candidates = [self.agent.runtimes[desired.spec.type]] if desired and desired.spec.type in self.agent.runtimes \
            else list(self.agent.runtimes.values())
        for rt in candidates:
            try:
                if desired is None and await rt.inspect(wid) is None:
                    continue
                return apb.LogsResponse(text=await rt.logs(wid, tail), runtime=rt.name)
            except RuntimeFailure as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        await context.abort(grpc.StatusCode.NOT_FOUND, f"{wid} is not on node {self.agent.config.node_id}")
        raise AssertionError("unreachable")


    async def LoadImage(self, request_iterator: AsyncIterator[apb.ImageChunk], context: grpc.aio.ServicerContext
                        ) -> apb.ImageResult:
        who = peer_identity(context)
        if who not in ALLOWED:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate {who or '(none)'} may not load images")
        spool = self.agent.config.state_dir / "incoming"
        spool.mkdir(parents=True, exist_ok=True)
        kind = name = ""
        received, cap = 0, self.agent.config.image_max_bytes
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
                detail = await load_image(kind, name, Path(tmp), self.agent.config.state_dir / "runtimes")
            except LoadError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            return apb.ImageResult(name=name, detail=detail)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


async def serve(agent: Agent, listen: str, tls: TLSFiles) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=SERVER_KEEPALIVE_OPTIONS)
    apb_grpc.add_AgentServiceServicer_to_server(AgentServiceImpl(agent), server)
    port = server.add_secure_port(listen, server_credentials(tls))
    if port == 0:
        raise OSError(f"agent cannot listen on {listen}")
    await server.start()
    return server, port


async def send_image(address: str, tls: TLSFiles, kind: str, name: str, data: AsyncIterator[bytes], *,
                     node_id: str) -> str:
    """Stream an image to node `node_id`'s agent as it arrives, in messages of about 1 MiB (used by the
    gateway). Only that node's certificate is accepted at `address`, whatever the node registered."""

    async def chunks() -> AsyncIterator[apb.ImageChunk]:
        buf = bytearray()
        sent = False
        async for piece in data:
            buf += piece
            if len(buf) >= MiB:
                yield apb.ImageChunk(kind=kind, name=name, data=bytes(buf))
                buf.clear()
                sent = True
        if buf or not sent:
            yield apb.ImageChunk(kind=kind, name=name, data=bytes(buf))

    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).LoadImage(chunks(), timeout=600)
    return str(resp.detail)


async def fetch_logs(address: str, tls: TLSFiles, workload_id: str, tail: int, *, node_id: str) -> str:
    """Ask node `node_id`'s agent for an instance's logs (used by the gateway)."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).GetLogs(
            apb.LogsRequest(workload_id=workload_id, tail=tail), timeout=15)
    return str(resp.text)
