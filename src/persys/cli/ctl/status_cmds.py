"""`persysctl health` (the control plane's dependencies and liveness guard) and `persysctl top`
(usage per node or workload)."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from persys.cli.ctl import (
    meter_cmds,
)
from persys.cli.ctl.api import (
    Api,
    OutputOpt,
    ServerOpt,
    age_text,
    emit,
    resource_kind,
    scalar_text,
)
from persys.cli.output import usage_rows


def health(output: str = OutputOpt, server: str | None = ServerOpt) -> None:
    """Show the control plane's health and operating mode, and each dependency (state store,
    event bus, secret store, meter, node runtimes): ok, or FAILING with the reason."""
    h = Api(server).request("GET", "/v1/health")
    t = Table(box=None, show_header=False, pad_edge=False)
    for k, v in h.items():
        if k == "liveness":
            t.add_row(k, _liveness_line(v))
            continue
        if k == "dependencies":  # one row each: ok or what is wrong
            t.add_row(k, "")
            for d in v:
                state = "ok" if d["ok"] else "FAILING"
                t.add_row(f"  {d['name']}", state + (f": {d['reason']}" if d.get("reason") else ""))
            continue
        t.add_row(k, ", ".join(f"{kk} {scalar_text(vv)}" for kk, vv in v.items()) if isinstance(v, dict)
                  else scalar_text(v))
    emit(h, output, t)


def _liveness_line(g: dict[str, Any]) -> str:
    if not g.get("suspended"):
        return f"judging {g.get('judgedNodes', 0)} nodes ({g.get('silentNodes', 0)} silent)"
    return (f"SUSPENDED for {age_text(g['since'])} ({g['reason']}): {g['silentNodes']} of {g['judgedNodes']} nodes "
            f"silent, not marked NotReady; ends in {max(0, int(g['endsAt'] - time.time()))}s at the latest "
            "(persysctl admin liveness resume ends it now)")


def top(
    kind: str = typer.Argument("workloads", help="workloads or nodes"),
    since: str = typer.Option("", "--since", help="Average and maximum over this window from Persys Meter "
                              "(e.g. 10m, 1h, 7d) instead of the last report."),
    output: str = OutputOpt,
    server: str | None = ServerOpt,
) -> None:
    """Resource usage as last reported by the agents (CPU, memory, disk and network I/O), or with
    --since averaged over a window from Persys Meter."""
    k = resource_kind(kind)
    if since:
        meter_cmds.top_since(k, since, output, server)
        return
    items = Api(server).request("GET", f"/v1/{k}")
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, justify in usage_rows.top_columns(k):
        t.add_column(col, justify=justify)
    rows = usage_rows.top_rows(k, items)
    for r in rows:  # Text: names and states are shown as they are, never read as markup
        t.add_row(*map(Text, usage_rows.top_cells(k, r)))
    emit(rows, output, t)
