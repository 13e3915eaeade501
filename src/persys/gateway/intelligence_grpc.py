"""Persys Intelligence over gRPC (proto/persys/v1/intelligence.proto), served by the gateway on
its own port (`persys gateway --grpc-listen`): the same answers as the REST routes, from the same
`IntelligenceApi` (one investigation record for both).

Who calls is checked as the scheduler's gRPC API checks it (scheduler/rpc/authorization.py): mutual
TLS at the handshake (a client certificate of the cluster's CA, or no connection), then a bearer
token in the `authorization` metadata if there is one (asked of the scheduler, which keeps
tokens; failed attempts limited per source), else the certificate's identity. The method's rule is
in security.permissions (GATEWAY_RPC_RULES, the REST route's rule) and the roles decide: viewers may
call every method; a node, scheduler or gateway certificate holds no client rights
(PERMISSION_DENIED), nobody at all is UNAUTHENTICATED. The answer's reads are made as the
intelligence identity (viewer rights), whoever asked; the caller is forwarded only so the
investigation record says who asked."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from cryptography import x509

from persys._pb.persys.v1 import intelligence_pb2 as ipb
from persys._pb.persys.v1 import intelligence_pb2_grpc as ipb_grpc
from persys.client import SchedulerClient, SchedulerError
from persys.gateway.token_failures import TokenFailures
from persys.intelligence.api import MAX_NAME, BadInput, IntelligenceApi
from persys.security import forwarding
from persys.security.grpc_tls import server_credentials, server_options
from persys.security.identity import Identity, Kind, from_certificate, from_subject
from persys.security.permissions import GATEWAY_RPC_RULES, INTELLIGENCE
from persys.security.roles import decide
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)

TOKEN_CACHE_SECONDS = 2.0
TOKEN_CACHE_MAX = 1024
Handler = Callable[[], Awaitable[Any]]


def _code(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)


def _name(value: str, field: str, required: bool = True) -> str:
    if (required and not value) or len(value) > MAX_NAME or any(c in value for c in "/\\\n\r\t "):
        raise BadInput(f"{field}: a name of 1-{MAX_NAME} characters without '/', spaces or control characters "
                       "is required")
    return value


class Callers:
    """The identity of a call: token (through the scheduler, cached briefly) or certificate."""

    def __init__(self, client: SchedulerClient) -> None:
        self.client = client
        self._tokens: dict[str, tuple[float, Identity]] = {}
        self.failures = TokenFailures()

    async def identify(self, context: grpc.aio.ServicerContext, rid: str) -> tuple[Identity, str | None]:
        md = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        source = context.peer().rpartition(":")[0] or context.peer()
        auth = md.get("authorization", "")
        if auth:
            if wait := self.failures.retry_after(source, time.monotonic()):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"too many failed bearer-token attempts from {source}: try again in {wait} s")
            scheme, _, token = auth.partition(" ")
            try:
                if scheme.lower() != "bearer" or not token.strip():
                    raise SchedulerError("UNAUTHENTICATED", "authorization: expected 'Bearer <token>'")
                return await self._token_identity(token.strip(), rid), token.strip()
            except SchedulerError as err:
                if err.code == "UNAUTHENTICATED":
                    self.failures.failed(source, time.monotonic())
                await context.abort(_code(err.code), err.message)
        pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        if not pem:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "authentication required: a client certificate or a bearer token")
        return from_certificate(x509.load_pem_x509_certificate(pem)), None

    async def _token_identity(self, token: str, rid: str) -> Identity:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._tokens.get(key)
        if hit and hit[0] > now:
            return hit[1]
        me = await self.client.whoami(metadata=forwarding.metadata_for(None, token, rid))
        identity = from_subject(me["principal"], tuple(me["groups"]))
        if identity.kind is not Kind.USER:
            raise SchedulerError("UNAUTHENTICATED", "token refused")
        if len(self._tokens) >= TOKEN_CACHE_MAX:
            self._tokens.clear()
        self._tokens[key] = (now + TOKEN_CACHE_SECONDS, identity)
        return identity


class IntelligenceService(ipb_grpc.IntelligenceServicer):
    def __init__(self, api: IntelligenceApi, client: SchedulerClient) -> None:
        self.api = api
        self.callers = Callers(client)

    async def _serve(self, method: str, context: grpc.aio.ServicerContext, run: Handler) -> ipb.IntelligenceAnswer:
        rid = uuid.uuid4().hex
        rule = GATEWAY_RPC_RULES[INTELLIGENCE + method]
        identity, token = await self.callers.identify(context, rid)
        decision = decide(identity, rule.verb, rule.resource)
        if not decision.allowed:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{decision.reason} (needs {rule.verb} on {rule.resource})")
        forwarded = forwarding.forward(forwarding.metadata_for(identity, token, rid))
        try:
            answer = await run()
        except BadInput as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except SchedulerError as err:
            await context.abort(_code(err.code), err.message)
        finally:
            forwarding.reset(forwarded)
        return ipb.IntelligenceAnswer(json=json.dumps(answer, default=str).encode())

    async def WhyWorkload(self, request: ipb.WhyRequest, context: grpc.aio.ServicerContext) -> ipb.IntelligenceAnswer:
        return await self._serve("WhyWorkload", context,
                                 lambda: self.api.why_workload(_name(request.name, "name"), request.narrate))

    async def WhyNode(self, request: ipb.WhyRequest, context: grpc.aio.ServicerContext) -> ipb.IntelligenceAnswer:
        return await self._serve("WhyNode", context,
                                 lambda: self.api.why_node(_name(request.name, "name"), request.narrate))

    async def WhyCluster(self, request: ipb.WhyRequest, context: grpc.aio.ServicerContext) -> ipb.IntelligenceAnswer:
        async def run() -> dict[str, Any]:
            if request.name:
                raise BadInput("name: WhyCluster takes no name")
            return await self.api.why_cluster(request.narrate)

        return await self._serve("WhyCluster", context, run)

    async def ListInvestigations(self, request: ipb.ListInvestigationsRequest, context: grpc.aio.ServicerContext
                                 ) -> ipb.IntelligenceAnswer:
        async def run() -> dict[str, Any]:
            flags = {"": None, "true": True, "false": False}
            if request.inconclusive not in flags:
                raise BadInput("inconclusive: true, false or empty")
            return {"items": self.api.investigations(request.subject, flags[request.inconclusive],
                                                     request.limit or 100)}

        return await self._serve("ListInvestigations", context, run)

    async def Insights(self, request: ipb.InsightsRequest, context: grpc.aio.ServicerContext
                       ) -> ipb.IntelligenceAnswer:
        return await self._serve("Insights", context, self.api.insights)

    async def Rightsize(self, request: ipb.RightsizeRequest, context: grpc.aio.ServicerContext
                        ) -> ipb.IntelligenceAnswer:
        return await self._serve("Rightsize", context, lambda: self.api.rightsize(
            _name(request.workload, "workload"), request.since or "7d"))

    async def Forecast(self, request: ipb.ForecastRequest, context: grpc.aio.ServicerContext
                       ) -> ipb.IntelligenceAnswer:
        async def run() -> dict[str, Any]:
            kind = "node" if request.node else "cluster"
            return await self.api.forecast(kind, _name(request.node, "node", required=False), request.metric or "cpu",
                                           request.since or "14d", request.horizon or "1d")

        return await self._serve("Forecast", context, run)


async def start_intelligence_grpc(api: IntelligenceApi, client: SchedulerClient, tls: TLSFiles, listen: str
                                  ) -> tuple[grpc.aio.Server, int]:
    """Serve on `listen` (host:port, port 0: the kernel picks) with the gateway's certificate,
    mutual TLS (security.grpc_tls, as the scheduler's port). The TLS files are read once: a renewed
    gateway certificate reaches this listener at the next start."""
    server = grpc.aio.server(options=server_options())
    ipb_grpc.add_IntelligenceServicer_to_server(IntelligenceService(api, client), server)
    port = server.add_secure_port(listen, server_credentials(tls))
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    log.info("intelligence gRPC on %s (port %d)", listen, port)
    return server, port
