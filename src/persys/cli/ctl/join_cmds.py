"""persysctl node token create|list|revoke (node join tokens) and persysctl node revoke."""

from __future__ import annotations

import datetime as dt

import typer
from rich.table import Table

from persys.cli.ctl import api as ctl
from persys.cli.ctl.api import OutputOpt, ServerOpt
from persys.cli.ctl.auth_cmds import seconds
from persys.cli.output.safe_text import printable

node_app = typer.Typer(help="Node identities: join tokens for new nodes, revocation (admins only).",
                       no_args_is_help=True)
join_token_app = typer.Typer(help="Single-use tokens that let a new node join (persys agent --join).",
                             no_args_is_help=True)
node_app.add_typer(join_token_app, name="token")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"


@join_token_app.command("create")
def token_create(ttl: str = typer.Option("1h", "--ttl", help="Lifetime: 90s, 15m, 1h, 2d (1 minute to 7 days)."),
                 node_id: str = typer.Option("", "--node-id", help="The only node the token admits. Without "
                                             "it the joining node names itself, and only a new id is accepted; "
                                             "to let a known node join again (new machine, lost key) name it."),
                 description: str = typer.Option("", "--description"),
                 output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Create a join token and print the command that joins a node with it.

    The token is single-use and expires; the control plane keeps only its hash. The CA pin
    (sha256 of the cluster CA's public key) lets the new node check it talks to this cluster
    before it sends the token: on the new machine run

      persys agent --join SCHEDULER:JOINPORT --token TOKEN --ca-pin PIN --scheduler SCHEDULER:PORT ...
    """
    try:
        ttl_seconds = seconds(ttl)
    except ValueError as e:
        ctl.fail(f"--ttl: {e}")
    r = ctl.Api(server).request("POST", "/v1/join-tokens", json={
        "ttlSeconds": ttl_seconds, "nodeId": node_id, "description": description})
    if output != "table":
        ctl.emit(r, output)
        return
    ctl.out.print(f"token:  {r['token']}\nca-pin: {r['caPin']}", markup=False, highlight=False, soft_wrap=True)
    who = f"node {r['node_id']}" if r["node_id"] else "one new node"
    ctl.err_console.print(
        f"join token {r['id']} admits {who} once, until {_when(r['expires_at'])}; it is not shown again.\n"
        f"On the node: persys agent --join <scheduler>:<join port> --token {r['token']} --ca-pin {r['caPin']} "
        f"--scheduler <scheduler>:<port> --tls-dir /etc/persys/pki --node-id {r['node_id'] or '<new id>'}",
        markup=False, highlight=False, soft_wrap=True)


@join_token_app.command("list")
def token_list(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Every join token: id, node, state (active, used, expired, revoked), expiry; never a secret."""
    items = ctl.Api(server).request("GET", "/v1/join-tokens")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "NODE", "STATE", "EXPIRES", "USED BY", "CREATED BY", "DESCRIPTION"):
        t.add_column(col, overflow="fold")
    for i in items:
        t.add_row(i["id"], i["node_id"] or "(any new)", i["state"], _when(i["expires_at"]),
                  printable(i["used_by"]) or "-", i["created_by"], printable(i.get("description", "")))
    ctl.emit(items, output, t)


@join_token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="The token's id (persysctl node token list)."),
                 server: str | None = ServerOpt) -> None:
    """Revoke an unused join token: no node can join with it any more."""
    r = ctl.Api(server).request("DELETE", f"/v1/join-tokens/{token_id}")
    ctl.out.print(f"join token {r['id']} {r['state']}", markup=False, highlight=False)


@node_app.command("revoke")
def node_revoke(node: str = typer.Argument(..., help="Node name."),
                reason: str = typer.Option("", "--reason", help="Why (kept with the revocation, in the audit log)."),
                force: bool = typer.Option(False, "--force", help="Revoke an id no node has (never registered, no "
                                           "certificate, no join token), so that no node can ever use it; "
                                           "without it such an id is refused, as a typo would be."),
                server: str | None = ServerOpt) -> None:
    """Revoke a node's identity for good: every scheduler replica refuses its calls within a second,
    ends its desired-state stream at once and its update stream at its next heartbeat, and never
    renews its certificate. Its workloads are rescheduled once it goes NotReady. A reinstalled
    machine joins again under a new node id."""
    r = ctl.Api(server).request("POST", f"/v1/nodes/{node}/revoke", json={"reason": reason, "force": force})
    ctl.out.print(f"node/{node} revoked (by {r['revokedBy']} at {_when(r['revokedAt'])})", markup=False,
                  highlight=False)
