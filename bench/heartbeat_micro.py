"""What one heartbeat costs the scheduler: its CPU per heartbeat, on a real scheduler process.

    .venv/bin/python bench/heartbeat_micro.py                      # 500 nodes, one beat per second each
    .venv/bin/python bench/heartbeat_micro.py --compare 0e88e8f    # that commit's scheduler too, same run
    .venv/bin/python bench/heartbeat_micro.py --profile            # + a py-spy profile of a beating window

The set-up is the scale benchmark's (bench/scale): etcd and Redis as processes, `persys scheduler`
with TLS, and hollow agents (bench/scale/hollow.py) whose nodes heartbeat on their update streams
at `--heartbeat-interval`. No workload is applied: the scheduler does nothing but take heartbeats.

The measure is a same-run difference: the scheduler's CPU (utime + stime from /proc) over windows
with heartbeats paused (the nodes stay connected) and windows with them flowing, alternated
`--rounds` times; the marginal CPU per heartbeat is (beating CPU/s - paused CPU/s) / heartbeats/s,
median over the rounds. Heartbeats are counted by the hollow agents (heartbeats sent and answered).
With `--compare REV` the same is run on REV's scheduler (installed as bench/scale/compare.py does)
and the working tree's, alternating order per pair. Results go to bench/results/heartbeat-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "scale"))

import compare  # noqa: E402 - bench/scale's modules, found through the path set above
import hotspots  # noqa: E402
import infra  # noqa: E402
import scale  # noqa: E402

RESULTS = HERE / "results"
GOAL_MS = 0.05  # issue #33: heartbeat CPU per node per interval


def log(msg: str) -> None:
    print(f"[heartbeat {time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def _counted(bench: scale.Bench) -> int:
    """Heartbeats the hollow agents had answered (an answer on the stream, or a call's reply)."""
    st = await bench.hollow_stats()
    return int(st["heartbeats_ok"])


async def _window(bench: scale.Bench, seconds: float) -> tuple[float, int, float]:
    """(scheduler CPU seconds, heartbeats, wall seconds) over one window."""
    h0, c0, t0 = await _counted(bench), bench.sched_cpu(), time.monotonic()
    await asyncio.sleep(seconds)
    c1, t1 = bench.sched_cpu(), time.monotonic()
    h1 = await _counted(bench)
    return c1 - c0, h1 - h0, t1 - t0


async def _profile(bench: scale.Bench, seconds: float) -> Path | None:
    """py-spy with native frames (gRPC's C core, protobuf) if it can, else Python frames only."""
    assert bench.sched is not None
    spy = shutil.which("py-spy", path=str(scale.BIN)) or shutil.which("py-spy")
    if spy is None:
        log("py-spy not found: no profile")
        return None
    out = bench.dir / "heartbeat-pyspy.txt"
    for native in (["--native"], []):
        child = infra.Child("py-spy", [spy, "record", "--pid", str(bench.sched.pid), "--duration", str(int(seconds)),
                                       "--rate", "200", *native, "--format", "raw", "--output", str(out)],
                            bench.dir, stop_signal=signal.SIGINT)
        await asyncio.to_thread(child.proc.wait)
        child.stop()
        if out.exists():
            return out
        log(f"py-spy {' '.join(native)} wrote nothing: {child.text()[-600:]}")
    return None


async def measure(bench: scale.Bench, a: argparse.Namespace) -> dict[str, Any]:
    await bench._register_phase()
    await bench.hollow_all({"cmd": "pause", "value": True})
    # Beats in flight are answered. A pause longer than the agents' ack deadline (2 intervals)
    # sets their watchdogs probing (no call is made while paused: the scheduler's idle CPU is
    # not changed by it, the hollow process's is).
    await asyncio.sleep(max(2.0, a.heartbeat_interval))
    rounds: list[dict[str, Any]] = []
    for k in range(a.rounds):
        await bench.hollow_all({"cmd": "pause", "value": True})
        await asyncio.sleep(0.5)
        idle_cpu, _, idle_s = await _window(bench, a.idle)
        await bench.hollow_all({"cmd": "pause", "value": False})
        await asyncio.sleep(a.heartbeat_interval)  # every node is beating again (phases spread)
        cpu, hbs, secs = await _window(bench, a.window)
        idle_rate, rate = idle_cpu / idle_s, hbs / secs
        marginal = 1000 * (cpu / secs - idle_rate) / rate if rate else None
        rounds.append({"idle_cpu_per_s": round(idle_rate, 4), "beating_cpu_per_s": round(cpu / secs, 4),
                       "heartbeats_per_s": round(rate, 1), "cpu_ms_per_heartbeat": round(1000 * cpu / hbs, 4)
                       if hbs else None, "marginal_cpu_ms_per_heartbeat": round(marginal, 4)
                       if marginal is not None else None, "load1": os.getloadavg()[0]})
        log(f"round {k + 1}: paused {idle_rate * 100:.1f} % of a core, beating {cpu / secs * 100:.1f} % at "
            f"{rate:.0f}/s: {rounds[-1]['marginal_cpu_ms_per_heartbeat']} ms marginal CPU per heartbeat "
            f"(load {os.getloadavg()[0]:.1f})")
    out: dict[str, Any] = {"rounds": rounds}
    # A round whose nodes did not keep their rate (a starved hollow process: at 5,000 nodes the
    # agents' ack watchdogs, expired during the pause, probe every second) divides the idle
    # correction by too few heartbeats: left out of the median, kept in the rounds.
    expected = a.nodes / a.heartbeat_interval
    margins = [r["marginal_cpu_ms_per_heartbeat"] for r in rounds
               if r["marginal_cpu_ms_per_heartbeat"] is not None and r["heartbeats_per_s"] >= 0.8 * expected]
    out["marginal_cpu_ms_per_heartbeat_median"] = round(statistics.median(margins), 4) if margins else None
    if a.profile:
        path = await _profile(bench, a.profile_seconds)
        if path is not None:
            out["profile"] = hotspots.from_pyspy(path, top=25)
            keep = RESULTS / f"heartbeat-{time.strftime('%Y%m%d-%H%M%S')}-pyspy.txt"
            RESULTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, keep)
            out["profile_file"] = str(keep)
    return out


def run_one(a: argparse.Namespace, src: Path | None) -> dict[str, Any]:
    """One scheduler (the working tree's, or `src`'s), measured; every process stopped after."""
    argv = ["--quick", "--nodes", str(a.nodes), "--heartbeat-interval", str(a.heartbeat_interval),
            "--channels", str(a.channels), "--node-grace", str(max(40.0, 4 * a.heartbeat_interval))]
    sa = scale.parse_args(argv)
    sa.scheduler_src = src
    workdir = Path(tempfile.mkdtemp(prefix="persys-heartbeat-"))
    res: dict[str, Any] = {}
    bench = scale.Bench(sa, workdir, res)
    try:
        bench.setup()
        res.update(asyncio.run(measure(bench, a)))
    finally:
        bench.stop_cluster()
        infra.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500, help="hollow nodes (default 500)")
    ap.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between a node's heartbeats")
    ap.add_argument("--channels", type=int, default=8, help="mTLS connections the hollow nodes share")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of heartbeats per round")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds with heartbeats paused per round")
    ap.add_argument("--rounds", type=int, default=3, help="paused/beating pairs per scheduler")
    ap.add_argument("--profile", action="store_true", help="a py-spy profile (native frames) of a beating window")
    ap.add_argument("--profile-seconds", type=float, default=15.0)
    ap.add_argument("--compare", metavar="REV", help="also REV's scheduler, same run (pairs alternating)")
    ap.add_argument("--pairs", type=int, default=1, help="with --compare: REV/HEAD runs each")
    a = ap.parse_args(argv)
    atexit.register(infra.stop_all)
    runs: dict[str, list[dict[str, Any]]] = {"head": []}
    work = Path(tempfile.mkdtemp(prefix="persys-heartbeat-rev-"))
    try:
        src: Path | None = None
        if a.compare:
            runs["rev"] = []
            compare.install_rev(a.compare, work)
            src = work / "site"
        for k in range(a.pairs if a.compare else 1):
            order: list[tuple[str, Path | None]] = [("head", None)] + ([("rev", src)] if a.compare else [])
            for side, where in order if k % 2 == 0 else order[::-1]:
                log(f"{side} scheduler, pair {k + 1}: {a.nodes} nodes beating every {a.heartbeat_interval} s")
                runs[side].append(run_one(a, where))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"benchmark": "heartbeat_micro", "args": vars(a), "load_at_end": os.getloadavg(), "runs": runs,
           "goal_ms": GOAL_MS}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"heartbeat-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=2, default=str))
    for side, rs in runs.items():
        ms = [r["marginal_cpu_ms_per_heartbeat_median"] for r in rs if r.get("marginal_cpu_ms_per_heartbeat_median")]
        med = statistics.median(ms) if ms else None
        res[f"{side}_ms"] = med
        print(f"{side:5} marginal scheduler CPU per heartbeat: {med if med is None else round(med, 4)} ms "
              f"(runs: {ms}; goal {GOAL_MS} ms)")
    if a.compare and res.get("head_ms") and res.get("rev_ms"):
        print(f"HEAD / {a.compare}: {res['head_ms'] / res['rev_ms']:.2f}x")
    for r in runs["head"]:
        for line in (r.get("profile") or {}).get("top_self", [])[:25]:
            print(f"  {line['pct']:5.1f} %  {line['function']}")
    print(f"results: {out}; load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
