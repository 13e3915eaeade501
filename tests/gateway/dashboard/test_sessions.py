"""Sessions and the dashboard's small guards, without a server: the session store's expiry and
bound, CSRF comparison, role checks by identity, where a sign-in may send the browser next, and
the HTML builder's escaping."""

from __future__ import annotations

import pytest

from persys.gateway.dashboard import html
from persys.gateway.dashboard.sessions import SessionStore
from persys.gateway.dashboard.web import safe_next
from persys.security.identity import from_subject

VIEWER = from_subject("user:ann", ("persys:viewers",))
OPERATOR = from_subject("user:bob", ("persys:operators",))


def test_a_session_expires_and_the_store_stays_bounded() -> None:
    store = SessionStore(seconds=-1)
    s = store.new(VIEWER, "tok", "token:1")
    assert store.get(s.sid) is None  # already expired
    store = SessionStore(limit=3)
    made = [store.new(VIEWER, f"t{i}", "token") for i in range(5)]
    assert store.get(made[0].sid) is None and store.get(made[4].sid) is not None
    assert sum(store.get(m.sid) is not None for m in made) == 3


def test_a_refused_token_ends_every_session_signed_in_with_it() -> None:
    store = SessionStore()
    a, b, c = store.new(VIEWER, "same", "token"), store.new(VIEWER, "same", "token"), store.new(OPERATOR, "other", "t")
    store.drop_token("same")
    assert store.get(a.sid) is None and store.get(b.sid) is None and store.get(c.sid) is not None


def test_csrf_and_roles() -> None:
    s = SessionStore().new(VIEWER, None, "certificate")
    assert s.csrf_ok(s.csrf) and not s.csrf_ok("") and not s.csrf_ok(s.csrf[:-1])
    assert s.can("list", "workloads") and not s.can("apply", "workloads") and not s.can("list", "audit")
    op = SessionStore().new(OPERATOR, "t", "token")
    assert op.can("apply", "workloads") and op.can("drain", "nodes") and not op.can("list", "audit")
    assert len({s.sid, s.csrf, op.sid, op.csrf}) == 4 and len(s.sid) >= 40


@pytest.mark.parametrize(("asked", "sent"), [
    ("/ui/workloads?phase=Running", "/ui/workloads?phase=Running"), ("/", "/"),
    ("//evil.example/x", "/"), ("https://evil.example/", "/"), ("/\\evil.example", "/"), ("", "/"),
    ("javascript:alert(1)", "/"), ("/" + "a" * 2000, "/"),
])
def test_where_a_sign_in_may_go_next(asked: str, sent: str) -> None:
    assert safe_next(asked) == sent


def test_html_escapes_what_it_did_not_make() -> None:
    name = '<script>alert("x")</script>'
    out = html.tag("td", name, title=name, data_x='"><b>')
    assert "<script>" not in out and "&lt;script&gt;" in out and 'data-x="&quot;&gt;&lt;b&gt;"' in out
    assert html.tag("p", html.tag("b", "ok")) == "<p><b>ok</b></p>"
    assert html.Html("<i>") + "<b>" == "<i>&lt;b&gt;"
    assert html.tag("input", disabled=True, hidden=False, value=None) == "<input disabled>"
