"""An async client of a node agent's own AgentService (logs, image upload), used by the gateway.

It lives outside `persys.agent` so that the control plane talks to agents over their gRPC
contract only, never by importing agent code.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

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
