"""An async client of a node agent's own AgentService (logs, image upload), used by the gateway.

It lives outside `persys.agent` so that the control plane talks to agents over their gRPC
contract only, never by importing agent code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.model.limits import MiB
from persys.security.grpc_tls import secure_channel
from persys.tlsfiles import TLSFiles


async def send_image(address: str, tls: TLSFiles, kind: str, name: str, data: AsyncIterator[bytes]) -> str:
    """Stream an image to a node's agent as it arrives, in messages of about 1 MiB."""

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

    async with secure_channel(address, tls) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).LoadImage(chunks(), timeout=600)
    return str(resp.detail)


async def fetch_logs(address: str, tls: TLSFiles, workload_id: str, tail: int) -> str:
    """Ask a node's agent for an instance's logs."""
    async with secure_channel(address, tls) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).GetLogs(
            apb.LogsRequest(workload_id=workload_id, tail=tail), timeout=15)
    return str(resp.text)
