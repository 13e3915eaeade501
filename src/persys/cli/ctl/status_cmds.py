"""`persysctl health` (the control plane's dependencies and liveness guard) and `persysctl top`
(usage per node or workload)."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.table import Table

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
    size_text,
)


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
    if k == "workloads":
        for col in ("NAME", "TYPE", "READY", "NODE", "CPU%", "MEMORY", "DISK READ", "DISK WRITE", "NET RX", "NET TX"):
            t.add_column(col, justify="right" if col not in ("NAME", "TYPE", "NODE") else "left")
        rows = [{"name": w["name"], "type": w["type"], "ready": w["ready"], "node": ",".join(w["nodes"]) or "-",
                 **w["usage"]} for w in items]
        for r in rows:
            # A host process shares the node's network: its traffic is not measured, not zero.
            net = ("-", "-") if r["type"] == "process" else (size_text(r["netRxBytes"]), size_text(r["netTxBytes"]))
            t.add_row(r["name"], r["type"], r["ready"], r["node"], f"{r['cpuPercent']:.1f}",
                      size_text(r["memoryBytes"]), size_text(r["diskReadBytes"]), size_text(r["diskWriteBytes"]),
                      *net)
    else:
        for col in ("NAME", "STATUS", "CPU%", "MEMORY USED", "WORKLOADS"):
            t.add_column(col)
        rows = [{"name": n["id"], "status": n["status"], **n.get("usage", {})} for n in items]
        for r in rows:
            t.add_row(r["name"], r["status"], f"{r.get('cpuPercent', 0):.1f}", f"{r.get('memoryUsedMb', 0)} MiB",
                      str(r.get("workloads", 0)))
    emit(rows, output, t)
