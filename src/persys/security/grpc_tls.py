"""gRPC mutual-TLS credentials and caller identity."""

from __future__ import annotations

import grpc

from persys.model.limits import GRPC_MAX_MESSAGE_BYTES
from persys.tlsfiles import TLSFiles


def server_credentials(files: TLSFiles) -> grpc.ServerCredentials:
    ca, cert, key = files.read()
    # require_client_auth: a peer without a certificate signed by the cluster CA is refused
    # during the handshake, before any RPC runs.
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(files: TLSFiles) -> grpc.ChannelCredentials:
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


CLIENT_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
# Our clients ping every 10 s, also between calls, to notice a dead peer. A server's defaults
# (pings without calls not permitted, at most one every 5 minutes) count those as abuse and end
# the connection with GOAWAY "too_many_pings", failing the calls on it: accept what we send.
SERVER_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    # Peers are authenticated (mutual TLS): a ping arriving early is a timing quirk, not abuse;
    # never end a connection (and the calls on it) for it.
    ("grpc.http2.max_ping_strikes", 0),
]


def server_options(max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [*SERVER_KEEPALIVE_OPTIONS, ("grpc.max_receive_message_length", max_message_bytes)]


def secure_channel(target: str, files: TLSFiles, *, expect: str) -> grpc.aio.Channel:
    """A channel to `target` that only completes its handshake with a peer whose certificate
    carries the role name `expect` (a `peer_names` constant): every client says whom it dials,
    whatever address it was given (a node's certificate does not pass as a scheduler's)."""
    return grpc.aio.secure_channel(
        target,
        channel_credentials(files),
        options=[
            *CLIENT_KEEPALIVE_OPTIONS,
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
            ("grpc.ssl_target_name_override", expect),
        ],
    )


def peer_identity(context: grpc.aio.ServicerContext) -> str:
    """The common name of the caller's verified client certificate ('' if none)."""
    auth = context.auth_context()
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else ""
