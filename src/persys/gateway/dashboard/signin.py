"""Signing in and out: an API token typed once (checked by the scheduler: WhoAmI), or the
client certificate the browser presented on this connection. The session cookie is HttpOnly
(no script reads it), Secure (HTTPS only), SameSite=Strict (no other site's page sends it)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from persys.client import SchedulerError
from persys.gateway.dashboard.html import Html, tag
from persys.gateway.dashboard.layout import Page, Section, document
from persys.gateway.dashboard.sessions import COOKIE, SESSION_SECONDS
from persys.gateway.dashboard.web import Dashboard, Refused, html_answer, read_form, safe_next, same_origin
from persys.security import forwarding
from persys.security.identity import Kind, from_subject

TOKEN_MAX_CHARS = 512


def _form(nxt: str, cert_principal: str | None, message: str = "") -> Html:
    cert = Html("")
    if cert_principal:
        cert = tag("form", tag("input", type="hidden", name="next", value=nxt),
                   tag("input", type="hidden", name="method", value="certificate"),
                   tag("button", f"Sign in as {cert_principal} (client certificate)", type="submit"),
                   method="post", action="/ui/signin", class_="card")
    return tag("div",
               tag("p", message, class_="error", role="alert") if message else Html(""),
               tag("form",
                   tag("label", "API token", for_="token"),
                   tag("input", type="password", id="token", name="token", autocomplete="off", required=True,
                       maxlength=str(TOKEN_MAX_CHARS), autofocus=True),
                   tag("input", type="hidden", name="next", value=nxt),
                   tag("p", "Create one with: persysctl auth token create <name> --role viewer|operator|admin",
                       class_="muted"),
                   tag("button", "Sign in", type="submit"), method="post", action="/ui/signin", class_="card"),
               cert, class_="signin")


Answer = Callable[[str, Request, str, int], Response]


async def _signin(dash: Dashboard, request: Request, page: Answer) -> Response:
    if not same_origin(request):
        return page("/", request, "cross-site sign-in refused", 403)
    try:
        form = await read_form(request)
    except Refused as err:
        return page("/", request, err.message, err.status)
    nxt = safe_next(form.get("next", "/"))
    if form.get("method") == "certificate":
        identity = dash.peer_identity(request)
        if identity is None or identity.kind is not Kind.USER:
            return page(nxt, request, "this connection presented no user certificate", 401)
        session = dash.sessions.new(identity, None, "certificate")
    else:
        token = form.get("token", "").strip()
        if not token or len(token) > TOKEN_MAX_CHARS:
            return page(nxt, request, f"token: 1 to {TOKEN_MAX_CHARS} characters", 400)
        try:
            me = await dash.client.whoami(metadata=forwarding.metadata_for(None, token, uuid.uuid4().hex))
        except SchedulerError as err:
            return page(nxt, request, f"sign-in refused: {err.message}", 401 if err.code == "UNAUTHENTICATED" else 503)
        identity = from_subject(me["principal"], tuple(me["groups"]))
        if identity.kind is not Kind.USER:
            return page(nxt, request, "sign-in refused: not a user token", 401)
        session = dash.sessions.new(identity, token, str(me.get("credential", "token")))
    answer = RedirectResponse(nxt, status_code=303)
    answer.set_cookie(COOKIE, session.sid, max_age=int(SESSION_SECONDS), path="/", secure=True, httponly=True,
                      samesite="strict")
    return answer


def signin_routes(dash: Dashboard) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    def page(nxt: str, request: Request, message: str = "", status: int = 200) -> Response:
        peer = dash.peer_identity(request)
        principal = peer.principal if peer is not None and peer.kind is Kind.USER else None
        body = _form(safe_next(nxt), principal, message)
        return html_answer(document(Page("Sign in", "", [Section("signin", body)]), None), status)

    @router.get("/ui/signin")
    async def signin_page(request: Request) -> Response:
        return page(request.query_params.get("next", "/"), request)

    @router.post("/ui/signin")
    async def signin(request: Request) -> Response:
        return await _signin(dash, request, page)

    @router.post("/ui/signout")
    async def signout(request: Request) -> Response:
        session = dash.session_of(request)
        if session is not None and same_origin(request):
            try:
                form = await read_form(request)
            except Refused:
                form = {}
            if session.csrf_ok(form.get("csrf", "")):
                dash.sessions.drop(session.sid)
        answer = RedirectResponse("/ui/signin", status_code=303)
        answer.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return answer

    return router
