"""Nodes: the list (search, status, label) and one node's page: capacity, runtimes and storage
drivers (with the reasons the missing ones are missing), labels, taints, its workloads, and
cordon / uncordon / drain with the drain's live progress: what remains, what is moving, and
what is stuck and why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from persys.gateway.dashboard import figures
from persys.gateway.dashboard.charts import usage_section
from persys.gateway.dashboard.events_page import event_table, recent
from persys.gateway.dashboard.html import Html, ago, badge, esc, join, link, mib, table, tag
from persys.gateway.dashboard.layout import Page, Section, action_button
from persys.gateway.dashboard.web import Ctx, Refused

PAGE_ROWS = 500
STATUSES = ("", "Ready", "NotReady", "Cordoned", "Draining")


def node_rows(items: list[Mapping[str, Any]]) -> Html:
    rows = []
    for n in items[:PAGE_ROWS]:
        caps, alloc = n.get("capabilities") or {}, n.get("allocated") or {}
        rows.append((link(f"/ui/nodes/{n['id']}", n["id"]), badge(figures.node_status(n).split(",")[0]),
                     ", ".join(figures.node_status(n).split(",")[1:]) or "-",
                     ", ".join(sorted(caps.get("runtimes") or {})) or "-",
                     f"{alloc.get('cpuMillicores', 0)}m / {caps.get('cpuMillicores', 0)}m",
                     f"{mib(alloc.get('memoryMb', 0))} / {mib(caps.get('memoryMb', 0))}", alloc.get("workloads", 0),
                     ", ".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items())) or "-"))
    more = tag("p", f"Showing {PAGE_ROWS} of {len(items)}: search to narrow.", class_="muted") \
        if len(items) > PAGE_ROWS else Html("")
    return table(("Node", "Status", "Operator", "Runtimes", "CPU alloc", "Memory alloc", "Instances", "Labels"),
                 rows, "No nodes match.") + more


async def nodes_page(ctx: Ctx) -> Page:
    view = await ctx.cluster()
    q, status, label = ctx.arg("q"), ctx.arg("status"), ctx.arg("label")
    try:
        items = figures.filter_nodes(view.nodes.values(), q, status, label)
    except figures.FilterProblem as err:
        raise Refused(400, str(err)) from None
    opts = join(tag("option", s or "any", value=s, selected=s == status) for s in STATUSES)
    form = tag("form", tag("label", "Search", tag("input", name="q", value=q, type="search")),
               tag("label", "Status", tag("select", opts, name="status")),
               tag("label", "Label", tag("input", name="label", value=label, placeholder="zone=a")),
               tag("button", "Filter", type="submit"), method="get", class_="filters")
    return Page("Nodes", "nodes", [
        Section("filters", form),
        Section("list", tag("p", f"{len(items)} nodes", class_="muted") + node_rows(items), ("nodes",)),
    ], topics=("nodes",))


def _runtimes(caps: Mapping[str, Any]) -> Html:
    rows: list[tuple[object, ...]] = []
    for name, info in sorted((caps.get("runtimes") or {}).items()):
        info = info if isinstance(info, Mapping) else {}
        rows.append((name, badge("available"), f"{info.get('version', '')} "
                                               f"{', '.join(info.get('features') or [])}".strip() or "-"))
    for name, why in sorted((caps.get("unavailable") or {}).items()):
        rows.append((name, badge("unavailable"), why if isinstance(why, str) else str(why)))
    return table(("Runtime", "State", "Version / reason"), rows, "No runtime reported.")


def _storage(caps: Mapping[str, Any]) -> Html:
    rows: list[tuple[object, ...]] = [(d, badge("available"), "") for d in sorted(caps.get("storageDrivers") or [])]
    # Tolerant: whichever field the agent uses for the drivers it could not offer, and why.
    for key in ("storageUnavailable", "unavailableStorageDrivers", "storageDriversUnavailable"):
        for name, why in sorted((caps.get(key) or {}).items()):
            rows.append((name, badge("unavailable"), why if isinstance(why, str) else str(why)))
    return table(("Storage driver", "State", "Reason"), rows, "No storage driver reported.")


def _capacity(n: Mapping[str, Any]) -> Html:
    caps, alloc, usage = n.get("capabilities") or {}, n.get("allocated") or {}, n.get("usage") or {}
    rows = [("CPU", f"{caps.get('cpuMillicores', 0)}m", f"{alloc.get('cpuMillicores', 0)}m",
             f"{float(usage.get('cpuPercent', 0) or 0):.1f}%"),
            ("Memory", mib(caps.get("memoryMb", 0)), mib(alloc.get("memoryMb", 0)),
             mib(usage.get("memoryUsedMb", 0) or 0)),
            ("Disk", mib(caps.get("diskMb", 0)), mib(alloc.get("diskMb", 0)), mib(usage.get("diskUsedMb", 0) or 0))]
    return table(("Resource", "Capacity", "Requested", "Used"), rows)


def drain_progress(d: Mapping[str, Any]) -> Html:
    if not d.get("draining") and not d.get("cordoned"):
        return tag("p", "Schedulable: not cordoned, not draining.", class_="muted")
    state = "drained" if d.get("done") else ("draining" if d.get("draining") else "cordoned")
    remaining, moving, blocked = d.get("remaining") or [], d.get("moving") or [], d.get("blocked") or []
    summary = tag("p", badge(state), f" {len(remaining)} remaining, {len(moving)} moving, {len(blocked)} stuck",
                  class_="drain-summary", data_state=state)
    return join((
        summary,
        tag("h3", "Stuck") + table(("Instance", "Why"), [(b.get("instance", ""), b.get("reason", ""))
                                                         for b in blocked], "Nothing stuck.", class_="stuck"),
        tag("h3", "Moving") + table(("Instance", "Phase", "To", "Message"),
                                    [(m.get("instance", ""), m.get("phase", ""), m.get("node", ""),
                                      m.get("message", "")) for m in moving], "Nothing moving."),
        tag("h3", "Remaining") + table(("Instance", "Phase"), [(r.get("instance", ""), r.get("phase", ""))
                                                               for r in remaining], "Nothing remaining."),
    ))


def _actions(ctx: Ctx, n: Mapping[str, Any]) -> Html:
    nid = str(n["id"])
    out = []
    if ctx.session.can("cordon", "nodes"):
        if n.get("cordoned") or n.get("draining"):
            out.append(action_button(ctx.session, f"/ui/nodes/{nid}/uncordon", "Uncordon"))
        else:
            out.append(action_button(ctx.session, f"/ui/nodes/{nid}/cordon", "Cordon"))
    if ctx.session.can("drain", "nodes") and not n.get("draining"):
        out.append(action_button(ctx.session, f"/ui/nodes/{nid}/drain", "Drain", danger=True,
                                 confirm=f"Drain {nid}: move every instance elsewhere?"))
    return tag("div", *out, class_="actions") if out else Html("")


async def node_page(ctx: Ctx, nid: str) -> Page:
    ctx.require("get", "nodes")
    n = await ctx.client.get_node(nid)
    view = await ctx.cluster()
    caps = n.get("capabilities") or {}
    topic = f"node/{nid}"
    taints = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in n.get("taints") or [])
    info = [("Status", badge(str(n.get("status", ""))) + esc(f" {n.get('statusReason', '')}")),
            ("Address", n.get("address") or "-"), ("Agent", n.get("agentVersion") or "-"),
            ("Last heartbeat", ago(float(n.get("lastHeartbeat", 0) or 0))),
            ("Labels", ", ".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items())) or "-"),
            ("Taints", taints or "-")]
    on_node = figures.filter_workloads(view.workloads.values(), node=nid)
    drain = await ctx.client.drain_status(nid)
    events = await recent(ctx, 50, topic)
    return Page(f"Node {nid}", "nodes", [
        Section("actions", _actions(ctx, n), (topic,)),
        Section("info", tag("dl", *(tag("div", tag("dt", k), tag("dd", v)) for k, v in info), class_="kv"), (topic,)),
        Section("drain", drain_progress(drain), (topic, "workloads"), "Cordon and drain"),
        Section("capacity", _capacity(n), (topic,), "Capacity"),
        Section("usage", await usage_section(ctx, "node", nid, f"/ui/nodes/{nid}"), (), "Usage"),
        Section("runtimes", _runtimes(caps) + _storage(caps), (topic,), "Runtimes and storage"),
        Section("workloads", table(("Workload", "Phase", "Ready"),
                                   [(link(f"/ui/workloads/{w['id']}", w.get("name", w["id"])),
                                     badge(str(w.get("phase", ""))), w.get("ready", "")) for w in on_node],
                                   "No workloads here."), ("workloads",), "Workloads"),
        Section("events", event_table(events, "node-events"), (), "Events"),
    ], topics=("events", "workloads", "nodes"), subject=topic, last_event=str(events[-1]["id"]) if events else "")


async def topology_page(ctx: Ctx) -> Page:
    """Every node as a named tile, grouped by zone (or any label named by `by`), searchable by
    name or label as you type; names stay whole at any count (tiles wrap, never shrink text)."""
    view = await ctx.cluster()
    by = ctx.arg("by") or "zone"
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for n in figures.filter_nodes(view.nodes.values(), ctx.arg("q")):
        groups.setdefault(str((n.get("labels") or {}).get(by, "(none)")), []).append(n)
    blocks = []
    for key in sorted(groups):
        tiles = join(tag("li", tag("a", n["id"], href=f"/ui/nodes/{n['id']}",
                                   title=", ".join(f"{k}={v}" for k, v in (n.get("labels") or {}).items())),
                         class_=f"tile t-{figures.node_status(n).split(',')[0].lower()}",
                         data_search=" ".join([str(n["id"]), *(f"{k}={v}" for k, v in
                                                               (n.get("labels") or {}).items())]).lower())
                     for n in groups[key])
        blocks.append(tag("div", tag("h3", f"{by}={key} ({len(groups[key])})"), tag("ul", tiles, class_="tiles"),
                          class_="group"))
    form = tag("form", tag("label", "Search", tag("input", type="search", name="q", value=ctx.arg("q"),
                                                  id="topology-search", data_filter="#topology li.tile",
                                                  placeholder="name or label=value")),
               tag("label", "Group by label", tag("input", name="by", value=by)),
               tag("button", "Apply", type="submit"), method="get", class_="filters")
    return Page("Topology", "topology", [Section("filters", form),
                                         Section("topology", join(blocks) or tag("p", "No nodes.", class_="muted"),
                                                 ("nodes",))], topics=("nodes",))
