"""persysctl's Persys Meter commands: `meter query` (a table, JSON or a terminal sparkline per
series) and `top --since` (usage averaged over a window instead of the last report)."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.table import Table

from persys.cli.ctl.api import Api, ServerOpt, emit, fail, out, size_text
from persys.cli.output.safe_text import cell

meter_app = typer.Typer(
    help="Usage history from Persys Meter (per workload instance and per node).\n\n"
         "  persysctl meter query --workload web --metric cpu --since 24h --step 1m\n\n"
         "  persysctl meter query --node n1 --metric memory --since 7d --step 1h --agg max -o spark\n\n"
         "  persysctl meter query --label app=shop --metric net-rx -o json",
    no_args_is_help=True)

BLOCKS = "▁▂▃▄▅▆▇█"
METRICS = ("cpu", "memory", "disk-read", "disk-write", "net-rx", "net-tx", "disk-used")  # disk-used: nodes


def sparkline(values: list[float], width: int = 60) -> str:
    """Values as block characters from zero (or the lowest, if negative) to the highest, averaged
    down to `width` columns."""
    if not values:
        return ""
    if len(values) > width:
        per = len(values) / width
        values = [sum(chunk) / len(chunk) for i in range(width)
                  if (chunk := values[int(i * per):max(int((i + 1) * per), int(i * per) + 1)])]
    lo, hi = min(0.0, min(values)), max(values)  # from zero: a flat 30 % must not look like a swing
    span = hi - lo
    return "".join(BLOCKS[int((v - lo) / span * (len(BLOCKS) - 1)) if span else 0] for v in values)


def value_text(metric: str, v: float) -> str:
    """A metric's value in its unit: CPU in percent of one core, memory in bytes, I/O per second."""
    if metric == "cpu":
        return f"{v:.1f}%"
    return size_text(v) + ("" if metric == "memory" else "/s")


def _selector(workload: str, node: str, label: str) -> tuple[str, str]:
    given = [(k, v) for k, v in (("workloads", workload), ("nodes", node), ("labels", label)) if v]
    if len(given) != 1:
        fail("give exactly one of --workload, --node or --label")
    return given[0]


@meter_app.command("query")
def query(
    workload: str = typer.Option("", "--workload", "-w", help="A workload's instances."),
    node: str = typer.Option("", "--node", help="A node's own usage (from its heartbeats)."),
    label: str = typer.Option("", "--label", "-l", help="Instances of workloads labelled key=value."),
    metric: str = typer.Option("cpu", "--metric", "-m", help="cpu (percent of one core), memory (bytes), "
                               "disk-read, disk-write, net-rx, net-tx (bytes per second)."),
    since: str = typer.Option("1h", "--since", help="How far back: 30m, 24h, 7d (at most 400d)."),
    step: str = typer.Option("1m", "--step", help="One point per step (at least 10s; at most 5000 points)."),
    agg: str = typer.Option("avg", "--agg", help="Within a step: avg, max, min, sum or last."),
    output: str = typer.Option("table", "--output", "-o", help="table, json, yaml or spark (a sparkline per "
                               "series)."),
    server: str | None = ServerOpt,
) -> None:
    """Usage over time, one series per instance (or the node), from Persys Meter."""
    if metric not in METRICS:
        fail(f"--metric: must be one of {', '.join(METRICS)}")
    kind, name = _selector(workload, node, label)
    r = Api(server).request("GET", f"/v1/meter/{kind}/{name}",
                            params={"since": since, "step": step, "metric": metric, "agg": agg})
    if output == "spark":
        for s in r["series"]:
            values = [p[1] for p in s["points"]]
            summary = (f"min {value_text(metric, min(values))}  max {value_text(metric, max(values))}"
                       if values else "no samples")
            out.print(f"{cell(s['key'])}  {sparkline(values)}  {summary}", markup=False, highlight=False)
        if not r["series"]:
            out.print("no samples in this window", markup=False)
        return
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("SERIES", "NODE", "TIME", f"{metric.upper()} ({agg})"):
        t.add_column(col)
    for s in r["series"]:
        for ts, v in s["points"]:
            t.add_row(cell(s["key"]), cell(s["node"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)),
                      value_text(metric, v))
    emit(r, output, t)


@meter_app.command("status")
def status(output: str = typer.Option("yaml", "--output", "-o", help="yaml or json."),
           server: str | None = ServerOpt) -> None:
    """Samples published and dropped by the answering replica; the meter's engine, ingest backlog
    and lag where it runs."""
    emit(Api(server).request("GET", "/v1/meter/status"), output)


def top_since(kind: str, since: str, output: str, server: str | None) -> None:
    """`persysctl top --since`: averages and maxima over the window from Persys Meter."""
    r = Api(server).request("GET", "/v1/meter/top", params={"kind": kind, "since": since})
    t = Table(box=None, header_style="bold", pad_edge=False)
    cols = ["NAME", *(["NODE"] if kind == "workloads" else []), "CPU% AVG", "CPU% MAX", "MEMORY AVG", "MEMORY MAX",
            "DISK R/s", "DISK W/s", "NET RX/s", "NET TX/s", "SAMPLES"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("NAME", "NODE") else "right")
    rows: list[dict[str, Any]] = r["items"]
    for i in rows:
        a, m = i["avg"], i["max"]
        t.add_row(cell(i["name"]), *([cell(i["node"])] if kind == "workloads" else []),
                  f"{a.get('cpu', 0):.1f}", f"{m.get('cpu', 0):.1f}", size_text(a.get("memory", 0)),
                  size_text(m.get("memory", 0)), *(size_text(a.get(k, 0)) for k in METRICS[2:6]), str(i["samples"]))
    emit(rows, output, t)
