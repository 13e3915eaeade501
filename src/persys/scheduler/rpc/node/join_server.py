"""The join listener: the one port a node without a certificate may reach.

Server-only TLS (a joining node has no certificate yet) with the scheduler's own certificate,
sent with the CA bundle behind it so the node can find the CA its pin names before it trusts
anything. It serves NodeJoin alone: every other service stays on the main port, which requires a
client certificate in the handshake. Small messages and few concurrent calls: its callers are
unauthenticated until their token is checked.
"""

from __future__ import annotations

import grpc

from persys._pb.persys.v1 import certificates_pb2_grpc as pb_grpc
from persys.scheduler.rpc.node.certificates import NodeCertificates, NodeJoinService
from persys.security.grpc_reload import reloading_file_credentials
from persys.security.grpc_tls import SERVER_KEEPALIVE_OPTIONS
from persys.tlsfiles import TLSFiles

MAX_JOIN_MESSAGE = 64 * 1024
MAX_CONCURRENT_JOINS = 16


async def start_join_server(listen: str, tls: TLSFiles, certs: NodeCertificates) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[*SERVER_KEEPALIVE_OPTIONS, ("grpc.max_receive_message_length", MAX_JOIN_MESSAGE)],
                             maximum_concurrent_rpcs=MAX_CONCURRENT_JOINS)
    pb_grpc.add_NodeJoinServicer_to_server(NodeJoinService(certs), server)
    # The scheduler's certificate as its files hold it now (renewed ones at the next handshake).
    port = server.add_secure_port(listen, reloading_file_credentials(tls, require_client_auth=False, send_ca=True))
    if port == 0:
        raise OSError(f"cannot listen on {listen} (join listener)")
    await server.start()
    return server, port
