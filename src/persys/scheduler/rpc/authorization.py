"""Who calls, and may they: a gRPC server interceptor in front of every client RPC.

The caller is, in this order: the bearer token in `authorization` metadata (from any peer);
the identity a gateway forwards (`persys-on-behalf-of`, believed from a gateway identity only;
a gateway forwarding nothing is anonymous); else the peer's own certificate identity. The
method's rule (security.permissions) names the verb and resource it needs, the roles decide
(security.roles). Refusals are UNAUTHENTICATED (no identity, bad token) or PERMISSION_DENIED,
before the method runs: nothing is written. Audited methods leave one record per call with
its result. Agents' own RPCs pass through: the service checks them against the node identity.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import grpc
from cryptography import x509
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from persys.aborting import abort
from persys.scheduler.access.audit import AuditLog
from persys.scheduler.access.tokens import TokenRefusedError, TokenStore
from persys.security import forwarding
from persys.security.identity import ANONYMOUS, Identity, Kind, from_certificate, from_subject
from persys.security.permissions import NODE_RPCS, RPC_RULES, Rule
from persys.security.roles import GATEWAY_ONLY, GATEWAY_PROBE, decide
from persys.store.base import StoreError

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
MAX_FIELD_CHARS = 200


@dataclass(frozen=True, slots=True)
class Caller:
    identity: Identity
    via: str = ""  # the gateway that forwarded the call
    credential: str = "certificate"
    request_id: str = ""


CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("persys_caller")


class CallRefusedError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@functools.lru_cache(maxsize=1024)
def _identity_of_pem(pem: bytes) -> Identity:
    return from_certificate(x509.load_pem_x509_certificate(pem))


def peer_of(context: grpc.aio.ServicerContext) -> Identity:
    """The identity in the peer's verified certificate (TLS checked the chain already)."""
    pems = context.auth_context().get("x509_pem_cert") or []
    return _identity_of_pem(pems[0]) if pems else ANONYMOUS


def _request_id(md: dict[str, str]) -> str:
    rid = unquote(md.get(forwarding.REQUEST_ID, ""))[:64]
    return rid if rid.isprintable() and rid else uuid.uuid4().hex


def object_of(request: Message, response: Message | None) -> dict[str, Any]:
    """What a call acted on, for its audit record: the request's scalar fields (documents and
    secrets are bytes and stay out), and the workload an apply named."""
    obj: dict[str, Any] = {}
    for field, value in request.ListFields():
        if field.type in (FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE):
            continue
        if isinstance(value, str):
            value = value[:MAX_FIELD_CHARS]
        elif not isinstance(value, int | float | bool):
            value = [str(v)[:MAX_FIELD_CHARS] for v in list(value)[:20]]
        obj[field.name] = value
    if response is not None:
        if wid := getattr(response, "workload_id", ""):
            obj["workload_id"] = wid
        if results := getattr(response, "results", None):
            obj["workloads"] = len(results)
            obj["first"] = [r.workload_id for r in list(results)[:10]]
    return obj


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc,unused-ignore]
    def __init__(self, tokens: TokenStore, audit: AuditLog) -> None:
        self.tokens = tokens
        self.audit = audit

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = str(details.method)
        if handler is None or method in NODE_RPCS:
            return handler
        rule = RPC_RULES.get(method)
        if rule is not None and handler.unary_stream is not None and not rule.audited:
            # A server stream (Watch): the same check before the first message; reads only.
            return grpc.unary_stream_rpc_method_handler(
                self._guarded_stream(method, rule, handler.unary_stream),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if rule is None or handler.unary_unary is None:
            rule = None  # a client method without a rule: refused, never served by default
        return grpc.unary_unary_rpc_method_handler(
            self._guarded(method, rule, handler.unary_unary),
            request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

    async def resolve(self, context: grpc.aio.ServicerContext, rule: Rule) -> Caller:
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        rid = _request_id(md)
        peer = peer_of(context)
        if (rule.verb, rule.resource) == GATEWAY_ONLY:
            return Caller(peer, "", "certificate", rid)
        via = peer.principal if peer.kind is Kind.GATEWAY else ""
        auth = md.get(forwarding.AUTHORIZATION, "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise CallRefusedError(grpc.StatusCode.UNAUTHENTICATED, "authorization: expected 'Bearer <token>'")
            try:
                identity, credential = await self.tokens.authenticate(token.strip())
            except TokenRefusedError as err:
                raise CallRefusedError(grpc.StatusCode.UNAUTHENTICATED, f"token refused: {err}") from None
            except StoreError as err:
                raise CallRefusedError(grpc.StatusCode.UNAVAILABLE, f"state store unavailable: {err}") from None
            return Caller(identity, via, credential, rid)
        if peer.kind is Kind.GATEWAY:
            principal = forwarding.principal_from(md.get(forwarding.ON_BEHALF_OF, ""))
            if not principal:  # the gateway itself, for the one right it holds (roles.GATEWAY_PROBE)
                asks_itself = (rule.verb, rule.resource) == GATEWAY_PROBE
                return Caller(peer, "", "certificate", rid) if asks_itself else Caller(ANONYMOUS, via, "none", rid)
            groups = forwarding.groups_from(md.get(forwarding.ON_BEHALF_OF_GROUPS, ""))
            return Caller(from_subject(principal, groups), via, "certificate", rid)
        return Caller(peer, "", "certificate", rid)

    def _guarded(self, method: str, rule: Rule | None, behavior: Behavior) -> Behavior:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if rule is None:
                await abort(context, grpc.StatusCode.PERMISSION_DENIED, f"{method} has no authorization rule")
            try:
                caller = await self.resolve(context, rule)
            except CallRefusedError as err:
                if rule.audited:  # as whom is unknown: the peer, or through a gateway nobody
                    peer = peer_of(context)
                    who = Caller(ANONYMOUS, peer.principal, "token (refused)") if peer.kind is Kind.GATEWAY \
                        else Caller(peer, "", "token (refused)")
                    await self._record(who, method, request, None, err.code.name)
                await abort(context, err.code, str(err))
            refusal = _refusal(caller, method, rule)
            if refusal is not None:
                if rule.audited:
                    await self._record(caller, method, request, None, refusal[0].name)
                await context.abort(*refusal)
            token = CALLER.set(caller)
            response = None
            result = "OK"
            try:
                response = await behavior(request, context)
                return response
            except grpc.aio.AbortError:
                code = context.code()
                result = code.name if isinstance(code, grpc.StatusCode) else "ABORTED"
                raise
            except BaseException as err:
                result = f"ERROR {type(err).__name__}"
                raise
            finally:
                CALLER.reset(token)
                if rule.audited:
                    await self._record(caller, method, request, response, result)

        return call

    def _guarded_stream(self, method: str, rule: Rule, behavior: Callable[..., AsyncIterator[Any]]
                        ) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                caller = await self.resolve(context, rule)
            except CallRefusedError as err:
                await abort(context, err.code, str(err))
            if caller.identity == ANONYMOUS:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    f"{method} needs an identity ({caller.via or 'peer'} forwarded none)")
            decision = decide(caller.identity, rule.verb, rule.resource)
            if not decision.allowed:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"{decision.reason} (needs {rule.verb} on {rule.resource})")
            token = CALLER.set(caller)
            try:
                async for message in behavior(request, context):
                    yield message
            finally:
                with contextlib.suppress(ValueError):  # closed from another context (a cancelled stream)
                    CALLER.reset(token)

        return stream

    async def _record(self, caller: Caller, method: str, request: Any, response: Any, result: str) -> None:
        await self.audit.record({
            "ts": time.time(), "principal": caller.identity.principal, "via": caller.via,
            "credential": caller.credential, "action": method, "object": object_of(request, response),
            "result": result, "requestId": caller.request_id,
        })


def _refusal(caller: Caller, method: str, rule: Rule) -> tuple[grpc.StatusCode, str] | None:
    """Why the caller may not make this call (its status and message), or None when it may."""
    if caller.identity == ANONYMOUS:
        return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs an identity ({caller.via or 'peer'} forwarded none)"
    decision = decide(caller.identity, rule.verb, rule.resource)
    if decision.allowed:
        return None
    return grpc.StatusCode.PERMISSION_DENIED, f"{decision.reason} (needs {rule.verb} on {rule.resource})"
