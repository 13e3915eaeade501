"""The Auth gRPC service: who am I, can I, API tokens and the audit log.

Authorization happened before any method here runs (scheduler.authorization); the caller it
established is in `CALLER`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import grpc

from persys._pb.persys.v1 import auth_pb2 as pb
from persys._pb.persys.v1 import auth_pb2_grpc as pb_grpc
from persys.aborting import abort
from persys.scheduler.access.audit import AuditLog
from persys.scheduler.access.tokens import TokenStore
from persys.scheduler.rpc.authorization import CALLER, MAX_FIELD_CHARS, Caller, peer_of
from persys.scheduler.rpc.status import mapped
from persys.security.roles import all_grants, decide, roles_of
from persys.security.tokens import TokenError

MAX_AUDIT_QUERY = 10_000
# The fields a gateway's own record may carry (anything else is dropped), each a short string.
GATEWAY_RECORD_FIELDS = ("principal", "credential", "action", "result", "requestId")


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def gateway_record(raw: bytes, gateway: str) -> dict[str, Any]:
    """A gateway's audit record, reduced to known fields of bounded size (pure; ValueError if
    it is not a JSON object)."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("record_json: a JSON object")
    rec: dict[str, Any] = {k: str(doc.get(k, ""))[:MAX_FIELD_CHARS] for k in GATEWAY_RECORD_FIELDS}
    obj = doc.get("object")
    rec["object"] = {str(k)[:64]: str(v)[:MAX_FIELD_CHARS] for k, v in list(obj.items())[:20]} \
        if isinstance(obj, dict) else {}
    rec["ts"] = time.time()
    rec["via"] = gateway
    return rec


class AuthService(pb_grpc.AuthServicer):
    def __init__(self, tokens: TokenStore, audit: AuditLog) -> None:
        self.tokens = tokens
        self.audit = audit

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: grpc.aio.ServicerContext) -> pb.WhoAmIResponse:
        c = CALLER.get()
        return pb.WhoAmIResponse(principal=c.identity.principal, groups=list(c.identity.groups),
                                 roles=[str(r) for r in roles_of(c.identity)], credential=c.credential, via=c.via)

    async def CanI(self, request: pb.CanIRequest, context: grpc.aio.ServicerContext) -> pb.CanIResponse:
        if (request.verb, request.resource) not in all_grants():
            known = sorted(f"{v} {r}" for v, r in all_grants())
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"verb/resource: {request.verb} {request.resource} is not a permission "
                                f"(known: {', '.join(known)})")
        d = decide(CALLER.get().identity, request.verb, request.resource)
        return pb.CanIResponse(allowed=d.allowed, reason=d.reason)

    async def CreateToken(self, request: pb.CreateTokenRequest, context: grpc.aio.ServicerContext
                          ) -> pb.CreateTokenResponse:
        c: Caller = CALLER.get()
        async with mapped(context, TokenError):
            secret, record = await self.tokens.create(request.name, request.role, request.ttl_seconds,
                                                      c.identity.principal, request.description)
        return pb.CreateTokenResponse(token=secret, token_json=_dumps(record.public(time.time())))

    async def ListTokens(self, request: pb.ListTokensRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListTokensResponse:
        async with mapped(context):
            records = await self.tokens.list()
        now = time.time()
        return pb.ListTokensResponse(items=[_dumps(r.public(now)) for r in records])

    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: grpc.aio.ServicerContext
                          ) -> pb.RevokeTokenResponse:
        if not request.id.isalnum() or len(request.id) > 64:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "id: a token id (hexadecimal)")
        async with mapped(context):
            record = await self.tokens.revoke(request.id, CALLER.get().identity.principal)
        if record is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"token {request.id} not found")
        return pb.RevokeTokenResponse(token_json=_dumps(record.public(time.time())))

    async def ListAudit(self, request: pb.ListAuditRequest, context: grpc.aio.ServicerContext
                        ) -> pb.ListAuditResponse:
        if request.limit < 0 or request.limit > MAX_AUDIT_QUERY or request.since < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"limit: 0 to {MAX_AUDIT_QUERY}; since: a time after 1970")
        async with mapped(context):
            records = await self.audit.query(request.since, request.who, request.limit or 100)
        return pb.ListAuditResponse(items=[_dumps(r) for r in records], kept=self.audit.keep)

    async def RecordAudit(self, request: pb.RecordAuditRequest, context: grpc.aio.ServicerContext
                          ) -> pb.RecordAuditResponse:
        try:
            rec = gateway_record(request.record_json, peer_of(context).principal)
        except ValueError as err:  # JSONDecodeError too
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record_json: {err!s:.200}")
        await self.audit.record(rec)
        return pb.RecordAuditResponse()
