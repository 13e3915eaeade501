"""persysctl auth (whoami, can-i, token create|list|revoke) and persysctl audit."""

from __future__ import annotations

import datetime as dt
import re
import time

import typer
from rich.table import Table

from persys.cli.ctl import api as ctl
from persys.cli.ctl.api import OutputOpt, ServerOpt

auth_app = typer.Typer(help="Who you are, what you may do, and API tokens.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens: bearer credentials for scripts and CI (admins only).",
                        no_args_is_help=True)
auth_app.add_typer(token_app, name="token")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}




def seconds(text: str) -> float:
    """'90', '90s', '15m', '12h', '30d' -> seconds (ValueError otherwise)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 12h, 30d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"


@auth_app.command("whoami")
def whoami(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Your identity as the control plane sees it: principal, groups, roles, credential."""
    me = ctl.Api(server).request("GET", "/v1/auth/whoami")
    if output != "table":
        ctl.emit(me, output)
        return
    ctl.out.print(f"principal:  {me['principal']}\ngroups:     {', '.join(me['groups']) or '-'}\n"
                  f"roles:      {', '.join(me['roles']) or '(none)'}\ncredential: {me['credential']}",
                  markup=False, highlight=False)


@auth_app.command("can-i")
def can_i(verb: str = typer.Argument(..., help="e.g. apply, delete, list, backup"),
          resource: str = typer.Argument(..., help="e.g. workloads, nodes, cluster, tokens, audit"),
          server: str | None = ServerOpt) -> None:
    """Whether you may perform VERB on RESOURCE: prints yes or no (exit code 0 or 1) and why."""
    r = ctl.Api(server).request("GET", "/v1/auth/can-i", params={"verb": verb, "resource": resource})
    ctl.out.print(f"{'yes' if r['allowed'] else 'no'} ({r['reason']})", markup=False, highlight=False)
    if not r["allowed"]:
        raise typer.Exit(1)


@token_app.command("create")
def token_create(name: str = typer.Argument(..., help="The user the token acts as (user:NAME)."),
                 role: str = typer.Option(..., "--role", help="admin, operator or viewer."),
                 ttl: str = typer.Option("30d", "--ttl", help="Lifetime: 90s, 15m, 12h, 30d (at most 366d)."),
                 description: str = typer.Option("", "--description"),
                 output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Create a token. Its secret is printed this once: the control plane keeps only a hash."""
    try:
        ttl_seconds = seconds(ttl)
    except ValueError as e:
        ctl.fail(f"--ttl: {e}")
    r = ctl.Api(server).request("POST", "/v1/auth/tokens", json={
        "name": name, "role": role, "ttlSeconds": ttl_seconds, "description": description})
    if output != "table":
        ctl.emit(r, output)
        return
    ctl.out.print(r["token"], markup=False, highlight=False, soft_wrap=True)
    ctl.err_console.print(f"token {r['id']} for user:{r['name']} ({r['role']}), expires {_when(r['expires_at'])}; "
                          "store it now, it is not shown again", markup=False, highlight=False)


@token_app.command("list")
def token_list(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Every token: id, user, role, state, expiry (never a secret)."""
    items = ctl.Api(server).request("GET", "/v1/auth/tokens")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "USER", "ROLE", "STATE", "EXPIRES", "CREATED BY", "DESCRIPTION"):
        t.add_column(col, overflow="fold")
    for i in items:
        t.add_row(i["id"], i["name"], i["role"], i["state"], _when(i["expires_at"]), i["created_by"],
                  i.get("description", ""))
    ctl.emit(items, output, t)


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="The token's id (persysctl auth token list)."),
                 server: str | None = ServerOpt) -> None:
    """Revoke a token: every replica refuses it from now on."""
    r = ctl.Api(server).request("DELETE", f"/v1/auth/tokens/{token_id}")
    ctl.out.print(f"token {r['id']} ({r['name']}) {r['state']}", markup=False, highlight=False)


def shown_action(action: str) -> str:
    """An audit record's action as the listing shows it: a REST call as its method and route
    ("POST /v1/nodes/{node_id}/revoke"), a gRPC call as service/method ("Control/Apply"); never
    just the last word of either, which names neither the resource nor the verb."""
    method, _, route = action.partition(" ")
    if route.startswith("/") and method.isalpha() and method.isupper():
        return f"{method} {route}"
    if action.startswith("/") and action.count("/") == 2:
        service, _, name = action[1:].partition("/")
        return f"{service.rsplit('.', 1)[-1]}/{name}"
    return action


def audit_command(since: str = typer.Option("", "--since", help="Only newer records: a duration ago (15m, 2h, "
                                                                "7d) or unix seconds."),
                  who: str = typer.Option("", "--who", help="Only principals (or gateways) containing this."),
                  limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="The newest N matches."),
                  output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """The audit log: who changed what, when, with what result (admins only)."""
    try:
        start = 0.0 if not since else (float(since) if since.replace(".", "", 1).isdigit() and float(since) > 1e9
                                       else time.time() - seconds(since))
    except ValueError as e:
        ctl.fail(f"--since: {e}")
    r = ctl.Api(server).request("GET", "/v1/audit", params={"since": start, "who": who, "limit": limit})
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TIME", "PRINCIPAL", "VIA", "ACTION", "OBJECT", "RESULT", "REQUEST"):
        t.add_column(col, overflow="fold")
    for i in r["items"]:
        obj = " ".join(f"{k}={v}" for k, v in i.get("object", {}).items())
        t.add_row(_when(i["ts"]), i["principal"], i.get("via") or "-", shown_action(i["action"]), obj,
                  i["result"], i.get("requestId", ""))
    ctl.emit(r["items"], output, t)
