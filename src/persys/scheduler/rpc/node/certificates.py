"""Node certificates: Join (a join token buys a first certificate) and Renew (an authenticated
node gets a new one for its own identity).

Join is served on the join listener (`join_server`), where callers have no certificate yet: the
token is the credential, checked and consumed with a compare-and-swap (`join_token_store`), and
every refusal is audited. Renew is a node call on the main mutual-TLS port. Both sign through a
`CertificateSigner` (the built-in CA, or Vault/OpenBao), taking only the key from the CSR: the
identity is `node:<id>` from the token or the caller's certificate, the names the ones asked at
join (kept at renewal), the lifetime the scheduler's.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
import uuid
from typing import Any

import grpc

from persys._pb.persys.v1 import certificates_pb2 as pb
from persys._pb.persys.v1 import certificates_pb2_grpc as pb_grpc
from persys.aborting import abort
from persys.scheduler.access.audit import AuditLog
from persys.scheduler.access.join_tokens import JoinTokenStore
from persys.scheduler.access.refusal_budget import RefusalBudget
from persys.scheduler.access.revocations import NodeRevocations, NodeRevokedError
from persys.scheduler.mirror import keys
from persys.security import peer_names
from persys.security.cert_requests import IdentityRequest
from persys.security.identity import Kind
from persys.security.join_tokens import parse
from persys.security.peer import peer_hosts, peer_identity_of
from persys.security.pki import CertificateRequestError
from persys.security.signer import MAX_CSR_BYTES, CertificateSigner, SignedCertificate
from persys.store.base import StateStore, StoreError

JOIN = "/persys.v1.NodeJoin/Join"
RENEW = "/persys.v1.NodeCertificates/Renew"
DEFAULT_NODE_CERT_TTL = 12 * 3600.0
MIN_NODE_CERT_TTL = 10.0  # tests; production lifetimes are hours
MAX_NODE_CERT_TTL = 30 * 86400.0
MAX_HOSTS = 16
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252})$")

log = logging.getLogger(__name__)


def hosts_problem(hosts: list[str]) -> str:
    """Why the names a joining node asks for cannot go into its certificate ('' if they can)."""
    if not hosts:
        return "hosts: at least one name or address the gateway reaches the node at"
    if len(hosts) > MAX_HOSTS:
        return f"hosts: at most {MAX_HOSTS}"
    bad = next((h for h in hosts if not _HOST.match(h)), None)
    if bad is not None:
        return f"hosts: {bad[:64]!r} is not a host name or address"
    return ""


class NodeCertificates:
    """What both services share: the signer, the lifetime, revocations and the audit log."""

    def __init__(self, signer: CertificateSigner, store: StateStore, revocations: NodeRevocations,
                 audit: AuditLog, ttl: float = DEFAULT_NODE_CERT_TTL) -> None:
        self.signer = signer
        self.store = store
        self.tokens = JoinTokenStore(store)
        self.revocations = revocations
        self.audit = audit
        self.ttl = dt.timedelta(seconds=ttl)

    async def sign(self, node_id: str, hosts: tuple[str, ...], csr: bytes) -> SignedCertificate:
        request = IdentityRequest(f"node:{node_id}", f"node-{node_id}", hosts, ())
        return await self.signer.sign(csr, request, self.ttl)

    async def record(self, action: str, principal: str, credential: str, obj: dict[str, Any], result: str) -> None:
        await self.audit.record({"ts": time.time(), "principal": principal, "via": "", "credential": credential,
                                 "action": action, "object": obj, "result": result,
                                 "requestId": uuid.uuid4().hex})


def _answer(node_id: str, signed: SignedCertificate) -> pb.CertificateResponse:
    return pb.CertificateResponse(certificate_pem=signed.certificate_pem, ca_bundle_pem=signed.ca_bundle_pem,
                                  node_id=node_id, serial=signed.serial, not_after=signed.not_after.timestamp())


class JoinRefusedError(Exception):
    def __init__(self, code: grpc.StatusCode, why: str) -> None:
        super().__init__(why)
        self.code = code


class NodeJoinService(pb_grpc.NodeJoinServicer):
    def __init__(self, certs: NodeCertificates) -> None:
        self.c = certs
        self.refusals = RefusalBudget()  # strangers cannot flood the audit log with refused joins

    async def _admit(self, request: pb.JoinRequest) -> tuple[str, str, int]:
        """(node, token id, the token record's revision) of an admissible join; else JoinRefusedError."""
        if len(request.token) > 128 or len(request.node_id) > 63 or len(request.csr_pem) > MAX_CSR_BYTES:
            raise JoinRefusedError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"token, node_id or csr_pem: too long (csr at most {MAX_CSR_BYTES} bytes)")
        if problem := hosts_problem(list(request.hosts)):
            raise JoinRefusedError(grpc.StatusCode.INVALID_ARGUMENT, problem)
        admission, token_id, revision = await self.c.tokens.check(request.token, request.node_id)
        if admission.refusal:
            code = grpc.StatusCode.UNAUTHENTICATED if admission.forged else (
                grpc.StatusCode.INVALID_ARGUMENT if admission.refusal.startswith("node_id:")
                else grpc.StatusCode.PERMISSION_DENIED)
            raise JoinRefusedError(code, f"join refused: {admission.refusal}")
        node = admission.node_id
        if await self.c.revocations.revoked_in_store(node):
            raise JoinRefusedError(grpc.StatusCode.PERMISSION_DENIED, str(NodeRevokedError(node)))
        if not admission.named and await self.c.store.get(keys.node(node)) is not None:
            # Otherwise any token would let its holder take over a node the cluster runs.
            raise JoinRefusedError(grpc.StatusCode.PERMISSION_DENIED,
                                   f"node_id: node {node} exists; only a token naming it admits it again "
                                   f"(persysctl node token create --node-id {node})")
        return node, token_id, revision

    async def _join(self, request: pb.JoinRequest, obj: dict[str, Any]) -> tuple[str, SignedCertificate]:
        try:
            node, token_id, revision = await self._admit(request)
            obj["node_id"] = node
            signed = await self.c.sign(node, tuple(request.hosts), request.csr_pem)
            # Signed first, consumed after: a bad CSR or a failing signer leaves the token unused.
            if not await self.c.tokens.consume(token_id, revision, node):
                raise JoinRefusedError(grpc.StatusCode.PERMISSION_DENIED, f"join refused: token {token_id} is used")
        except CertificateRequestError as err:
            raise JoinRefusedError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
        except StoreError as err:
            raise JoinRefusedError(grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {err}") from None
        except JoinRefusedError:
            raise
        except Exception as err:  # the signer's backend (a CA service) failed: the token stays unused
            log.exception("signing a joining node's certificate failed")
            raise JoinRefusedError(grpc.StatusCode.UNAVAILABLE,
                                   f"the certificate signer failed: {type(err).__name__}") from None
        return node, signed

    async def _record_refusal(self, principal: str, credential: str, obj: dict[str, Any], result: str) -> None:
        record, summary = self.refusals.admit(time.monotonic())
        if summary:
            await self.c.record(JOIN, "anonymous", "join token", {"suppressed_refusals": summary}, "SUPPRESSED")
        if record:
            await self.c.record(JOIN, principal, credential, obj, result)

    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.CertificateResponse:
        obj: dict[str, Any] = {"node_id": request.node_id[:64], "hosts": [h[:64] for h in request.hosts[:MAX_HOSTS]]}
        parts = parse(request.token) if len(request.token) <= 128 else None
        credential = f"join token {parts[0]}" if parts else "join token (malformed)"  # never the secret
        try:
            node, signed = await self._join(request, obj)
        except JoinRefusedError as err:
            principal = f"node:{obj['node_id']}" if obj["node_id"] else "anonymous"
            await self._record_refusal(principal, credential, obj, err.code.name)
            log.warning("join refused (%s): %s", credential, err)
            await abort(context, err.code, str(err))
        obj["serial"] = signed.serial
        await self.c.record(JOIN, f"node:{node}", credential, obj, "OK")
        log.info("node %s joined with %s (certificate %s until %s)", node, credential, signed.serial,
                 signed.not_after.isoformat())
        return _answer(node, signed)


class NodeCertificatesService(pb_grpc.NodeCertificatesServicer):
    def __init__(self, certs: NodeCertificates) -> None:
        self.c = certs

    async def Renew(self, request: pb.RenewRequest, context: grpc.aio.ServicerContext) -> pb.CertificateResponse:
        peer = peer_identity_of(context)
        if peer.kind is not Kind.NODE:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"node-identity: only a node certificate renews ({peer.principal} is none)")
        # The names the node was given, without the role name the signer adds again.
        hosts = tuple(sorted(h for h in peer_hosts(context) if not peer_names.is_reserved(h)))
        obj: dict[str, Any] = {"node_id": peer.name, "hosts": list(hosts)}
        code, why = grpc.StatusCode.OK, ""
        try:
            if self.c.revocations.is_revoked(peer.name) or await self.c.revocations.revoked_in_store(peer.name):
                code, why = grpc.StatusCode.PERMISSION_DENIED, str(NodeRevokedError(peer.name))
            else:
                signed = await self.c.sign(peer.name, hosts, request.csr_pem)
                obj["serial"] = signed.serial
        except CertificateRequestError as err:
            code, why = grpc.StatusCode.INVALID_ARGUMENT, str(err)
        except StoreError as err:
            code, why = grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {err}"
        except Exception as err:  # the signer's backend failed: the node keeps its certificate and retries
            log.exception("renewing node %s's certificate failed", peer.name)
            code, why = grpc.StatusCode.UNAVAILABLE, f"the certificate signer failed: {type(err).__name__}"
        await self.c.record(RENEW, peer.principal, "certificate", obj, code.name)
        if code is not grpc.StatusCode.OK:
            await context.abort(code, why)
        return _answer(peer.name, signed)
