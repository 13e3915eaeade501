"""Who calls the REST API, and may they: one ASGI middleware in front of every route.

The caller is the bearer token in `Authorization` (checked by the scheduler: WhoAmI, cached for
`TOKEN_CACHE_SECONDS`), else the verified client certificate of the connection (uvicorn does not
hand it to the app, so `PeerCertProtocol` puts it in the request's state). The route's rule
(security.permissions) and the roles (security.roles) decide; a refusal is 401 (no identity) or
403 with a JSON body naming the verb and resource, before the route runs, so nothing is written.
Allowed requests go on with the caller forwarded to the scheduler (security.forwarding), which
checks again. Every response carries `x-request-id`, the id the audit records name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cryptography import x509
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.token_failures import TokenFailures
from persys.security import forwarding
from persys.security.identity import Identity, Kind, from_certificate, from_subject
from persys.security.permissions import PUBLIC_ROUTES, Rule, rest_rule
from persys.security.roles import decide

log = logging.getLogger(__name__)

PEER_CERT = "persys_peer_cert"  # the connection's verified client certificate (DER), in scope["state"]
# What a route the gateway records itself (`at_gateway`) adds to its audit record, in scope["state"]
# (request.state): e.g. the command line of an exec.
AUDIT_DETAIL = "persys_audit_detail"
TOKEN_CACHE_SECONDS = 2.0
TOKEN_CACHE_MAX = 1024
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
DASHBOARD_PREFIX = "/ui/"


def is_dashboard_path(path: str) -> bool:
    """The web console's pages (gateway/dashboard): it checks its own sessions (a cookie, not a
    token or certificate on every call) against the same role rules."""
    return path == "/" or path.startswith(DASHBOARD_PREFIX)


class PeerCertProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (what "auto" picks without httptools), also putting the
    connection's client certificate into every request's scope state."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        self.app_state = {**self.app_state, PEER_CERT: der}


@lru_cache(maxsize=1024)
def _identity_of_der(der: bytes) -> Identity:
    return from_certificate(x509.load_der_x509_certificate(der))


_ANSWER_STARTS = ("http.response.start", "websocket.http.response.start", "websocket.accept")


def _status_of(message: Message) -> int | None:
    """The HTTP status an ASGI message answers with, if it is the answer's start."""
    kind = message["type"]
    if kind in ("http.response.start", "websocket.http.response.start"):
        return int(message["status"])
    if kind == "websocket.accept":
        return 101
    if kind == "websocket.close":
        return 403  # closed before accepting (after, the accept's 101 was first): a handshake refusal
    return None


@dataclass(frozen=True, slots=True)
class Caller:
    identity: Identity
    token: str | None
    credential: str


def _json(status: int, body: dict[str, Any], request_id: str, extra: tuple[tuple[bytes, bytes], ...] = ()
          ) -> tuple[Message, Message]:
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
               (b"x-request-id", request_id.encode()), *extra]
    return ({"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": raw})


class RouteTable:
    """Path templates by method, from the app's OpenAPI paths: its complete route list, also
    of included routers (FastAPI keeps those behind a lazy wrapper in `app.routes`)."""

    def __init__(self, paths: dict[str, dict[str, Any]]) -> None:
        self.entries: list[tuple[str, re.Pattern[str], str, int]] = []
        for template, ops in paths.items():
            pattern = re.compile("^" + "".join(
                "[^/]+" if part.startswith("{") else re.escape(part)
                for part in re.split(r"(\{[^}]+\})", template)) + "$")
            literal = len(re.sub(r"\{[^}]+\}", "", template))
            for method in ops:
                self.entries.append((method.upper(), pattern, template, literal))

    def match(self, method: str, path: str) -> tuple[str | None, bool]:
        """The template `path` goes to with `method` (the most literal one if several match),
        and whether any template matches `path` at all (else 404; with no method, 405)."""
        method = "GET" if method == "HEAD" else method
        best: tuple[int, str] | None = None
        any_method = False
        for m, pattern, template, literal in self.entries:
            if pattern.match(path):
                any_method = True
                if m == method and (best is None or literal > best[0]):
                    best = (literal, template)
        return (best[1] if best else None), any_method


# A WebSocket from the dashboard's pages (its browser terminal) carries the dashboard's session
# cookie, not a token: this finds the session's caller (None: no such session), set by the dashboard.
SessionCaller = Callable[[Scope, dict[str, str]], "Caller | None"]


class Authorization:
    def __init__(self, app: ASGIApp, client: SchedulerClient, paths: Callable[[], dict[str, dict[str, Any]]],
                 session_caller: SessionCaller | None = None) -> None:
        self.app = app
        self.client = client
        self.paths = paths
        self.session_caller = session_caller
        self._table: RouteTable | None = None
        self._tokens: dict[str, tuple[float, Identity, str]] = {}
        self._token_failures = TokenFailures()

    def match(self, method: str, path: str) -> tuple[str | None, bool]:
        if self._table is None:
            self._table = RouteTable(self.paths())
        return self._table.match(method, path)

    @staticmethod
    def public(method: str, path: str) -> bool:
        return (("GET" if method == "HEAD" else method), path) in PUBLIC_ROUTES \
            or (method in ("GET", "HEAD") and path.startswith("/static-offline-docs/")) \
            or is_dashboard_path(path)  # the dashboard checks its own sessions (dashboard/web.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        # A WebSocket (an interactive terminal) is a GET that upgrades: the same rules, and a
        # refusal is the same HTTP answer, sent as the handshake's denial.
        websocket = scope["type"] == "websocket"
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rid = headers.get("x-request-id", "")
        rid = rid if _REQUEST_ID.match(rid) else uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] in _ANSWER_STARTS:
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        async def answer(refusal: tuple[Message, Message]) -> None:
            for message in refusal:
                await send({**message, "type": "websocket." + message["type"]} if websocket else message)

        method = "GET" if websocket else scope["method"]
        if not websocket and self.public(method, scope["path"]):
            await self.app(scope, receive, send_with_id)
            return
        template, exists = self.match(method, scope["path"])
        if template is None:  # no documented route: nothing an undocumented route serves is reachable
            await answer(_json(405 if exists else 404, {"error": f"no route {method} {scope['path'][:200]}",
                                                        "problems": []}, rid))
            return
        rule = rest_rule(method, template) or Rule("call", f"{method} {template}")  # unknown: no role grants it
        caller = await self._check(scope, method, headers, rule, rid, template)
        if not isinstance(caller, Caller):  # refused: the answer, sent before anything is read
            await answer(caller)
            return
        await self._serve(scope, receive, send_with_id, caller, rule, method, template, rid)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, caller: Caller, rule: Rule, method: str,
                     template: str, rid: str) -> None:
        """An allowed request served with the caller's identity forwarded to the scheduler, and
        recorded in the audit log with its status when the rule says so."""
        token = forwarding.forward(forwarding.metadata_for(caller.identity, caller.token, rid))
        status: list[int] = []

        async def observed(message: Message) -> None:
            status[:] = status or [c for c in (_status_of(message),) if c]  # the first status only
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            forwarding.reset(token)
            if rule.audited and rule.at_gateway:
                await self._record(caller.identity.principal, caller.credential, method, template, scope,
                                   str(status[0]) if status else "ERROR", rid)

    async def _check(self, scope: Scope, method: str, headers: dict[str, str], rule: Rule, rid: str,
                     template: str) -> Caller | tuple[Message, Message]:
        """The allowed caller, or the refusal to send."""
        base = {"verb": rule.verb, "resource": rule.resource}
        source = str((scope.get("client") or ("unknown",))[0])
        token_attempt = "authorization" in headers
        if token_attempt and (wait := self._token_failures.retry_after(source, time.monotonic())):
            return _json(429, {"error": f"too many failed bearer-token attempts from {source}: try again in {wait} s",
                               **base}, rid, ((b"retry-after", str(wait).encode()),))
        try:
            caller = await self._caller(scope, headers, rid)
        except SchedulerError as err:
            if err.code == "UNAUTHENTICATED":
                if token_attempt:  # counted and recorded: a guessing source is slowed and seen
                    self._token_failures.failed(source, time.monotonic())
                    await self._record("unauthenticated", "bearer token (refused)", method, template, scope, "401",
                                       rid, {"source": source})
                return _json(401, {"error": err.message, **base}, rid, ((b"www-authenticate", b"Bearer"),))
            return _json(503 if err.code == "UNAVAILABLE" else 502, {"error": err.message, **base}, rid)
        if caller is None:
            return _json(401, {"error": "authentication required: a client certificate or a bearer token",
                               **base}, rid, ((b"www-authenticate", b"Bearer"),))
        decision = decide(caller.identity, rule.verb, rule.resource)
        if not decision.allowed:
            if rule.audited:
                await self._record(caller.identity.principal, caller.credential, method, template, scope, "403",
                                   rid)
            return _json(403, {"error": f"{decision.reason} (needs {rule.verb} on {rule.resource})", **base}, rid)
        return caller

    async def _caller(self, scope: Scope, headers: dict[str, str], rid: str) -> Caller | None:
        auth = headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise SchedulerError("UNAUTHENTICATED", "Authorization: expected 'Bearer <token>'")
            identity, credential = await self._token_identity(token.strip(), rid)
            return Caller(identity, token.strip(), credential)
        if scope["type"] == "websocket" and self.session_caller is not None:
            caller = self.session_caller(scope, headers)
            if caller is not None:
                return caller
        der = (scope.get("state") or {}).get(PEER_CERT)
        if not der:
            return None
        return Caller(_identity_of_der(der), None, "certificate")

    async def _token_identity(self, token: str, rid: str) -> tuple[Identity, str]:
        """Asked of the scheduler (which keeps tokens), remembered briefly: the scheduler checks
        the token itself on every call it serves, so the cache only spares lookups."""
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._tokens.get(key)
        now = time.monotonic()
        if hit and hit[0] > now:
            return hit[1], hit[2]
        me = await self.client.whoami(metadata=forwarding.metadata_for(None, token, rid))
        identity = from_subject(me["principal"], tuple(me["groups"]))
        if identity.kind is not Kind.USER:
            raise SchedulerError("UNAUTHENTICATED", "token refused")
        if len(self._tokens) >= TOKEN_CACHE_MAX:
            self._tokens = {k: v for k, v in self._tokens.items() if v[0] > now}
            if len(self._tokens) >= TOKEN_CACHE_MAX:
                self._tokens.clear()
        self._tokens[key] = (now + TOKEN_CACHE_SECONDS, identity, me["credential"])
        return identity, me["credential"]

    async def _record(self, principal: str, credential: str, method: str, template: str, scope: Scope,
                      result: str, rid: str, extra: dict[str, str] | None = None) -> None:
        """What the scheduler never sees (a refusal here, an upload straight to an agent) is
        recorded through it; a failure to record is logged, not turned into the request's error."""
        detail = {**((scope.get("state") or {}).get(AUDIT_DETAIL) or {}), **(extra or {})}
        try:
            await self.client.record_audit({
                "principal": principal, "credential": credential, "action": f"{method} {template}",
                "object": {"path": scope["path"][:200],
                           "query": scope.get("query_string", b"").decode("latin-1")[:200], **detail},
                "result": result, "requestId": rid})
        except SchedulerError as err:
            log.warning("audit: could not record %s %s by %s: %s", method, template, principal, err.message)


def install(app: Any, client: SchedulerClient, session_caller: SessionCaller | None = None) -> None:
    """Put authorization in front of every route of `app` (outermost: before bodies are read)."""
    app.add_middleware(Authorization, client=client, paths=lambda: app.openapi()["paths"],
                       session_caller=session_caller)
