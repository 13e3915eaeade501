"""Events: one row's markup (the pages and the live stream render rows alike) and the timeline
with filters (kind, object, node, since), as GET /v1/events filters them."""

from __future__ import annotations

import time
from collections.abc import Mapping

from persys.events.filters import FilterError, keep_last, make_filter, parse_since
from persys.gateway.dashboard.html import Html, esc, join, tag, when
from persys.gateway.dashboard.layout import Page, Section
from persys.gateway.dashboard.web import Ctx, Refused

MAX_EVENTS = 10_000  # the scheduler's bound on one listing
SHOWN = 200


def subject_link(subject: str) -> Html:
    kind, _, name = subject.partition("/")
    if kind == "workload" and name:
        return tag("a", subject, href=f"/ui/workloads/{name}")
    if kind == "node" and name:
        return tag("a", subject, href=f"/ui/nodes/{name}")
    return esc(subject)


def event_row(e: Mapping[str, object]) -> Html:
    ts = float(str(e.get("ts", 0) or 0))
    return tag("tr", tag("td", tag("time", when(ts), datetime=str(ts))), tag("td", e.get("kind", "")),
               tag("td", subject_link(str(e.get("subject", "")))), tag("td", e.get("reason", "")),
               tag("td", e.get("message", "")), data_event=str(e.get("id", "")))


def event_table(events: list[Mapping[str, object]], table_id: str = "events-table") -> Html:
    """Newest first; the live stream prepends rows to every table marked data-events."""
    rows = join(event_row(e) for e in reversed(events))
    head = tag("tr", *(tag("th", h, scope="col") for h in ("Time (UTC)", "Kind", "Object", "Reason", "Message")))
    return tag("div", tag("table", tag("thead", head), tag("tbody", rows), id=table_id, data_events=True),
               class_="scroll")


async def recent(ctx: Ctx, limit: int, subject: str = "") -> list[Mapping[str, object]]:
    if not ctx.session.can("list", "events"):
        return []
    return list(await ctx.client.events(limit, subject))


async def events_page(ctx: Ctx) -> Page:
    ctx.require("list", "events")
    kind, subject, node, since = ctx.arg("kind"), ctx.arg("subject", 512), ctx.arg("node"), ctx.arg("since", 64)
    try:
        flt = make_filter([kind] if kind else [], subject, node)
        after = parse_since(since, time.time()) if since else 0.0
    except FilterError as err:
        raise Refused(400, str(err)) from None
    filtered = bool(kind or node or since)
    docs = await ctx.client.events(MAX_EVENTS if filtered else SHOWN, subject)
    shown = keep_last(docs, flt, after, SHOWN) if filtered else docs
    form = tag("form", *(tag("label", label, tag("input", name=name, value=value, placeholder=hint))
                         for label, name, value, hint in (
                             ("Kind", "kind", kind, "WorkloadScheduled,NodeReady"),
                             ("Object", "subject", subject, "workload/web"), ("Node", "node", node, "n1"),
                             ("Since", "since", since, "10m, 2h, 1d"))),
               tag("button", "Filter", type="submit"), method="get", class_="filters")
    live = not filtered  # new events arrive in the table only when nothing filters them away
    last = str(docs[-1]["id"]) if docs else ""
    note = tag("p", "New events appear at the top as they happen." if live else
               "Filtered: reload for newer events.", class_="muted")
    return Page("Events", "events", [Section("filters", form), Section("timeline", note + event_table(list(shown)))],
                topics=("events",) if live else (), subject=subject, last_event=last)
