"""`scale.py --compare REV`: the same benchmark on two commits, back to back, and their ratios.

    .venv/bin/python bench/scale/scale.py --compare 0e88e8f [--rounds 2] [any other option]

Absolute figures on these machines move 2-3x from hour to hour; two commits measured minutes
apart on the same machine, same etcd build and same hollow agents do not. REV is installed (not
editable, its generated protobuf modules included) into a temporary directory with `pip install
--no-deps --target`, and its scheduler runs from there (`--scheduler-src`); the driver, the hollow
agents, etcd and Redis are the working tree's for both runs, so only the scheduler differs. With
--rounds N the pairs alternate their order (REV first, then HEAD first, ...) so a machine that
slows down during the run does not favour one side. Each run's JSON is kept beside the summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = REPO / "bench" / "results"

# (label, how to read it from a run's results, lower is better)
FIGURES: list[tuple[str, Callable[[dict[str, Any]], float | None], bool]] = [
    ("scheduler CPU ms per placement", lambda r: _cpu_ms(r), True),
    ("durable placements/s", lambda r: r.get("burst", {}).get("placements_per_s"), False),
    ("placements/s / etcd txn/s (interleaved)", lambda r: _ratio(r), False),
    ("scheduler peak RSS MiB", lambda r: _mib(r.get("scheduler_peak_rss_bytes")), True),
    ("scheduler RSS KiB per workload", lambda r: (rss_per_item(r) or {}).get("workload_kib"), True),
    ("scheduler RSS KiB per node", lambda r: (rss_per_item(r) or {}).get("node_kib"), True),
    ("idle apply -> agent p99 ms", lambda r: _idle_p99(r), True),
    ("engine p99 ms per decision", lambda r: (r.get("engine_decision_latency") or {}).get("p99_ms"), True),
    ("heartbeat CPU ms each", lambda r: (r.get("heartbeat") or {}).get("cpu_ms_per_heartbeat"), True),
]


def _cpu_ms(r: dict[str, Any]) -> float | None:
    b = r.get("burst", {})
    done = b.get("assignments_committed")
    return None if not done or b.get("scheduler_cpu_seconds") is None else 1000 * b["scheduler_cpu_seconds"] / done


def _ratio(r: dict[str, Any]) -> float | None:
    rate = r.get("burst", {}).get("placements_per_s")
    base = r.get("baseline_etcd_txn", {}).get(f"concurrency_{r.get('args', {}).get('concurrency')}", {})
    return None if not rate or not base.get("txn_per_s") else rate / base["txn_per_s"]


def rss_per_item(res: dict[str, Any]) -> dict[str, float] | None:
    """Scheduler RSS growth per registered node and per workload placed, in KiB (None if not measured)."""
    at = res.get("scheduler_rss_bytes") or {}
    nodes, done = (res.get("registration") or {}).get("nodes"), (res.get("burst") or {}).get("assignments_committed")
    if not nodes or not done or not {"start", "nodes_registered", "burst_done"} <= set(at):
        return None
    return {"node_kib": (at["nodes_registered"] - at["start"]) / nodes / 1024,
            "workload_kib": (at["burst_done"] - at["nodes_registered"]) / done / 1024}


def _mib(v: float | None) -> float | None:
    return None if v is None else v / 2**20


def _idle_p99(r: dict[str, Any]) -> float | None:
    ip = r.get("idle_probe") or r.get("idle_probe_before_workloads") or {}
    p99 = ip.get("apply_sent_to_received", {}).get("p99_ms")
    return None if p99 is None else float(p99)


def install_rev(rev: str, into: Path) -> str:
    """REV's package, as `pip install` would build it, under `into`; returns the full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    tree = into / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True,
                   capture_output=True)
    try:
        print(f"compare: installing {commit[:12]} into {into / 'site'} (pip, no dependencies)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(into / "site"),
                        str(tree)], check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
    return commit


def run_one(label: str, argv: list[str], out: Path, src: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "scale.py"), *argv, "--out", str(out)]
    if src is not None:
        cmd += ["--scheduler-src", str(src)]
    print(f"compare: run {label}: {' '.join(cmd[2:])}", flush=True)
    code = subprocess.run(cmd).returncode
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"error": f"no results (exit {code})"}
    return res


def strip_compare(argv: list[str]) -> list[str]:
    """The options both runs share: everything but --compare REV, --rounds N and --out."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--compare", "--rounds", "--out", "--scheduler-src"):
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def table(rev: str, revs: list[dict[str, Any]], heads: list[dict[str, Any]]) -> str:
    lines = [f"{'figure':42} {'REV ' + rev[:10]:>16} {'HEAD':>16} {'HEAD / REV':>11}"]
    for label, get, lower_better in FIGURES:
        a = [v for v in map(get, revs) if v is not None]
        b = [v for v in map(get, heads) if v is not None]
        if not a or not b:
            lines.append(f"{label:42} {'-':>16} {'-':>16} {'-':>11}")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = mb / ma if ma else float("nan")
        # Within 5 % is what two runs of one commit differ by here: call it the same.
        better = "same" if abs(ratio - 1) <= 0.05 else "better" if (ratio < 1) == lower_better else "worse"
        lines.append(f"{label:42} {ma:16.3f} {mb:16.3f} {ratio:10.3f}x {better}")
    return "\n".join(lines)


def main(a: argparse.Namespace, argv: list[str]) -> int:
    shared = strip_compare(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="persys-compare-"))
    try:
        commit = install_rev(a.compare, work)
        revs: list[dict[str, Any]] = []
        heads: list[dict[str, Any]] = []
        for k in range(max(1, a.rounds)):
            order = [("rev", work / "site"), ("head", None)]
            for side, src in order if k % 2 == 0 else order[::-1]:
                res = run_one(f"{side} (round {k + 1})", shared, RESULTS / f"compare-{stamp}-{side}-{k + 1}.json", src)
                (revs if side == "rev" else heads).append(res)
        failed = [r["error"] for r in revs + heads if "error" in r]
        summary = {"rev": commit, "rounds": a.rounds, "args": shared,
                   "table": table(commit, revs, heads), "errors": failed}
        (RESULTS / f"compare-{stamp}.json").write_text(json.dumps(summary, indent=2))
        print(f"\n== scale benchmark: {commit[:12]} against the working tree, same run ==")
        print(summary["table"])
        for err in failed:
            print(f"error in a run: {err}")
        print(f"results: {RESULTS}/compare-{stamp}*.json")
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
