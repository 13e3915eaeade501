"""persysctl's Persys Intelligence commands (docs/intelligence.md): `why`, and the read-only
analyses that follow it. Every answer comes from the gateway's /v1/why, /v1/rightsize,
/v1/forecast and /v1/insights routes; nothing here changes the cluster."""

from __future__ import annotations

from typing import Any

import typer

from persys.cli.ctl.api import Api, ServerOpt, emit, fail, out
from persys.cli.output.safe_text import cell

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
    narrate: bool = typer.Option(False, "--narrate", help="Also prose from the narration endpoint the gateway "
                                 "is configured with (off unless configured; shows what was sent)."),
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
    r = Api(server).request("GET", path, params={"narrate": "true"} if narrate else None)
    if output in ("json", "yaml"):
        emit(r, output)
        return
    _print_findings(r)
    n = r.get("narration")
    if n is not None:
        if not n.get("enabled"):
            out.print("  narration: not configured (PERSYS_NARRATION_URL on the gateway)", markup=False,
                      highlight=False)
        else:
            out.print(f"  narration ({cell(n['endpoint'])}, anonymised: {n['anonymized']}): "
                      f"{cell(n.get('text') or n.get('error', ''))}", markup=False, highlight=False)


INSIGHTS_HELP = """Cluster-wide recommendations, each with its evidence and expected effect: the control
plane's failures, the likeliest cause of each failing workload, rightsizing (from 7 days of meter
history) and nodes that could be emptied (where their instances would go). Read-only.

  persysctl insights

  persysctl insights -o json        (with the consolidation plan in full)"""


def insights_command(
    output: str = typer.Option("table", "--output", "-o", help="table, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    r = Api(server).request("GET", "/v1/insights")
    if output in ("json", "yaml"):
        emit(r, output)
        return
    if not r["recommendations"]:
        out.print(f"no recommendation (looked at {len(r['lookedAt'])} items)", markup=False, highlight=False)
    for i, x in enumerate(r["recommendations"], 1):
        out.print(f"{i:>3}. [{x['kind']}] {cell(x['subject'])}: {cell(x['summary'])}", markup=False, highlight=False)
        out.print(f"       effect: {cell(x['expectedEffect'])}", markup=False, highlight=False)
        out.print(f"       evidence: {cell(', '.join(x['evidence']))}", markup=False, highlight=False)


RIGHTSIZE_HELP = """Recommended CPU and memory requests for a workload from its Persys Meter history, with a
backtest over the same samples and a confidence from how much history there is.

  persysctl rightsize web                 (the last 7 days)

  persysctl rightsize web --since 30d -o json

CPU: the decaying p90 plus 10 %; memory: never below the peak seen, the peak plus 15 %. The
backtest counts, at the current request and at the target, the CPU samples above the request
(throttled) and the memory samples above it (killed). Nothing is changed: apply it yourself."""

FORECAST_HELP = """A node's (or the whole cluster's) usage over a horizon, with 80 % intervals and the
forecast's own backtest: MASE against seasonal naive and the interval's coverage on held-out
history. "unpredictable" when it does not beat seasonal naive or the history's mean.

  persysctl forecast node n1 --metric memory --horizon 1d

  persysctl forecast cluster --metric cpu --since 14d --horizon 2d -o json"""


def _res_line(name: str, r: dict[str, Any] | None) -> str:
    if r is None:
        return f"  {name:<7} no samples"
    u = r["unit"]
    bt_cur, bt_tgt = r["backtest"]["atCurrent"], r["backtest"]["atTarget"]
    what = "throttled" if name == "cpu" else "over memory"
    return (f"  {name:<7} target {r['target']} {u} (range {r['lower']}-{r['upper']}), current {r['current']} {u}, "
            f"peak {r['observedPeak']} {u}\n          at current: {bt_cur['over']}/{bt_cur['samples']} samples "
            f"{what}; at target: {bt_tgt['over']}/{bt_tgt['samples']}" + "".join(f"\n          note: {n}"
                                                                                for n in r.get("notes", [])))


def rightsize_command(
    workload: str = typer.Argument(..., help="The workload's name."),
    since: str = typer.Option("7d", "--since", help="History to use: 6h, 7d, 30d (at most 400d)."),
    output: str = typer.Option("table", "--output", "-o", help="table, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    r = Api(server).request("GET", f"/v1/rightsize/workloads/{workload}", params={"since": since})
    if output in ("json", "yaml"):
        emit(r, output)
        return
    out.print(f"rightsize workload/{cell(workload)}: {r['samples']} samples over {r['historySeconds'] / 3600:.1f} h, "
              f"confidence {r['confidence']:.2f} ({r['confidenceText']})", markup=False, highlight=False)
    out.print(_res_line("cpu", r["cpu"]), markup=False, highlight=False)
    out.print(_res_line("memory", r["memory"]), markup=False, highlight=False)
    for n in [*r.get("notes", []), *r.get("lookedAt", [])]:
        out.print(f"  {cell(n)}", markup=False, highlight=False)


def forecast_command(
    target: str = typer.Argument(..., help="`node` or `cluster`."),
    name: str = typer.Argument("", help="The node's name (with `node`)."),
    metric: str = typer.Option("cpu", "--metric", "-m", help="cpu, memory, disk (space used), disk-read or "
                               "disk-write."),
    since: str = typer.Option("14d", "--since", help="History to fit on (a daily season needs 3 days)."),
    horizon: str = typer.Option("1d", "--horizon", help="How far ahead: 6h, 1d, 7d."),
    output: str = typer.Option("table", "--output", "-o", help="table, json or yaml."),
    server: str | None = ServerOpt,
) -> None:
    if target == "node" and not name:
        fail("forecast node: name the node (persysctl forecast node n1)")
    if target not in ("node", "cluster"):
        fail(f"forecast: {target!r} is not `node` or `cluster`")
    path = f"/v1/forecast/nodes/{name}" if target == "node" else "/v1/forecast/cluster"
    r = Api(server).request("GET", path, params={"metric": metric, "since": since, "horizon": horizon})
    if output in ("json", "yaml"):
        emit(r, output)
        return
    out.print(f"forecast {cell(r['subject'])} {metric}: {r['verdict']}", markup=False, highlight=False)
    if r.get("error"):
        out.print(f"  {cell(r['error'])}", markup=False, highlight=False)
        return
    out.print(f"  backtest over {r['backtestPoints']} held-out points: MASE {r['mase']} (vs seasonal naive), "
              f"MAE/mean {r['maeVsMean']}, 80 % interval coverage {r['coverage80']}", markup=False, highlight=False)
    pts = r["points"]
    for p in (pts[len(pts) // 4 - 1], pts[len(pts) // 2 - 1], pts[-1]) if len(pts) >= 4 else pts:
        out.print(f"  +{(p[0] - pts[0][0]) / 3600 + r['step'] / 3600:.1f} h: {p[1]:.1f} ({p[2]:.1f} .. {p[3]:.1f}) "
                  f"{r['unit']}", markup=False, highlight=False)
    out.print(f"  model: {r['model']}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("why", help=WHY_HELP, no_args_is_help=True)(why_command)
    app.command("rightsize", help=RIGHTSIZE_HELP, no_args_is_help=True)(rightsize_command)
    app.command("forecast", help=FORECAST_HELP, no_args_is_help=True)(forecast_command)
    app.command("insights", help=INSIGHTS_HELP)(insights_command)
