"""persysctl's wall time per command, against the interpreter's own start (a benchmark, not a test).

    .venv/bin/python bench/cli_latency.py [--rounds 20] [--workloads 20]

A scheduler, an agent (n1) and a gateway run as processes (tests.gateway.cluster, SQLite store)
with --workloads process workloads applied (5 cpu millicores each: they all run on n1). Each round
runs, as separate processes, in turn:

  python -c pass                   the interpreter starting and exiting: the floor of any CLI in Python
  python -c 'import httpx, rich.table, typer, yaml'   the third-party libraries persysctl is made of
  persysctl --version              persysctl's imports and its command tree, no request
  persysctl get workloads          one mutual-TLS request and a table (target < 150 ms): the quick
                                   path (persys.cli.quick.entry: the standard library, no typer/rich/httpx)
  persysctl get workloads -o json
  full client get workloads        the same command through the full client (python -m
                                   persys.cli.ctl.app: typer's command tree, rich, httpx), the baseline
  persysctl describe workload W    two requests (the workload, its events) and its text: the quick
  full client describe workload W  path (persys.cli.quick.verbs) and the full client
  persysctl delete workload D      the delete and its --wait polling (the workload is applied again,
  full client delete workload D    untimed, before each; too large for any node: it is gone at once)
  persysctl apply -f one file      one small manifest, unchanged: the quick path (persys.cli.quick.apply:
  full client apply -f one file    the gateway validates) and the full client (validates locally first)
  persysctl logs W                 the last 100 lines of a running process: the quick path
  full client logs W               (persys.cli.quick.reads) and the full client
  persysctl events                 the last 50 events as a table
  full client events
  persysctl top                    the workloads' last reported usage as a table
  full client top
  python -c 'import persys.model.kinds, persys.cli.ctl.views'   what loading the full client's models costs

Printed: the median and p90 wall time of each, and each persysctl figure as a ratio of the
interpreter's start measured in the same run; beside them the command's own CPU time (user +
system, median) and its ratio to the interpreter's: on a busy machine wall time mostly measures
the other tenants, CPU time much less so. (kubectl answers `version --client` in ~40 ms and
`get pods` in ~100 ms on a laptop: a Go binary pays no interpreter).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import BIN, ctl, process_manifest  # noqa: E402
from tests.gateway.cluster import ready_cluster  # noqa: E402
from tests.waiting import eventually  # noqa: E402

PY = str(BIN / "python")
LIBS = "import httpx, rich.table, typer, yaml"


CPU: dict[str, list[float]] = {}  # the command's own CPU time (user + system), what load hardly changes


def timed(argv: list[str], env: dict[str, str], name: str = "") -> float:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    took = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.decode()[-500:]}")
    CPU.setdefault(name, []).append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--workloads", type=int, default=20)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="persys-cli-bench-") as tmp:
        with ready_cluster(Path(tmp)) as cluster:
            env = {**os.environ, **cluster.ctl_env()}
            ctl("apply", "-f", "-", env=env, stdin="---\n".join(process_manifest(f"w-{i:03d}", cpu=5)
                                                                 for i in range(args.workloads)))
            cases = {
                "python -c pass": [PY, "-c", "pass"],
                "python -c 'import httpx, rich.table, typer, yaml'": [PY, "-c", LIBS],
                "persysctl --version": [str(BIN / "persysctl"), "--version"],
                "persysctl get workloads": [str(BIN / "persysctl"), "get", "workloads"],
                "persysctl get workloads -o json": [str(BIN / "persysctl"), "get", "workloads", "-o", "json"],
                "full client get workloads": [PY, "-m", "persys.cli.ctl.app", "get", "workloads"],
            }
            manifest = Path(tmp) / "one.yaml"
            manifest.write_text(process_manifest("w-000", cpu=5))
            eventually(lambda: ctl("logs", "w-000", env=env, check=False).returncode == 0, timeout=60,
                       what="w-000 running")
            pctl, full = [str(BIN / "persysctl")], [PY, "-m", "persys.cli.ctl.app"]
            cases |= {
                "persysctl describe workload W": [*pctl, "describe", "workload", "w-000"],
                "full client describe workload W": [*full, "describe", "workload", "w-000"],
                "persysctl delete workload D": [*pctl, "delete", "workload", "d-quick"],
                "full client delete workload D": [*full, "delete", "workload", "d-full"],
                "persysctl apply -f one file": [*pctl, "apply", "-f", str(manifest)],
                "full client apply -f one file": [*full, "apply", "-f", str(manifest)],
                "persysctl logs W": [*pctl, "logs", "w-000"],
                "full client logs W": [*full, "logs", "w-000"],
                "persysctl events": [*pctl, "events"],
                "full client events": [*full, "events"],
                "persysctl top": [*pctl, "top"],
                "full client top": [*full, "top"],
                "python -c 'import persys.model.kinds, persys.cli.ctl.views'":
                    [PY, "-c", "import persys.model.kinds, persys.cli.ctl.views"],
            }
            to_delete = {"persysctl delete workload D": "d-quick", "full client delete workload D": "d-full"}

            def once(name: str) -> float:
                if name in to_delete:  # something to delete, applied untimed
                    ctl("apply", "-f", "-", env=env, stdin=process_manifest(to_delete[name], cpu=10_000_000))
                return timed(cases[name], env, name)

            for name in cases:  # warm the page cache and the bytecode caches
                once(name)
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.rounds):  # interleaved: a load change hits every case alike
                for name in cases:
                    times[name].append(once(name))
    floor = statistics.median(times["python -c pass"])
    cpu_floor = statistics.median(CPU["python -c pass"])
    print(f"{'command':<52} {'median':>9} {'p90':>9} {'x python start':>15} {'CPU':>8} {'x':>6}")
    for name, xs in times.items():
        xs.sort()
        med, p90 = statistics.median(xs), xs[int(len(xs) * 0.9) - 1]
        cpu = statistics.median(CPU[name])
        print(f"{name:<52} {med * 1e3:7.1f}ms {p90 * 1e3:7.1f}ms {med / floor:14.1f}x {cpu * 1e3:6.1f}ms "
              f"{cpu / cpu_floor:5.1f}x")
    for verb in ("get workloads", "describe workload W", "delete workload D", "apply -f one file", "logs W",
                 "events", "top"):
        quick, full = (statistics.median(times[f"{who} {verb}"]) for who in ("persysctl", "full client"))
        print(f"{verb}: the quick path takes {quick / full:.2f}x the full client's time (median, same run)")
    print(f"load average: {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} at its end "
          f"(1 min; on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
