"""What `persys scheduler` and `persys agent` need for node join: the scheduler's signer and the
agent's identity (from its TLS folder, or obtained with a join token)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from persys.agent import node_identity
from persys.agent.join import JoinError, join
from persys.cli.servers.errors import ServerError
from persys.cli.servers.signer_options import signer_from_options
from persys.scheduler.rpc.node.certificates import MAX_NODE_CERT_TTL, MIN_NODE_CERT_TTL
from persys.security.ca_pin import PinError, check_pin
from persys.security.live_identity import LiveIdentity
from persys.security.pki import ClusterCA
from persys.security.signer import CertificateSigner
from persys.store.base import StateStore
from persys.tlsfiles import TLSFiles

log = logging.getLogger("persys")
TOKEN_ENV = "PERSYS_JOIN_TOKEN"


def scheduler_signer(ca_dir: Path | None, live: LiveIdentity | None, join_listen: str, node_cert_ttl: float
                     ) -> Callable[[StateStore], CertificateSigner] | None:
    """What signs node certificates (join and renewal), given the store it records them in: OpenBao
    through the scheduler's own session, else the built-in CA in `ca_dir`; None: no signing here."""
    if not MIN_NODE_CERT_TTL <= node_cert_ttl <= MAX_NODE_CERT_TTL:
        raise ServerError(f"--node-cert-ttl: from {MIN_NODE_CERT_TTL:.0f} to {MAX_NODE_CERT_TTL:.0f} seconds")
    if ca_dir is None and live is None:
        if join_listen:
            raise ServerError("--join-listen needs a signer: --ca-dir (the folder of `persys certs init`) or "
                              "--identity-from openbao")
        return None
    if live is None and ca_dir is not None and not ClusterCA(ca_dir).exists():
        raise ServerError(f"--ca-dir {ca_dir}: no ca.crt and ca.key there (persys certs init --dir {ca_dir})")
    return lambda store: signer_from_options(store, identity=live, ca_dir=ca_dir)


def certificate_hosts(listen: str, advertise_host: str) -> tuple[str, ...]:
    """The names a joining node asks for: where the gateway will dial it (as Agent.start advertises)."""
    host = advertise_host or listen.rpartition(":")[0]
    return (socket.gethostname() if host in ("0.0.0.0", "[::]", "") else host.strip("[]"),)


async def agent_tls(tls_dir: Path, node_id: str, join_address: str, token: str, ca_pin: str,
                    hosts: tuple[str, ...]) -> TLSFiles:
    """The node's TLS files: those in the folder while its certificate is valid (a restarted agent
    needs no token), else new ones obtained with the join token."""
    files = node_identity.node_files(tls_dir, node_id)
    if node_identity.usable(files, time.time()):
        if join_address:
            log.info("node %s already has a valid certificate in %s: not joining again", node_id, tls_dir)
        return files
    if not join_address:
        missing = [str(f) for f in (files.ca, files.cert, files.key) if not f.exists()]
        raise ServerError(f"{', '.join(missing) or files.cert} is missing or expired: join with "
                          f"--join --token --ca-pin (persysctl node token create) or create certificates with "
                          f"`persys certs issue`")
    token = token or os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ServerError(f"--token (or ${TOKEN_ENV}): the join token from `persysctl node token create`")
    try:
        pin = check_pin(ca_pin)
        files = await join(join_address, token.strip(), pin, node_id, hosts, tls_dir)
    except (PinError, JoinError) as e:
        raise ServerError(str(e)) from None
    log.info("node %s joined: certificate and CA bundle written to %s", node_id, tls_dir)
    return files
