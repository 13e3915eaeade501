"""The overview: operating mode and the active replica, nodes by status, workloads by phase,
capacity (allocatable vs requested vs used), recent events. Counts come from the gateway's live
view (cluster_view), so the page costs the same at 5,000 nodes as at 5 (bench/dashboard.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from persys.gateway.dashboard import figures
from persys.gateway.dashboard.events_page import event_table, recent
from persys.gateway.dashboard.html import Html, badge, esc, join, mib, tag
from persys.gateway.dashboard.layout import Page, Section
from persys.gateway.dashboard.stale import Answer
from persys.gateway.dashboard.web import Ctx


def meter(label: str, cap: figures.Capacity, unit: str) -> Html:
    def fmt(v: int) -> str:
        return f"{v}m" if unit == "m" else mib(v)

    pct = (100 * cap.requested / cap.allocatable) if cap.allocatable else 0.0
    used = (100 * cap.used / cap.allocatable) if cap.allocatable else 0.0
    return tag("div", tag("div", tag("strong", label),
                          f" requested {fmt(cap.requested)} of {fmt(cap.allocatable)} allocatable "
                          f"({pct:.0f}%), used {fmt(cap.used)}", class_="meter-label"),
               tag("div", tag("label", "requested", tag("meter", f"{pct:.0f}%", value=f"{min(pct, 100):.1f}",
                                                          min="0", max="100", high="85", optimum="50")),
                   tag("label", "used", tag("meter", f"{used:.0f}%", value=f"{min(used, 100):.1f}", min="0",
                                            max="100", high="85", optimum="50")), class_="bars"),
               class_="meter")


def counts(title: str, values: dict[str, int], href: str, param: str) -> Html:
    def item(key: str, count: int) -> Html:
        first, _, rest = key.partition(",")  # Ready,Cordoned: the status, then what an operator set
        target = rest.split(",")[0] if rest else first
        return tag("li", tag("a", badge(first), f" {rest.replace(',', ', ')} " if rest else " ", tag("strong", count),
                             href=f"{href}?{param}={target}"))

    items = join(item(k, v) for k, v in values.items())
    listing = tag("ul", items, class_="counts") if values else tag("p", "none", class_="muted")
    return tag("div", tag("h3", title), listing, class_="card")


def health_card(h: dict[str, object]) -> Html:
    mode = str(h.get("mode", "?"))
    rows = [("Mode", badge(mode) + esc(f" {h.get('detail') or ''}")),
            ("Answered by", f"replica {h.get('replicaId', '?')} ({'active' if h.get('active') else 'standby'})"),
            ("Leader", h.get("leader") or "-"),
            ("Sharded", f"yes: this replica owns {h.get('ownedNodes', 0)} nodes" if h.get("sharded") else "no"),
            ("Store", f"{h.get('storeBackend', '?')} {'ok' if h.get('storeOk') else 'NOT OK'}"),
            ("Events", "ok" if h.get("eventsOk") else "NOT OK")]
    ago_s = float(h.get("askedSecondsAgo", 0) or 0)  # type: ignore[arg-type]
    if ago_s >= 2:  # a copy, the scheduler being slow to answer (stale.py)
        rows.append(("As of", f"{ago_s:.0f} s ago"))
    return tag("div", tag("h3", "Control plane"),
               tag("dl", *(tag("div", tag("dt", k), tag("dd", v)) for k, v in rows)), class_="card")


def shards_card(h: dict[str, object]) -> Html:
    """Which replica is active and, sharded, every member of the shard map with the nodes it owns
    (their agents, liveness and statuses); placement stays with the active one."""
    leader = str(h.get("leader") or "")
    given = h.get("shards")
    members: list[dict[str, object]] = [m for m in given if isinstance(m, dict)] if isinstance(given, list) else []
    if not h.get("sharded") or not members:
        note = "not sharded: the active replica serves every node" + (f" ({leader})" if leader else "")
        return tag("div", tag("h3", "Shards"), tag("p", note, class_="muted"), class_="card", id="shards")
    rows = []
    for m in members:
        rid, addr = str(m.get("replica", "")), str(m.get("address", ""))
        roles = [r for r, yes in (("active", addr and addr == leader), ("answered", rid == h.get("replicaId")))
                 if yes]
        rows.append(tag("tr", tag("th", rid, *(join((" ", badge(r))) for r in roles), scope="row"),
                        tag("td", addr or "-"), tag("td", m.get("nodes", 0)), data_replica=rid))
    head = tag("tr", *(tag("th", x, scope="col") for x in ("Replica", "Address", "Nodes")))
    return tag("div", tag("h3", f"Shards ({len(rows)} replicas)"),
               tag("div", tag("table", tag("thead", head), tag("tbody", *rows), class_="shards"), class_="scroll"),
               class_="card", id="shards")


async def _nothing() -> Answer[dict[str, Any]]:
    return Answer({}, 0.0)


async def _none() -> Answer[list[Mapping[str, object]]]:
    return Answer([], 0.0)


async def overview_page(ctx: Ctx) -> Page:
    # The two scheduler calls at once, and not waited for long when a copy of under a minute is at
    # hand (stale.py): a busy scheduler took seconds; the live view answers the rest from memory.
    asked = ctx.dash.health_copy.get(ctx.client.health) if ctx.session.can("get", "health") else _nothing()
    last = ctx.dash.events_copy.get(lambda: recent(ctx, 20)) if ctx.session.can("list", "events") else _none()
    view, health_answer, events_answer = await asyncio.gather(ctx.cluster(), asked, last)
    health, events = health_answer.value, events_answer.value
    if health:
        health = {**health, "askedSecondsAgo": health_answer.age(time.monotonic())}
    o = view.overview()
    cards = tag("div", health_card(health) if health else Html(""), shards_card(health) if health else Html(""),
                counts(f"Nodes ({o.nodes})", o.nodes_by_status, "/ui/nodes", "status"),
                counts(f"Workloads ({o.workloads})", o.workloads_by_phase, "/ui/workloads", "phase"), class_="grid")
    capacity = tag("div", meter("CPU", o.cpu, "m"), meter("Memory", o.memory, "MiB"), meter("Disk", o.disk, "MiB"),
                   class_="card")
    return Page("Overview", "overview", [
        Section("summary", cards, ("workloads", "nodes")),
        Section("capacity", capacity, ("workloads", "nodes"), "Capacity"),
        Section("recent", event_table(events), (), "Recent events"),
    ], topics=("events", "workloads", "nodes"), last_event=str(events[-1]["id"]) if events else "")
