"""`persys agent --join`: a node without a certificate obtains one with a join token.

1. Fetch the scheduler's certificate chain from its join listener over TLS *without* verifying
   it, and find the CA certificate whose key matches the pin (`security.ca_pin`); refuse on a
   mismatch before anything is sent (the token included).
2. Make the key here (`security.csr`) and call NodeJoin.Join over TLS verified against the pinned
   CA, checking the scheduler's role name, with the token, the node id, its names and the CSR.
3. Write only the CA bundle, the key (0600) and the certificate into the TLS folder.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import grpc
from cryptography.hazmat.primitives import serialization

from persys._pb.persys.v1 import certificates_pb2 as pb
from persys._pb.persys.v1 import certificates_pb2_grpc as pb_grpc
from persys.agent import node_identity
from persys.security import peer_names
from persys.security.ca_pin import PinError, pinned_ca
from persys.security.csr import new_key_and_csr
from persys.tlsfiles import TLSFiles

TIMEOUT = 15.0


class JoinError(Exception):
    """The join did not happen; the message says why (one line for the operator)."""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise JoinError(f"--join {address!r}: expected host:port of the scheduler's join listener")
    return host.strip("[]"), int(port)


def _unverified_chain(host: str, port: int, timeout: float) -> list[bytes]:
    # Verification is off on purpose: the pin, checked next, is what decides trust.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, port), timeout=timeout) as raw, \
            ctx.wrap_socket(raw, server_hostname=peer_names.SCHEDULER) as tls:
        # Public from Python 3.13; the same method of the underlying object before.
        get_chain = getattr(tls, "get_unverified_chain", None) or tls._sslobj.get_unverified_chain  # type: ignore[attr-defined]
        chain = get_chain() or []
    return [c if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER) for c in chain]  # type: ignore[attr-defined]


async def fetch_pinned_ca(address: str, pin: str) -> bytes:
    """The PEM of the CA certificate the scheduler at `address` presents that matches `pin`."""
    host, port = split_address(address)
    try:
        chain = await asyncio.to_thread(_unverified_chain, host, port, TIMEOUT)
    except OSError as e:
        raise JoinError(f"cannot reach the join listener at {address}: {e}") from None
    try:
        ca = pinned_ca(chain, pin)
    except PinError as e:
        raise JoinError(f"refusing the scheduler at {address}: {e}") from None
    return ca.public_bytes(serialization.Encoding.PEM)


async def join(address: str, token: str, pin: str, node_id: str, hosts: tuple[str, ...], tls_dir: Path
               ) -> TLSFiles:
    """Join the cluster as `node_id` ('' : the node the token names); returns the files written."""
    ca_pem = await fetch_pinned_ca(address, pin)
    key_pem, csr_pem = await asyncio.to_thread(new_key_and_csr, f"node:{node_id}")
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    async with grpc.aio.secure_channel(address, creds, options=[
            ("grpc.ssl_target_name_override", peer_names.SCHEDULER)]) as channel:
        try:
            resp = await pb_grpc.NodeJoinStub(channel).Join(
                pb.JoinRequest(token=token, node_id=node_id, hosts=list(hosts), csr_pem=csr_pem), timeout=TIMEOUT)
        except grpc.aio.AioRpcError as err:
            raise JoinError(f"the scheduler refused the join: {err.details() or err.code().name}") from None
    node_id = node_id or resp.node_id
    try:
        node_identity.check_issued(resp.certificate_pem, key_pem, node_id)
    except node_identity.IdentityError as e:
        raise JoinError(str(e)) from None
    # The bundle came over the channel verified with the pinned CA; keep the pinned CA in it
    # whatever it says (the pin is the operator's word).
    bundle = resp.ca_bundle_pem if ca_pem.strip() in resp.ca_bundle_pem else resp.ca_bundle_pem + ca_pem
    files = node_identity.node_files(tls_dir, node_id)
    await asyncio.to_thread(node_identity.save, files, key_pem, resp.certificate_pem, bundle)
    return files
