"""What metrics cost the scheduler: the scale benchmark's placement throughput with metrics off
(`persys scheduler --no-metrics`: no gRPC interceptor, no store wrapper, nothing served) and on
(the default counting, served on a plain listener and scraped every second through the whole run,
15 times as often as Prometheus' default), in the same invocation on the same machine.

    .venv/bin/python bench/metrics_overhead.py            # 500 nodes, 5,000 workloads per run (~2 x 1.5 min)
    .venv/bin/python bench/metrics_overhead.py --nodes 1000 --workloads 10000

First the seams in-process (bench/metrics_micro.py: a counter, a histogram, the gRPC
interceptor per call, one scrape of a mirror of the same size). Then placements/s for both
runs, the ratio on/off, and the same ratio normalised by each run's
raw etcd transaction rate (the scale benchmark's own baseline: absolute rates on a shared machine
drift between runs; their share of what etcd can do drifts less). Target (issue #15): metrics
and tracing together cost under 5 % of placement throughput. Tracing's share is measured by
the tracing part (bench/ of its branch). Results: bench/results/metrics-overhead-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_COST = 0.05


def run(mode: str, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    argv = [sys.executable, str(HERE / "scale" / "scale.py"), "--quick", "--nodes", str(a.nodes),
            "--workloads", str(a.workloads), "--profiler", "none", "--probe", "0", "--no-hb-before",
            "--hb-window", "2", "--hb-idle", "1", "--metrics", mode, "--out", str(out)]
    print(f"== metrics {mode}: {' '.join(argv[1:])}", flush=True)
    subprocess.run(argv, check=False, timeout=a.timeout)
    res: dict[str, Any] = json.loads(out.read_text())
    if res.get("error"):
        raise SystemExit(f"the {mode} run failed: {res['error']}")
    return res


def figures(res: dict[str, Any]) -> dict[str, Any]:
    b = res.get("burst", {})
    rate = b.get("placements_per_s")
    base = res.get("baseline_etcd_txn", {}).get(f"concurrency_{res['args']['concurrency']}", {}).get("txn_per_s")
    return {"placements_per_s": rate, "sustained_placements_per_s": b.get("sustained_placements_per_s"),
            "etcd_txn_per_s": base, "share_of_etcd": round(rate / base, 4) if rate and base else None,
            "scheduler_cpu_seconds": res.get("scheduler_cpu_seconds_total"),
            "engine_p99_ms": (res.get("engine_decision_latency") or {}).get("p99_ms"),
            "scrapes": res.get("metrics_scrapes")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per run")
    a = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    import metrics_micro

    micro = metrics_micro.measure(nodes=a.nodes, workloads=a.workloads)
    print(f"== seams in-process: {json.dumps(micro)}", flush=True)
    off = figures(run("off", a, RESULTS / f"metrics-overhead-{stamp}-off.json"))
    on = figures(run("scraped", a, RESULTS / f"metrics-overhead-{stamp}-on.json"))
    ratio = on["placements_per_s"] / off["placements_per_s"] if on["placements_per_s"] and off["placements_per_s"] \
        else None
    norm = on["share_of_etcd"] / off["share_of_etcd"] if on["share_of_etcd"] and off["share_of_etcd"] else None
    summary = {"nodes": a.nodes, "workloads": a.workloads, "micro": micro, "off": off, "on": on,
               "ratio_on_over_off": None if ratio is None else round(ratio, 3),
               "ratio_normalised_by_etcd": None if norm is None else round(norm, 3)}
    (RESULTS / f"metrics-overhead-{stamp}.json").write_text(json.dumps(summary, indent=2))
    print(f"\nmetrics off: {off['placements_per_s']} placements/s (etcd {off['etcd_txn_per_s']} txn/s)")
    print(f"metrics on, scraped every 1 s: {on['placements_per_s']} placements/s (etcd {on['etcd_txn_per_s']} txn/s,"
          f" {on['scrapes']})")
    print(f"ratio on/off: {summary['ratio_on_over_off']}; normalised by etcd: {summary['ratio_normalised_by_etcd']}")
    h = micro["helpers"]
    print(f"seams: counter {h['counter_inc_ns']} ns, histogram {h['histogram_observe_ns']} ns, "
          f"gRPC interceptor {micro['grpc']['interceptor_us_per_call']} us/call, one scrape of the mirror "
          f"{micro['scrape']['scrape_ms_median']} ms")
    cost = None if norm is None else 1 - norm
    verdict = "n/a" if cost is None else ("PASS" if cost < TARGET_COST else "FAIL")
    print(f"target: metrics cost < {TARGET_COST:.0%} of placement throughput: "
          f"{'n/a' if cost is None else f'{cost:+.1%}'} -> {verdict} (tracing's share: see the tracing part)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
