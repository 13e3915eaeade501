"""What every dashboard request goes through: its session (cookie), the caller forwarded to the
scheduler as that session's identity (its API token, or its certificate's identity), the
refusals, and the answer (a whole page, or one section of it for a live refresh).

Mutations are forms POSTed with the session's CSRF token and a same-origin `Origin`; the role
rules of the REST API (security.permissions, security.roles) decide before anything is called,
a refusal is recorded in the audit log as the REST middleware records its own, and the scheduler
checks and audits the call itself, as the signed-in identity."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import Scope

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.authorization import PEER_CERT, Caller, _identity_of_der
from persys.gateway.dashboard.cluster_view import ClusterView
from persys.gateway.dashboard.html import tag
from persys.gateway.dashboard.layout import Page, document, error_page
from persys.gateway.dashboard.sessions import COOKIE, Session, SessionStore
from persys.gateway.dashboard.stale import Stale
from persys.security import forwarding
from persys.security.identity import Identity

log = logging.getLogger(__name__)
FORM_MAX_FIELDS = 32
HTTP_OF = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "ABORTED": 409,
           "FAILED_PRECONDITION": 409, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401, "UNAVAILABLE": 503,
           "DEADLINE_EXCEEDED": 504, "RESOURCE_EXHAUSTED": 413}
_PART = re.compile(r"^[a-z0-9-]{1,40}$")
MAX_PARTS = 20


class Refused(Exception):
    """A dashboard request answered with an error page (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Ctx:
    request: Request
    session: Session
    dash: Dashboard
    rid: str

    @property
    def client(self) -> SchedulerClient:
        return self.dash.client

    def arg(self, name: str, limit: int = 253) -> str:
        value = self.request.query_params.get(name, "")
        if len(value) > limit:
            raise Refused(400, f"{name}: at most {limit} characters")
        return value.strip()

    def require(self, verb: str, resource: str) -> None:
        if not self.session.can(verb, resource):
            raise Refused(403, f"{self.session.identity.principal} may not {verb} {resource}")

    async def cluster(self) -> ClusterView:
        """The shared view of workloads and nodes, started with this session's credentials if
        it is not running (every use checks the session's own role first)."""
        self.require("list", "workloads")
        self.require("list", "nodes")
        await self.dash.view.ensure(self.dash.metadata(self.session, self.rid))
        return self.dash.view


class Dashboard:
    def __init__(self, client: SchedulerClient) -> None:
        self.client = client
        self.sessions = SessionStore()
        self.view = ClusterView(client)
        # The overview's health and last events: shown up to a minute old rather than waited for
        # when the scheduler is slow (stale.py); one copy per gateway, role checked per session.
        self.health_copy: Stale[dict[str, Any]] = Stale()
        self.events_copy: Stale[list[Mapping[str, object]]] = Stale()

    @staticmethod
    def metadata(session: Session, rid: str) -> forwarding.Metadata:
        return forwarding.metadata_for(session.identity, session.token, rid)

    @staticmethod
    def peer_identity(request: Request) -> Identity | None:
        der = (request.scope.get("state") or {}).get(PEER_CERT)
        return _identity_of_der(der) if der else None

    def session_of(self, request: Request) -> Session | None:
        s = self.sessions.get(request.cookies.get(COOKIE, "")[:100])
        if s is None:
            return None
        if s.token is None:  # a certificate session is valid only on a connection presenting that certificate
            peer = self.peer_identity(request)
            if peer is None or peer.principal != s.identity.principal:
                return None
        return s

    def websocket_caller(self, scope: Scope, headers: dict[str, str]) -> Caller | None:
        """The signed-in user of a WebSocket opened by a dashboard page (its terminal): the
        session cookie, from a page of this very origin (a WebSocket is not subject to CORS, so
        the Origin check is what stops another site's page using the cookie; SameSite=Strict
        keeps browsers from sending it there anyway)."""
        origin, host = headers.get("origin", ""), headers.get("host", "")
        if not origin or not host or urlsplit(origin).netloc != host:
            return None
        sid = ""
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                sid = value[:100]
        s = self.sessions.get(sid) if sid else None
        if s is None:
            return None
        if s.token is None:
            der = (scope.get("state") or {}).get(PEER_CERT)
            if not der or _identity_of_der(der).principal != s.identity.principal:
                return None
        return Caller(s.identity, s.token, s.credential)

    async def serve(self, request: Request, build: Callable[[Ctx], Awaitable[Page]]) -> Response:
        """A page (or, with `part`, one of its sections) for the signed-in session."""
        session = self.session_of(request)
        if session is None:
            return to_signin(request)
        rid = uuid.uuid4().hex
        ctx = Ctx(request, session, self, rid)
        version = self.view.version  # before anything is read: a change after it reaches the page live
        token = forwarding.forward(self.metadata(session, rid))
        try:
            page = await build(ctx)
            page.version = version
        except Refused as err:
            return html_answer(*error_page("Refused" if err.status == 403 else "Error", err.message, session,
                                           err.status))
        except SchedulerError as err:
            return self._scheduler_refusal(request, session, err)
        finally:
            forwarding.reset(token)
        part = request.query_params.get("part", "")
        if part:  # live refreshes: the sections asked for (a,b,c), from one build of the page
            wanted = part.split(",")
            if len(wanted) > MAX_PARTS or not all(_PART.match(w) for w in wanted):
                return HTMLResponse("bad part", status_code=400)
            found = [s.render() for s in page.sections if s.id in wanted]
            if not found:
                return HTMLResponse("no such part", status_code=404)
            return HTMLResponse("".join(found), headers=NO_STORE)
        answer = html_answer(document(page, session), page.status)
        if page.inline_styles:
            answer.headers["content-security-policy"] = CSP_INLINE_STYLES
        return answer

    async def act(self, request: Request, verb: str, resource: str,
                  do: Callable[[Ctx, dict[str, str]], Awaitable[Response]]) -> Response:
        """A mutation: session, same origin, CSRF token, role; then `do`, as the session."""
        session = self.session_of(request)
        if session is None:
            return to_signin(request)
        rid = uuid.uuid4().hex
        if not same_origin(request):
            return html_answer(*error_page("Refused", "cross-site request refused", session, 403))
        try:
            form = await read_form(request)
        except Refused as err:
            return html_answer(*error_page("Error", err.message, session, err.status))
        if not session.csrf_ok(form.get("csrf", "")):
            return html_answer(*error_page("Refused", "the form's CSRF token is missing or stale: reload the page",
                                           session, 403))
        if not session.can(verb, resource):
            await self._audit_refusal(session, request, rid)
            return html_answer(*error_page(
                "Refused", f"{session.identity.principal} may not {verb} {resource}", session, 403))
        ctx = Ctx(request, session, self, rid)
        token = forwarding.forward(self.metadata(session, rid))
        try:
            return await do(ctx, form)
        except Refused as err:
            return html_answer(*error_page("Error", err.message, session, err.status))
        except SchedulerError as err:
            return self._scheduler_refusal(request, session, err)
        finally:
            forwarding.reset(token)

    def _scheduler_refusal(self, request: Request, session: Session, err: SchedulerError) -> Response:
        if err.code == "UNAUTHENTICATED" and session.token is not None:
            self.sessions.drop_token(session.token)  # revoked or expired: sign in again
            return to_signin(request)
        status = HTTP_OF.get(err.code, 502)
        return html_answer(*error_page("Refused" if status == 403 else "Error", err.message, session, status))

    async def _audit_refusal(self, session: Session, request: Request, rid: str) -> None:
        """Recorded as the REST middleware records a refusal (persys.gateway.authorization)."""
        try:
            await self.client.record_audit({
                "principal": session.identity.principal, "credential": session.credential,
                "action": f"POST {request.url.path[:200]}",
                "object": {"path": request.url.path[:200], "via": "dashboard"},
                "result": "403", "requestId": rid})
        except SchedulerError as err:
            log.warning("audit: could not record a dashboard refusal: %s", err.message)


NO_STORE = {"cache-control": "no-store"}
# Nothing but this gateway's own assets: no inline script, no other origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
CSP_INLINE_STYLES = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
PAGE_HEADERS = {**NO_STORE, "content-security-policy": CSP, "x-content-type-options": "nosniff",
                "referrer-policy": "same-origin", "x-frame-options": "DENY"}


def html_answer(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)


def safe_next(value: str) -> str:
    """A path on this site only (never //host or a scheme: no open redirect)."""
    if not value.startswith("/") or value.startswith("//") or "\\" in value or len(value) > 1000:
        return "/"
    parts = urlsplit(value)
    return value if not parts.scheme and not parts.netloc else "/"


def to_signin(request: Request) -> Response:
    if request.method != "GET" or request.query_params.get("part"):
        return HTMLResponse(tag("p", "signed out"), status_code=401, headers={"x-persys-signin": "/ui/signin"})
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/signin?next={quote(safe_next(target), safe='')}", status_code=303)


def same_origin(request: Request) -> bool:
    """`Origin` (sent by browsers with every POST) names this host; absent: refused."""
    origin = request.headers.get("origin", "")
    host = request.headers.get("host", "")
    return bool(origin and host) and urlsplit(origin).netloc == host


async def read_form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (its size bounded by the gateway's body limit)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip()
    if ctype != "application/x-www-form-urlencoded":
        raise Refused(415, "expected a form (application/x-www-form-urlencoded)")
    try:
        raw = (await request.body()).decode()
        fields = parse_qs(raw, keep_blank_values=True, max_num_fields=FORM_MAX_FIELDS, strict_parsing=False)
    except (UnicodeDecodeError, ValueError) as err:
        raise Refused(400, f"unreadable form: {err}") from None
    return {k: v[-1] for k, v in fields.items()}


def see_other(path: str) -> Response:
    return RedirectResponse(safe_next(path), status_code=303)

