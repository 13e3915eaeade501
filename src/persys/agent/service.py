"""The agent's own gRPC service (AgentService): data the control plane should not relay."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.agent.runtimes.base import RuntimeFailure
from persys.security.grpc_tls import peer_identity, secure_channel, server_credentials
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


async def serve(agent: Agent, listen: str, tls: TLSFiles) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    apb_grpc.add_AgentServiceServicer_to_server(AgentServiceImpl(agent), server)
    port = server.add_secure_port(listen, server_credentials(tls))
    if port == 0:
        raise OSError(f"agent cannot listen on {listen}")
    await server.start()
    return server, port


async def fetch_logs(address: str, tls: TLSFiles, workload_id: str, tail: int) -> str:
    """Ask a node's agent for an instance's logs (used by the gateway)."""
    async with secure_channel(address, tls) as channel:
        resp = await apb_grpc.AgentServiceStub(channel).GetLogs(
            apb.LogsRequest(workload_id=workload_id, tail=tail), timeout=15)
    return str(resp.text)
