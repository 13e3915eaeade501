"""The page frame: navigation (what the session's role may see), the signed-in identity, the
live-connection status and the sections a page is made of. A section names the live topics
that make it stale; the browser re-fetches just that section (`?part=<id>`) when one arrives."""

from __future__ import annotations

from dataclasses import dataclass, field

from persys.gateway.dashboard.html import Html, esc, join, tag
from persys.gateway.dashboard.sessions import Session

ASSET_VERSION = "3"


@dataclass(frozen=True, slots=True)
class Section:
    id: str
    body: Html
    topics: tuple[str, ...] = ()  # live topics after which it is re-fetched
    title: str = ""

    def render(self) -> Html:
        heading = tag("h2", self.title) if self.title else Html("")
        return tag("section", heading, self.body, id=self.id, data_live=" ".join(self.topics) or None,
                   aria_live="polite" if self.topics else None)


@dataclass(slots=True)
class Page:
    title: str
    nav: str
    sections: list[Section] = field(default_factory=list)
    topics: tuple[str, ...] = ()  # what the page's live connection carries
    subject: str = ""  # events of one object only (workload/web, node/n1)
    last_event: str = ""  # the newest event id the page shows: the live stream resumes after it
    status: int = 200
    scripts: tuple[str, ...] = ()  # more of the package's own assets, for this page only
    styles: tuple[str, ...] = ()
    inline_styles: bool = False  # xterm.js sets its theme in a <style> element: CSP allows it on that page
    version: int = -1  # the live view's version before the page read it: the stream catches up from it


NAV = (("overview", "/", "Overview", None), ("workloads", "/ui/workloads", "Workloads", None),
       ("apply", "/ui/apply", "Apply", ("apply", "workloads")), ("nodes", "/ui/nodes", "Nodes", None),
       ("topology", "/ui/topology", "Topology", None), ("volumes", "/ui/volumes", "Volumes", None),
       ("buckets", "/ui/buckets", "Buckets", None), ("secrets", "/ui/secrets", "Secrets", None),
       ("events", "/ui/events", "Events", None), ("audit", "/ui/audit", "Audit", ("list", "audit")))


def csrf_field(session: Session) -> Html:
    return tag("input", type="hidden", name="csrf", value=session.csrf)


def action_button(session: Session, action: str, label: str, danger: bool = False, confirm: str = "",
                  fields: dict[str, str] | None = None) -> Html:
    """A one-button form POSTing to `action` with the session's CSRF token."""
    hidden = join(tag("input", type="hidden", name=k, value=v) for k, v in (fields or {}).items())
    return tag("form", csrf_field(session), hidden,
               tag("button", label, type="submit", class_="danger" if danger else None),
               method="post", action=action, class_="inline", data_confirm=confirm or None)


def document(page: Page, session: Session | None) -> Html:
    links = []
    if session is not None:
        for key, href, label, needs in NAV:
            if needs is not None and not session.can(*needs):
                continue
            links.append(tag("li", tag("a", label, href=href,
                                       aria_current="page" if key == page.nav else None)))
    who = Html("")
    if session is not None:
        role = ", ".join(session.roles) or "no role"
        who = tag("div", tag("span", session.identity.principal, class_="principal"),
                  tag("span", role, class_="badge role"), tag("span", "connecting", id="live-state", class_="live",
                                                               role="status"),
                  tag("form", csrf_field(session), tag("button", "Sign out", type="submit"),
                      method="post", action="/ui/signout", class_="inline"), class_="who")
    body = join(s.render() for s in page.sections)
    return Html("<!doctype html>" + tag(
        "html",
        tag("head", tag("meta", charset="utf-8"),
            tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
            tag("title", f"{page.title} · Persys"),
            tag("link", rel="stylesheet", href=f"/ui/static/app.css?v={ASSET_VERSION}"),
            *(tag("link", rel="stylesheet", href=f"/ui/static/{s}?v={ASSET_VERSION}") for s in page.styles),
            tag("script", src=f"/ui/static/app.js?v={ASSET_VERSION}", defer=True),
            *(tag("script", src=f"/ui/static/{s}?v={ASSET_VERSION}", defer=True) for s in page.scripts)),
        tag("body",
            tag("a", "Skip to content", href="#main", class_="skip"),
            tag("header", tag("a", "Persys", href="/", class_="brand"),
                tag("nav", tag("ul", *links), aria_label="Main") if links else Html(""), who),
            tag("div", "", id="gap", role="alert", hidden=True),
            tag("main", tag("h1", page.title), body, id="main", tabindex="-1"),
            data_topics=",".join(page.topics) or None, data_subject=page.subject or None,
            data_last_event=page.last_event or None, data_version=str(page.version)),
        lang="en"))


def error_page(title: str, message: str, session: Session | None, status: int) -> tuple[Html, int]:
    page = Page(title, "", [Section("error", tag("p", esc(message), class_="error", role="alert"))], status=status)
    return document(page, session), status
