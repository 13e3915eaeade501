"""Workloads: the list with filters (label, type, phase, node, name) and one workload's page:
status and instances, the placement explanation node by node with every reason, revisions,
events, and the actions its role allows (edit with a plan preview, restart, stop/start, delete).
Explanation documents are rendered tolerantly: fields this page does not know are listed as
they come (the placement engine grows new ones)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from persys.client import SchedulerError
from persys.gateway.dashboard import figures
from persys.gateway.dashboard.charts import usage_section
from persys.gateway.dashboard.events_page import event_table, recent
from persys.gateway.dashboard.html import Html, ago, badge, esc, join, link, table, tag
from persys.gateway.dashboard.layout import Page, Section, action_button, csrf_field
from persys.gateway.dashboard.log_follow import logs_section
from persys.gateway.dashboard.web import Ctx, Refused
from persys.tlsfiles import TLSFiles

PAGE_ROWS = 200
LOG_PAGE_LINES = 200
TYPES = ("", "process", "container", "compose", "vm", "microvm")
PHASES = ("", "Pending", "Scheduling", "Scheduled", "Starting", "Running", "Stopped", "Failed", "Succeeded")
VM_TYPES = ("vm", "microvm")  # they have a serial console (no exec)
KNOWN_REJECTION = ("node", "verdict", "code", "reason", "filter", "message", "score", "breakdown")


def _select(name: str, options: tuple[str, ...], value: str, label: str) -> Html:
    opts = join(tag("option", o or "any", value=o, selected=o == value) for o in options)
    return tag("label", label, tag("select", opts, name=name))


def workload_rows(items: list[Mapping[str, Any]]) -> Html:
    rows = []
    for w in items[:PAGE_ROWS]:
        nodes = w.get("nodes") or ([w["node"]] if w.get("node") else [])
        rows.append((link(f"/ui/workloads/{w['id']}", w.get("name", w["id"])), w.get("type", ""),
                     w.get("ready", ""), badge(str(w.get("phase", ""))),
                     join((link(f"/ui/nodes/{n}", n) for n in nodes[:3]), ", ") or "-",
                     ", ".join(f"{k}={v}" for k, v in (w.get("labels") or {}).items()) or "-",
                     w.get("reason", "") if w.get("phase") != "Running" else "", ago(float(w.get("updatedAt", 0)))))
    more = tag("p", f"Showing {PAGE_ROWS} of {len(items)}: narrow the filters.", class_="muted") \
        if len(items) > PAGE_ROWS else Html("")
    return table(("Name", "Type", "Ready", "Phase", "Nodes", "Labels", "Reason", "Updated"), rows,
                 "No workloads match.") + more


async def workloads_page(ctx: Ctx) -> Page:
    view = await ctx.cluster()
    label, type_, phase, node, name = (ctx.arg("label"), ctx.arg("type"), ctx.arg("phase"), ctx.arg("node"),
                                       ctx.arg("name"))
    try:
        items = figures.filter_workloads(view.workloads.values(), label, type_, phase, node, name)
    except figures.FilterProblem as err:
        raise Refused(400, str(err)) from None
    form = tag("form", tag("label", "Name", tag("input", name="name", value=name)),
               tag("label", "Label", tag("input", name="label", value=label, placeholder="app=web,tier")),
               _select("type", TYPES, type_, "Type"), _select("phase", PHASES, phase, "Phase"),
               tag("label", "Node", tag("input", name="node", value=node)),
               tag("button", "Filter", type="submit"), method="get", class_="filters")
    new = tag("p", tag("a", "Apply a manifest", href="/ui/apply", class_="button")) \
        if ctx.session.can("apply", "workloads") else Html("")
    return Page("Workloads", "workloads", [
        Section("filters", new + form),
        Section("list", tag("p", f"{len(items)} workloads", class_="muted") + workload_rows(items), ("workloads",)),
    ], topics=("workloads",))


def manifest_of(w: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": w.get("name", w.get("id"))}
    if w.get("labels"):
        meta["labels"] = dict(w["labels"])
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": meta, "spec": w.get("spec") or {}}


def _extra(doc: Mapping[str, Any], known: tuple[str, ...]) -> Html:
    rest = {k: v for k, v in doc.items() if k not in known}
    if not rest:
        return Html("")
    return tag("dl", *(tag("div", tag("dt", k), tag("dd", v if isinstance(v, str | int | float) else
                                                     yaml.safe_dump(v, default_flow_style=True).strip()))
                       for k, v in sorted(rest.items())), class_="extra")


def placement_rows(rows: list[dict[str, Any]]) -> Html:
    out = []
    for r in rows:
        verdict = str(r["verdict"])
        if verdict == "rejected":
            why = join((tag("strong", r.get("code", "")), " ", r.get("reason", ""),
                        tag("span", f" ({r['filter']})", class_="muted") if r.get("filter") else "",
                        tag("div", r.get("message", ""), class_="muted") if r.get("message") else "",
                        _extra(r, KNOWN_REJECTION)))
        elif r.get("score") is not None:
            parts = ", ".join(f"{k} {float(v):.1f}" for k, v in (r.get("breakdown") or {}).items())
            why = esc(f"score {float(r['score']):.1f}" + (f" [{parts}]" if parts else ""))
        else:
            why = esc("passed every filter" if verdict == "feasible" else "")
        out.append(tag("tr", tag("th", link(f"/ui/nodes/{r['node']}", r["node"]), scope="row"),
                       tag("td", badge(verdict.replace(" ", "-"))), tag("td", why), data_node=r["node"]))
    head = tag("tr", *(tag("th", h, scope="col") for h in ("Node", "Verdict", "Why")))
    return tag("div", tag("table", tag("thead", head), tag("tbody", *out), class_="placement"), class_="scroll")


def _pending(w: Mapping[str, Any]) -> bool:
    return w.get("phase") == "Pending" or any(i.get("phase") == "Pending" for i in w.get("instances") or [])


def whatif_rows(whatif: Mapping[str, Any]) -> Html:
    """Each Pending replica's smallest changes that would place it, cheapest first, each verified
    by the engine on the changed snapshot (GET /v1/workloads/{id}/whatif)."""
    parts = []
    for rep in whatif.get("replicas") or []:
        if not rep.get("pending"):
            continue
        changes = rep.get("changes") or []
        rows = [(tag("strong", c.get("summary", "")), c.get("kind", ""), c.get("fits", ""),
                 link(f"/ui/nodes/{c['landsOn']}", c["landsOn"]) if c.get("landsOn") else "-",
                 f"{float(c.get('cost', 0)):.2f}") for c in changes]
        parts.append(tag("h3", f"{rep.get('instance', '')}: what would place it"))
        parts.append(table(("Change", "Kind", "Nodes that fit", "Would land on", "Cost"), rows,
                           "No change found that would place it."))
    return tag("div", *parts, class_="whatif") if parts else Html("")


async def whatif_panel(ctx: Ctx, wid: str) -> Html:
    try:
        return whatif_rows(await ctx.client.what_if(wid))
    except SchedulerError as err:
        return tag("p", f"what-if refused: {err.message}", class_="error")


async def placement_section(ctx: Ctx, w: Mapping[str, Any], node_ids: list[str]) -> Html:
    """The stored explanation of each replica, then a dry run of its spec now: every node's
    verdict (rejected with its reasons, feasible with its score)."""
    explained = await ctx.client.explain(str(w["id"]))
    parts = []
    for rep in explained.get("replicas") or []:
        parts.append(tag("p", tag("strong", rep.get("instance", "")), " ", badge(str(rep.get("phase", ""))), " ",
                         rep.get("explanation", ""), _extra(rep, ("instance", "phase", "node", "explanation",
                                                                  "decision"))))
    parts.append(_extra(explained, ("workload", "replicas", "node")))
    if _pending(w) and ctx.session.can("plan", "workloads"):
        parts.append(await whatif_panel(ctx, str(w["id"])))
    if w.get("spec") and ctx.session.can("plan", "workloads"):
        try:
            plan = await ctx.client.plan(manifest_of(w))
        except SchedulerError as err:
            parts.append(tag("p", f"dry run refused: {err.message}", class_="error"))
        else:
            for rep in plan.get("replicas") or []:
                rows = figures.node_rejections(rep, node_ids)
                parts.append(tag("h3", f"{rep.get('instance', '')}: every node now (dry run, {len(rows)} nodes)"))
                parts.append(tag("p", rep.get("explanation", ""), class_="muted"))
                parts.append(placement_rows(rows))
                parts.append(_extra(rep, ("instance", "node", "explanation", "decision")))
    return join(parts)


def _actions(ctx: Ctx, w: Mapping[str, Any]) -> Html:
    wid = str(w["id"])
    buttons = []
    if ctx.session.can("control", "workloads"):
        buttons.append(action_button(ctx.session, f"/ui/workloads/{wid}/restart", "Restart"))
        if w.get("desiredState") == "Stopped":
            buttons.append(action_button(ctx.session, f"/ui/workloads/{wid}/start", "Start"))
        else:
            buttons.append(action_button(ctx.session, f"/ui/workloads/{wid}/stop", "Stop"))
    if ctx.session.can("exec", "workloads"):  # a VM's serial console, or a shell in anything else
        if w.get("type") in VM_TYPES:
            buttons.append(tag("a", "Console", href=f"/ui/workloads/{wid}/console", class_="button"))
        else:
            buttons.append(tag("a", "Terminal", href=f"/ui/workloads/{wid}/terminal", class_="button"))
    if ctx.session.can("apply", "workloads"):
        buttons.append(tag("a", "Edit manifest", href=f"/ui/apply?from={wid}", class_="button"))
    if ctx.session.can("delete", "workloads"):
        buttons.append(action_button(ctx.session, f"/ui/workloads/{wid}/delete", "Delete", danger=True,
                                     confirm=f"Delete workload {wid}?"))
    return tag("div", *buttons, class_="actions") if buttons else Html("")


def _status(w: Mapping[str, Any]) -> Html:
    rows = [("Phase", badge(str(w.get("phase", "")))), ("Ready", w.get("ready", "")), ("Type", w.get("type", "")),
            ("Desired", w.get("desiredState", "")), ("Revision", f"{w.get('revision', '')} (generation "
                                                                f"{w.get('generation', '')})"),
            ("Reason", w.get("reason", "") or "-"), ("Message", w.get("message", "") or "-"),
            ("Restarts", w.get("restarts", 0)),
            ("Labels", ", ".join(f"{k}={v}" for k, v in (w.get("labels") or {}).items()) or "-")]
    inst = table(("Instance", "Phase", "Node", "Reason", "Message", "Restarts"),
                 [(i.get("instance", ""), badge(str(i.get("phase", ""))),
                   link(f"/ui/nodes/{i['node']}", i["node"]) if i.get("node") else "-", i.get("reason", ""),
                   i.get("message", ""), i.get("restarts", 0)) for i in w.get("instances") or []])
    return tag("dl", *(tag("div", tag("dt", k), tag("dd", v)) for k, v in rows), class_="kv") + \
        tag("h3", "Instances") + inst


def spec_diff(before: Mapping[str, Any], after: Mapping[str, Any], old: str, new: str) -> str:
    a = yaml.safe_dump(dict(before), sort_keys=True).splitlines()
    b = yaml.safe_dump(dict(after), sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, old, new, lineterm="", n=2)) or "no change"


def revisions_table(ctx: Ctx, wid: str, revisions: list[dict[str, Any]]) -> Html:
    """Every kept revision, what changed from the one before it (a diff of the specs), and a
    rollback to it for those whose role may apply."""
    rows = []
    for i, r in enumerate(revisions):
        gen = r.get("generation", "")
        diff = Html("")
        if i > 0:
            prev = revisions[i - 1]
            diff = tag("details", tag("summary", "diff"), tag("pre", spec_diff(
                prev.get("spec") or {}, r.get("spec") or {}, f"generation {prev.get('generation')}",
                f"generation {gen}"), class_="diff"))
        act: object = "current" if r.get("current") else ""
        if not r.get("current") and ctx.session.can("apply", "workloads"):
            act = action_button(ctx.session, f"/ui/workloads/{wid}/rollback", f"Roll back to {gen}",
                                confirm=f"Apply generation {gen}'s spec again?", fields={"generation": str(gen)})
        rollback_of = f" (rollback of {r['rollbackOf']})" if r.get("rollbackOf") else ""
        rows.append((gen, r.get("revision", ""), ago(float(r.get("createdAt", 0))),
                     join((esc(str(r.get("change", "")) + rollback_of), diff)), act))
    return table(("Generation", "Revision", "Created", "Change", ""), rows, "No revisions kept.")


def part_wanted(ctx: Ctx, section: str) -> bool:
    """Whether this request renders `section` (a whole page, or a live refresh naming it)."""
    parts = ctx.arg("part")
    return not parts or section in parts.split(",")


async def workload_page(ctx: Ctx, wid: str, agent_tls: TLSFiles | None = None) -> Page:
    ctx.require("get", "workloads")
    w = await ctx.client.get_workload(wid)
    view = await ctx.cluster()
    topic = f"workload/{wid}"
    revisions = await ctx.client.revisions(wid)
    events = await recent(ctx, 50, topic)
    sections = [
        Section("actions", _actions(ctx, w), (topic,)),
        Section("status", _status(w), (topic,), "Status"),
        Section("placement", await placement_section(ctx, w, sorted(view.nodes)), (topic, "nodes"), "Placement"),
        Section("usage", await usage_section(ctx, "workload", wid, f"/ui/workloads/{wid}"), (topic,), "Usage"),
        Section("revisions", revisions_table(ctx, wid, revisions), (topic,), "Revisions"),
        Section("events", event_table(events, "workload-events"), (), "Events"),
    ]
    topics: tuple[str, ...] = ("events", "workloads")
    if ctx.session.can("logs", "workloads"):  # followed live: new lines come over the page's live connection
        shown = await logs_section(ctx.client, agent_tls, wid) if part_wanted(ctx, "logs") else None
        body = shown.html if shown else Html("")
        more = tag("p", tag("a", f"Logs page (last {LOG_PAGE_LINES} lines)", href=f"/ui/workloads/{wid}/logs"))
        sections.append(Section("logs", body + more, (), "Logs"))
        topics += ("logs",) if shown and shown.followable else ()
    return Page(f"Workload {w.get('name', wid)}", "workloads", sections, topics=topics,
                subject=topic, last_event=str(events[-1]["id"]) if events else "")


async def apply_page(ctx: Ctx) -> Page:
    ctx.require("apply", "workloads")
    source = ctx.arg("from")
    text = ""
    if source:
        w = await ctx.client.get_workload(source)
        text = yaml.safe_dump(manifest_of(w), sort_keys=False)
    return apply_form_page(ctx, text)


def apply_form_page(ctx: Ctx, text: str, preview: Html | None = None, message: str = "", status: int = 200) -> Page:
    form = tag("form", csrf_field(ctx.session),
               tag("label", "Manifest (YAML or JSON)", for_="manifest"),
               tag("textarea", text, id="manifest", name="manifest", rows="18", spellcheck="false", required=True),
               tag("div", tag("button", "Preview plan", type="submit", name="do", value="plan"),
                   tag("button", "Apply", type="submit", name="do", value="apply", class_="primary"),
                   class_="actions"), method="post", action="/ui/apply")
    sections = [Section("editor", (tag("p", message, class_="error", role="alert") if message else Html("")) + form)]
    if preview is not None:
        sections.append(Section("preview", preview, (), "Plan preview"))
    return Page("Apply a manifest", "apply", sections, status=status)


def plan_preview(plan: Mapping[str, Any], current: Mapping[str, Any] | None, new: Mapping[str, Any],
                 node_ids: list[str]) -> Html:
    """Where each replica would go, every node's verdict, and what changes against the current spec."""
    parts = []
    if current is not None:
        old = yaml.safe_dump(manifest_of(current), sort_keys=True).splitlines()
        fresh = yaml.safe_dump(new, sort_keys=True).splitlines()
        diff = list(difflib.unified_diff(old, fresh, "current", "new", lineterm="", n=2))
        parts.append(tag("h3", "Changes"))
        parts.append(tag("pre", "\n".join(diff) if diff else "no change", class_="diff"))
    else:
        parts.append(tag("p", "A new workload.", class_="muted"))
    for rep in plan.get("replicas") or []:
        target = rep.get("node")
        parts.append(tag("h3", f"{rep.get('instance', '')} → {target or 'no node (would stay Pending)'}"))
        parts.append(tag("p", rep.get("explanation", ""), class_="muted"))
        parts.append(placement_rows(figures.node_rejections(rep, node_ids)))
    return join(parts)


async def terminal_page(ctx: Ctx, wid: str, console: bool = False) -> Page:
    """In the browser, xterm.js over the gateway's WebSocket, authenticated by this session and
    audited as `exec workloads` (as `persysctl exec -t` / `persysctl console` are):

    - a terminal: a command (default `sh`) on a TTY in an instance (/v1/workloads/NAME/terminal);
    - a console (VMs, microVMs): the guest's serial port (/v1/workloads/NAME/console), relayed by
      the agent from whatever the runtime attaches to (libvirt's console stream, a QEMU chardev
      socket); detaching leaves the guest running, one client at a time."""
    ctx.require("exec", "workloads")
    w = await ctx.client.get_workload(wid)
    kind = str(w.get("type", ""))
    if console and kind not in VM_TYPES:
        raise Refused(409, f"{wid} is a {kind} workload: only VMs and microVMs have a serial console "
                           "(its terminal runs a shell)")
    instances = [str(i.get("instance", "")) for i in w.get("instances") or []]
    command = Html("") if console else tag("label", "Command", tag("input", name="command", id="term-command",
                                                                    value="sh", spellcheck="false"))
    form = tag("form", command,
               tag("label", "Instance", tag("select", join(tag("option", i, value=i) for i in instances),
                                            id="term-instance")),
               tag("button", "Connect", type="submit", id="term-connect"), class_="filters", id="term-form")
    note = tag("p", "The guest's serial console: press Enter for a prompt. Leaving detaches; the VM keeps "
                    "running.", class_="muted") if console else Html("")
    body = join((form, note, tag("p", "not connected", id="term-status", role="status", class_="muted"),
                 tag("div", "", id="terminal", data_workload=wid, data_mode="console" if console else "terminal",
                     class_="terminal")))
    return Page(f"{'Console' if console else 'Terminal'}: {w.get('name', wid)}", "workloads",
                [Section("term", body)], scripts=("vendor/xterm.js", "terminal.js"), styles=("vendor/xterm.css",),
                inline_styles=True)
