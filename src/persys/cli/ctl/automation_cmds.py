"""persysctl's automation commands (docs/automation.md): applying `kind: Policy`, `get policies`,
`describe policy`, `delete policy`, `automation log|pause|resume|status` and `policy replay`."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, OutputOpt, ServerOpt, age_text, emit, out
from persys.cli.output.safe_text import cell, printable

if TYPE_CHECKING:
    from persys.model.automation import PolicyManifest

automation_app = typer.Typer(
    help="The automation: what it decided and did under each policy (kind: Policy), and its off switch.\n\n"
    "Every decision is recorded, also \"do nothing\": the policy and its version, the inputs with their "
    "evidence (meter query and range, store object), the raw desired value and the limit that held it "
    "(tolerance, stabilization, rate, cooldown, min, max, stale, fallback, hold, paused).\n\n"
    "Examples:\n\n"
    "  persysctl apply -f policy.yaml            # kind: Policy (docs/automation.md)\n\n"
    "  persysctl automation log web-cpu --since 1h --outcome acted\n\n"
    "  persysctl automation pause --reason 'maintenance'   # everything; `pause web-cpu`: one policy\n\n"
    "  persysctl policy replay web-cpu --since 7d   # what it would have done, before enabling it",
    no_args_is_help=True)


def _target(spec: dict[str, Any]) -> str:
    if "autoscale" in spec:
        a = spec["autoscale"]
        return f"{a['workload']} {a.get('metric', 'cpu')}={a['target']} [{a.get('minReplicas', 1)}..{a['maxReplicas']}]"
    if "remediate" in spec:
        return f"cordon after {spec['remediate'].get('cordonAfterFailures', 3)} failures"
    r = spec.get("rebalance", {})
    return f"{r.get('resource', 'cpu')} {r.get('lowPercent', 30)}%..{r.get('highPercent', 80)}%"


def policy_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NAME", "SORT", "VERSION", "MODE", "TARGET", "AGE"):
        t.add_column(col, overflow="fold")
    for p in items:
        spec = p["spec"]
        mode = "paused" if spec.get("paused") else ("dry-run" if spec.get("dryRun") else "active")
        t.add_row(*map(cell, (p["name"], p["sort"], str(p["version"]), mode, _target(spec), age_text(p["createdAt"]))))
    return t


def apply_policies(api: Api, policies: list[PolicyManifest], dry_run: bool) -> list[dict[str, Any]]:
    results = []
    for m in policies:
        doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
        r = api.request("POST", "/v1/automation/policies", params={"dryRun": str(dry_run).lower()}, json=doc)
        verb = "created" if r["created"] else ("configured" if r["changed"] else "unchanged")
        out.print(f"policy/{m.metadata.name} {verb}{' (dry run)' if dry_run else ''}", highlight=False)
        results.append(r)
    return results


def get_policies(api: Api, name: str | None, output: str) -> None:
    if name:
        items = [api.request("GET", f"/v1/automation/policies/{name}")]
    else:
        listing = api.request("GET", "/v1/automation/policies")
        items = listing["items"]
        if listing["pause"].get("paused") and output == "table":
            out.print(f"all automation is PAUSED (by {listing['pause'].get('by')})", highlight=False)
    if not items and output == "table":
        out.print("No policies found.")
        return
    emit(items, output, policy_table(items), kind="policy")


def describe_policy(api: Api, name: str, output: str) -> None:
    p = api.request("GET", f"/v1/automation/policies/{name}")
    recent = api.request("GET", "/v1/automation/decisions", params={"policy": name, "limit": 10})
    if output != "text":
        emit({**p, "recentDecisions": recent}, output)
        return
    spec = p["spec"]
    import yaml

    lines = [f"Name:      {p['name']}", f"Sort:      {p['sort']}", f"Version:   {p['version']}",
             f"Mode:      {'paused' if spec.get('paused') else ('dry run' if spec.get('dryRun') else 'active')}",
             f"Created:   {age_text(p['createdAt'])} ago by {p.get('createdBy') or '?'}",
             f"Updated:   {age_text(p['updatedAt'])} ago by {p.get('updatedBy') or '?'}", "Spec:"]
    lines += ["  " + ln for ln in yaml.safe_dump(spec[p["sort"]], sort_keys=False).splitlines()]
    lines.append("Recent decisions:" if recent else "Recent decisions: none yet")
    lines += ["  " + decision_line(d) for d in recent]
    out.print(printable("\n".join(lines), keep_newlines=True), markup=False, highlight=False)


def delete_policy(api: Api, name: str) -> None:
    r = api.request("DELETE", f"/v1/automation/policies/{name}")
    out.print(f"policy/{name} {'already gone' if r['alreadyGone'] else 'deleted'}", highlight=False)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decision_line(d: dict[str, Any]) -> str:
    a = d.get("action") or {}
    what = ""
    if a:
        what = (f"{a.get('type')} {a.get('workload', '')} {a.get('from')}->{a.get('to')}" if a.get("type") == "scale"
                else f"{a.get('type')} {a.get('target', '')}")
    held = f" held by {d['heldBy']}" if d.get("heldBy") else ""
    return f"{_when(d['ts'])} {d['policy']} v{d['policyVersion']} {d['outcome']}{held} {what}".rstrip()


def log_table(items: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TIME", "POLICY", "V", "OUTCOME", "ACTION", "RAW", "DESIRED", "HELD BY", "REASON"):
        t.add_column(col, overflow="fold")
    for d in items:
        a = d.get("action") or {}
        act = (f"scale {a.get('from')}->{a.get('to')}" if a.get("type") == "scale"
               else f"{a.get('type')} {a.get('target', '')}" if a else "-")
        t.add_row(*map(cell, (_when(d["ts"]), d["policy"], str(d["policyVersion"]), d["outcome"], act,
                              "-" if d.get("rawDesired") is None else str(d["rawDesired"]),
                              "-" if d.get("desired") is None else str(d["desired"]), d.get("heldBy") or "-",
                              d.get("reason", "")[:160])))
    return t


@automation_app.command("log")
def log_cmd(
    policy: str = typer.Argument("", help="Only this policy's decisions."),
    since: str = typer.Option("", "--since", help="Only decisions of the last 30s, 10m, 2h, 7d."),
    outcome: str = typer.Option("", "--outcome", help="acted, dry-run, none, paused or failed."),
    limit: int = typer.Option(50, "--limit", min=1, max=5000, help="The newest N decisions."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """The decision log, oldest first: each decision's outcome, action, raw and desired values,
    the limit that held it and why (-o json: inputs and evidence too)."""
    params: dict[str, Any] = {"limit": limit}
    if policy:
        params["policy"] = policy
    if since:
        params["since"] = since
    if outcome:
        params["outcome"] = outcome
    items = Api(server).request("GET", "/v1/automation/decisions", params=params)
    if not items and output == "table":
        out.print("No decisions found.")
        return
    emit(items, output, log_table(items))


def _pause(paused: bool, policy: str, reason: str, server: str | None) -> None:
    r = Api(server).request("POST", f"/v1/automation/{'pause' if paused else 'resume'}",
                            params={"policy": policy} if policy else None, json={"reason": reason})
    word = "paused" if paused else "resumed"
    if policy:
        out.print(f"policy/{policy} {word}", highlight=False)
    else:
        out.print(f"all automation {word}" + (" (policies paused one by one stay paused)" if not paused and any(
            p["spec"].get("paused") for p in r["items"]) else ""), highlight=False)


@automation_app.command("pause")
def pause_cmd(
    policy: str = typer.Argument("", help="Pause only this policy (without it: all automation)."),
    reason: str = typer.Option("", "--reason", help="Why (kept with the switch and in the event)."),
    server: str | None = ServerOpt,
) -> None:
    """Stop deciding and acting (one policy, or all automation) until resumed. Paused policies
    still record a `paused` decision each interval, so the log shows the automation was there."""
    _pause(True, policy, reason, server)


@automation_app.command("resume")
def resume_cmd(
    policy: str = typer.Argument("", help="Resume only this policy (without it: all automation)."),
    reason: str = typer.Option("", "--reason", help="Why."),
    server: str | None = ServerOpt,
) -> None:
    """Resume what `pause` stopped."""
    _pause(False, policy, reason, server)


@automation_app.command("status")
def status_cmd(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Whether all automation is paused, and each policy's mode."""
    listing = Api(server).request("GET", "/v1/automation/policies")
    if output != "table":
        emit(listing, output)
        return
    pause = listing["pause"]
    out.print(f"automation: {'PAUSED by ' + str(pause.get('by')) if pause.get('paused') else 'running'}"
              + (f" ({pause['reason']})" if pause.get("reason") else ""), highlight=False)
    if listing["items"]:
        out.print(policy_table(listing["items"]))


def replay_cmd(name: str, since: str, start_replicas: int, output: str, server: str | None) -> None:
    r = Api(server).request("GET", f"/v1/automation/policies/{name}/replay",
                            params={"since": since, "startReplicas": start_replicas})
    if output != "text":
        emit(r, output)
        return
    lines = [f"policy/{r['policy']} v{r['version']} over {_when(r['start'])} .. {_when(r['end'])} "
             f"(meter step {r['meterStep']}s, {r['decisions']} decisions from {r['startReplicas']} replicas)",
             f"  actions:          {r['actions']} ({r['actionsPerHour']}/hour)",
             f"  flaps:            {r['flaps']} (a reversal within {r['flapSeconds']}s)",
             f"  over target:      {r['secondsOverTarget']}s ({100 * r['fractionOverTarget']:.1f}% of the time)",
             f"  replicas:         {r['replicas']['min']}..{r['replicas']['max']}",
             "  held by:          " + ", ".join(f"{k} {v}" for k, v in sorted(r["heldBy"].items()))]
    if r.get("scaleToZero"):  # the activation figure's history: its own, or the activation workload's
        act = r.get("activationEvidence") or r["evidence"]
        lines.append(f"  scale to zero on: workload/{act['value']} {act['metric']}")
    lines += [f"  {_when(a['ts'])} scale {a['from']}->{a['to']}" for a in r["actionList"][:50]]
    out.print(printable("\n".join(lines), keep_newlines=True), markup=False, highlight=False)

