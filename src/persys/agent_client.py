"""An async client of a node agent's own AgentService (logs, image upload, exec, cp), used by the gateway.

It lives outside `persys.agent` so that the control plane talks to agents over their gRPC
contract only, never by importing agent code.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.model.limits import MiB
from persys.observability.grpc_tracing import with_trace_context
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.tlsfiles import TLSFiles


async def send_image(address: str, tls: TLSFiles, kind: str, name: str, data: AsyncIterator[bytes], *,
                     node_id: str) -> str:
    """Stream an image to node `node_id`'s agent as it arrives, in messages of about 1 MiB. Only
    that node's certificate is accepted at `address`, whatever the node registered."""

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


async def list_images(address: str, tls: TLSFiles, *, node_id: str) -> apb.ListImagesResponse:
    """What images node `node_id` holds (ListImages)."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        resp: apb.ListImagesResponse = await apb_grpc.AgentServiceStub(channel).ListImages(
            apb.ListImagesRequest(), timeout=30, metadata=with_trace_context(()) or None)
    return resp


async def remove_image(address: str, tls: TLSFiles, kind: str, name: str, *, node_id: str) -> str:
    """Remove one image from node `node_id` (RemoveImage); what went, in one line."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).RemoveImage(
            apb.RemoveImageRequest(kind=kind, name=name), timeout=120, metadata=with_trace_context(()) or None)
    return str(resp.detail)


async def fetch_logs(address: str, tls: TLSFiles, request: apb.LogsRequest, *, node_id: str) -> str:
    """Ask node `node_id`'s agent for an instance's logs."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).GetLogs(
            request, timeout=15, metadata=with_trace_context(()) or None)
    return str(resp.text)


async def stream_logs(address: str, tls: TLSFiles, request: apb.LogsRequest, *, node_id: str
                      ) -> AsyncGenerator[str, None]:
    """An instance's output as node `node_id`'s agent streams it (StreamLogs): first "" once the
    agent accepted the request (errors before it are refusals), then the pieces. Closing this
    generator cancels the call, which stops the agent reading."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        call = apb_grpc.AgentServiceStub(channel).StreamLogs(request, metadata=with_trace_context(()) or None)
        try:
            async for msg in call:
                yield str(msg.text)
        finally:
            call.cancel()

async def run_command(address: str, tls: TLSFiles, instance_id: str, command: list[str], *, service: str,
                      timeout_seconds: int, node_id: str, stdin: bytes = b"") -> apb.ExecResult:
    """Ask node `node_id`'s agent to run `command` in an instance; the call outlives the command's
    own timeout by a margin (the agent kills the command at it)."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        result: apb.ExecResult = await apb_grpc.AgentServiceStub(channel).Exec(
            apb.ExecRequest(instance_id=instance_id, command=command, service=service,
                            timeout_seconds=timeout_seconds, stdin=stdin),
            timeout=timeout_seconds + 30, metadata=with_trace_context(()) or None)
    return result


async def copy_from(address: str, tls: TLSFiles, instance_id: str, path: str, *, node_id: str
                    ) -> AsyncGenerator[bytes, None]:
    """The tar archive of `path` in an instance, in chunks as node `node_id`'s agent sends them.
    The agent's refusal, if any, is raised before the first chunk."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        call = apb_grpc.AgentServiceStub(channel).CopyFrom(
            apb.CopyFromRequest(instance_id=instance_id, path=path), timeout=600,
            metadata=with_trace_context(()) or None)
        async for chunk in call:
            yield bytes(chunk.data)


async def copy_to(address: str, tls: TLSFiles, instance_id: str, path: str, data: AsyncIterator[bytes], *,
                  node_id: str) -> apb.CopyResult:
    """Stream a tar archive to node `node_id`'s agent, to be unpacked at `path` in an instance."""

    async def chunks() -> AsyncIterator[apb.FileChunk]:
        sent = False
        async for piece in data:
            for at in range(0, len(piece), MiB):
                yield apb.FileChunk(instance_id=instance_id, path=path, data=piece[at:at + MiB])
                sent = True
        if not sent:
            yield apb.FileChunk(instance_id=instance_id, path=path, data=b"")

    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        result: apb.CopyResult = await apb_grpc.AgentServiceStub(channel).CopyTo(chunks(), timeout=600)
    return result


@contextlib.asynccontextmanager
async def attach(address: str, tls: TLSFiles, opening: apb.TerminalInput, *, node_id: str
                 ) -> AsyncIterator[Any]:
    """A terminal on node `node_id`'s agent (Attach): the call, already sent `opening`, to `write`
    TerminalInput to and `read` TerminalOutput from. Leaving the block cancels it (the agent then
    closes the terminal)."""
    async with secure_channel(address, tls, expect=peer_names.node(node_id)) as channel:
        call = apb_grpc.AgentServiceStub(channel).Attach(metadata=with_trace_context(()) or None)
        try:
            await call.write(opening)
            yield call
        finally:
            call.cancel()
