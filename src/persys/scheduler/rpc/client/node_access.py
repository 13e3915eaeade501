"""The NodeAccess gRPC service (admins): join tokens and node revocation.

Authorization happened before any method here runs (scheduler.authorization, rules in
security.permissions); every call is audited there. A token's secret is in CreateJoinToken's
answer only, with the pin of the CA the joining node must find.
"""

from __future__ import annotations

import json
import time
from typing import Any

import grpc

from persys._pb.persys.v1 import certificates_pb2 as pb
from persys._pb.persys.v1 import certificates_pb2_grpc as pb_grpc
from persys.aborting import abort
from persys.model.node_names import node_id_problem
from persys.scheduler.access import certificates as cert_registry
from persys.scheduler.access.join_tokens import JoinTokenStore
from persys.scheduler.access.revocations import MAX_REASON, NodeRevocations
from persys.scheduler.access.revoke_rules import KnownAs, revoke_refusal
from persys.scheduler.mirror import keys
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import mapped
from persys.security.ca_pin import pin_of_pem
from persys.security.join_tokens import TOKEN_ID, JoinTokenError
from persys.security.signer import CertificateSigner
from persys.store.base import StateStore


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class NodeAccessService(pb_grpc.NodeAccessServicer):
    def __init__(self, store: StateStore, revocations: NodeRevocations, signer: CertificateSigner | None) -> None:
        self.store = store
        self.tokens = JoinTokenStore(store)
        self.revocations = revocations
        self.signer = signer

    async def CreateJoinToken(self, request: pb.CreateJoinTokenRequest, context: grpc.aio.ServicerContext
                              ) -> pb.CreateJoinTokenResponse:
        if self.signer is None:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                        "this scheduler signs no node certificates: start it with --ca-dir and --join-listen")
        async with mapped(context, JoinTokenError):
            pin = pin_of_pem(await self.signer.ca_bundle())
            token, record = await self.tokens.create(request.ttl_seconds, request.node_id,
                                                     CALLER.get().identity.principal, request.description)
        return pb.CreateJoinTokenResponse(token=token, ca_pin=pin, token_json=_dumps(record.public(time.time())))

    async def ListJoinTokens(self, request: pb.ListJoinTokensRequest, context: grpc.aio.ServicerContext
                             ) -> pb.ListJoinTokensResponse:
        async with mapped(context):
            records = await self.tokens.list()
        now = time.time()
        return pb.ListJoinTokensResponse(items=[_dumps(r.public(now)) for r in records])

    async def RevokeJoinToken(self, request: pb.RevokeJoinTokenRequest, context: grpc.aio.ServicerContext
                              ) -> pb.JoinTokenResponse:
        if not TOKEN_ID.match(request.id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "id: a join token id (6 letters and digits)")
        async with mapped(context):
            record = await self.tokens.revoke(request.id, CALLER.get().identity.principal)
        if record is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"join token {request.id} not found")
        return pb.JoinTokenResponse(token_json=_dumps(record.public(time.time())))

    async def RevokeNode(self, request: pb.RevokeNodeRequest, context: grpc.aio.ServicerContext
                         ) -> pb.RevokeNodeResponse:
        if problem := node_id_problem(request.node_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"node_id: {problem}")
        if len(request.reason) > MAX_REASON or not request.reason.isprintable():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"reason: printable text, at most {MAX_REASON} characters")
        async with mapped(context):
            refusal = revoke_refusal(request.node_id, await self._known_as(request.node_id), request.force)
            if refusal:
                await context.abort(grpc.StatusCode.NOT_FOUND, refusal)
            doc = await self.revocations.revoke(request.node_id, CALLER.get().identity.principal, request.reason)
            # `persys certs status` shows the node's certificates revoked.
            for rec in await cert_registry.list_records(self.store):
                if rec.identity == f"node:{request.node_id}" and not rec.revoked_at:
                    await cert_registry.mark_revoked(self.store, rec.serial)
        return pb.RevokeNodeResponse(revocation_json=_dumps(doc))

    async def _known_as(self, node_id: str) -> KnownAs:
        identity = f"node:{node_id}"
        return KnownAs(
            registered=await self.store.get(keys.node(node_id)) is not None,
            certified=any(r.identity == identity for r in await cert_registry.list_records(self.store)),
            token_named=any(t.node_id == node_id for t in await self.tokens.list()),
            revoked=await self.revocations.revoked_in_store(node_id))
