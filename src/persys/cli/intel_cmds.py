"""persysctl's Persys Intelligence commands (docs/intelligence.md): `why`, and the read-only
analyses that follow it. Every answer comes from the gateway's /v1/why, /v1/rightsize,
/v1/forecast and /v1/insights routes; nothing here changes the cluster."""

from __future__ import annotations

from typing import Any

import typer

from persys.cli.api import Api, ServerOpt, emit, fail, out
from persys.cli.safe_text import cell

WHY_HELP = """Why a workload (or a node, or the control plane) is as it is: ranked findings, each
citing the evidence it rests on (store document@revision, event ids, meter query and range, log
lines). Read-only: the analysis reads as its own viewer identity and changes nothing.

  persysctl why web                 (a workload)

  persysctl why node n1

  persysctl why cluster             (store, event bus, secret store, meter, nodes)

  persysctl why web -o json         (the findings and the whole evidence bundle)

An investigation that finds nothing says so, and lists what it looked at."""


def _print_findings(r: dict[str, Any]) -> None:
    out.print(f"why {cell(r['subject'])}", markup=False, highlight=False)
    if r["inconclusive"]:
        out.print("  inconclusive: no rule found a cause. Looked at:", markup=False, highlight=False)
        for x in r["lookedAt"]:
            out.print(f"    {cell(x)}", markup=False, highlight=False)
        return
    for i, f in enumerate(r["findings"], 1):
        out.print(f"{i:>3}. {f['cause']} ({f['score']:.0f})  {cell(f['summary'])}", markup=False, highlight=False)
        out.print(f"       evidence: {cell(', '.join(f['evidence']))}", markup=False, highlight=False)
        if f.get("remedy"):
            out.print(f"       fix: {cell(f['remedy'])}", markup=False, highlight=False)
    gaps = [x for x in r["lookedAt"] if ":" in x and not x.startswith(("workload/", "node/", "event:", "meter:",
                                                                           "log:", "health/", "explain/"))]
    out.print(f"  looked at {len(r['lookedAt'])} items" + (f"; not seen: {cell('; '.join(gaps))}" if gaps else ""),
              markup=False, highlight=False)


def why_command(
    target: str = typer.Argument(..., help="A workload's name, or `node`, or `cluster`."),
    name: str = typer.Argument("", help="The node's name (with `node`), or the workload's (with `workload`)."),
    output: str = typer.Option("table", "--output", "-o", help="table, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    if target == "node":
        if not name:
            fail("why node: name the node (persysctl why node n1)")
        path = f"/v1/why/nodes/{name}"
    elif target == "cluster":
        path = "/v1/why/cluster"
    elif target == "workload":
        if not name:
            fail("why workload: name the workload (persysctl why workload web)")
        path = f"/v1/why/workloads/{name}"
    else:
        if name:
            fail(f"why: {target!r} takes no second argument (persysctl why WORKLOAD | why node N | why cluster)")
        path = f"/v1/why/workloads/{target}"
    r = Api(server).request("GET", path)
    if output in ("json", "yaml"):
        emit(r, output)
        return
    _print_findings(r)


def register(app: typer.Typer) -> None:
    app.command("why", help=WHY_HELP, no_args_is_help=True)(why_command)
