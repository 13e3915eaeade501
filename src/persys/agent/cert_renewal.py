"""The node renews its own certificate before it expires, without restarting.

At `renewal.renew_at` (two thirds of the lifetime, jittered) it makes a new key here, asks the
scheduler it talks to for a certificate on it (NodeCertificates.Renew over its current mutual-TLS
identity), writes the pair and tells whoever uses it: the link dials new calls with it (open
streams go on), the logs/image server presents it at the next handshake. A scheduler that cannot
be reached or refuses leaves the current certificate in use; attempts back off per
`renewal.retry_at`, never past the expiry's last useful moment.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import grpc

from persys._pb.persys.v1 import certificates_pb2 as pb
from persys._pb.persys.v1 import certificates_pb2_grpc as pb_grpc
from persys.agent import node_identity
from persys.security import peer_names
from persys.security.csr import new_key_and_csr
from persys.security.grpc_tls import secure_channel
from persys.security.renewal import renew_at, retry_at
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)
TIMEOUT = 15.0
UNREADABLE_RETRY = 60.0


class CertRenewer:
    def __init__(self, node_id: str, files: TLSFiles, target: Callable[[], str], on_renewed: Callable[[], None],
                 jitter: float | None = None) -> None:
        self.node_id = node_id
        self.files = files
        self.target = target  # the replica the link talks to now
        self.on_renewed = on_renewed
        self.jitter = jitter if jitter is not None else random.uniform(0.9, 1.1)
        self.renewals = 0
        self.failures = 0  # in a row

    async def run(self) -> None:
        while True:
            try:
                validity = await asyncio.to_thread(node_identity.validity, self.files)
            except (OSError, ValueError) as err:  # replaced by hand, or unreadable: look again later
                log.error("cannot read the node certificate %s (%s); renewal waits", self.files.cert, err)
                await asyncio.sleep(UNREADABLE_RETRY)
                continue
            await asyncio.sleep(max(0.0, renew_at(validity, self.jitter) - time.time()))
            self.failures = 0
            while True:
                try:
                    await self.renew_once()
                    break
                except (grpc.aio.AioRpcError, node_identity.IdentityError, OSError) as err:
                    self.failures += 1
                    why = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
                    nxt = retry_at(validity, time.time(), self.failures)
                    log.warning("certificate renewal failed (%s); keeping the current one (expires in %.0fs), "
                                "retrying in %.1fs", why, validity.not_after - time.time(), nxt - time.time())
                    await asyncio.sleep(max(0.0, nxt - time.time()))

    async def renew_once(self) -> None:
        key_pem, csr_pem = await asyncio.to_thread(new_key_and_csr, f"node:{self.node_id}")
        # A channel of its own, dialled with the current certificate: the link's stay as they are.
        async with secure_channel(self.target(), self.files, expect=peer_names.SCHEDULER) as channel:
            resp = await pb_grpc.NodeCertificatesStub(channel).Renew(pb.RenewRequest(csr_pem=csr_pem), timeout=TIMEOUT)
        cert = node_identity.check_issued(resp.certificate_pem, key_pem, self.node_id)
        bundle = resp.ca_bundle_pem or None
        await asyncio.to_thread(node_identity.save, self.files, key_pem, resp.certificate_pem, bundle)
        self.renewals += 1
        log.info("renewed certificate node:%s (serial %s, until %s)", self.node_id, resp.serial,
                 cert.not_valid_after_utc.isoformat())
        self.on_renewed()
