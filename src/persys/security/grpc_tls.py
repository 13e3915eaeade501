"""gRPC mutual-TLS credentials and caller identity."""

from __future__ import annotations

import grpc

from persys.model.limits import GRPC_MAX_MESSAGE_BYTES
from persys.security.pki import TLSFiles


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    ca, cert, key = files.read()
    # require_client_auth: a peer without a certificate signed by the cluster CA is refused
    # during the handshake, before any RPC runs.
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def secure_channel(target: str, files: TLSFiles) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(
        target,
        channel_credentials(files),
        options=[
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ],
    )


def peer_identity(context: grpc.aio.ServicerContext) -> str:
    """The common name of the caller's verified client certificate ('' if none)."""
    auth = context.auth_context()
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else ""
