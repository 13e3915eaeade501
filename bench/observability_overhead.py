"""What metrics and tracing together cost the scale benchmark's placement throughput (issue #15's
target: under 5 %), measured as pairs of runs in one invocation.

    .venv/bin/python bench/observability_overhead.py                 # 3 pairs, ~10 min
    .venv/bin/python bench/observability_overhead.py --pairs 5 --ratio 0.1

Each pair is two runs of bench/scale/scale.py (`--quick`: 500 hollow nodes, 5,000 workloads, real
etcd and Redis, a scheduler process): **plain** (`--no-metrics`, no OTLP endpoint: nothing
counted, nothing traced) and **observed** (metrics counted, served on a plain listener and scraped
every --scrape-interval seconds, default 15 as deploy/prometheus/prometheus.yml does; spans
exported over OTLP/gRPC to a real receiver in this process, sampled at
`--ratio`, default the scheduler's default). The order inside a pair alternates (plain first, then
observed first, ...) so that a drift of the machine during the invocation does not fall on one
side. Per pair: placements/s of each run, the ratio observed/plain raw and normalised by each
run's own raw etcd transaction rate (the scale benchmark's baseline), and scheduler CPU seconds
per 1,000 placements. The verdict uses the median of the normalised ratios.
Results: bench/results/observability-overhead-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tracing_scale import run_scale  # noqa: E402

from persys.observability.tracing import DEFAULT_RATIO  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

RESULTS = REPO / "bench" / "results"
TARGET_COST = 0.05


def one_run(kind: str, a: argparse.Namespace, receiver: OtlpReceiver, out: Path) -> dict[str, Any]:
    args = ["--quick", "--profiler", "none", "--probe", "0", "--no-hb-before",
            "--hb-window", "2", "--hb-idle", "1", "--nodes", str(a.nodes), "--workloads",
            str(a.workloads), "--metrics", "off" if kind == "plain" else "scraped",
            "--scrape-interval", str(a.scrape_interval)]
    env = {} if kind == "plain" else {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                                      "OTEL_TRACES_SAMPLER_ARG": str(a.ratio)}
    receiver.clear()
    print(f"== {kind}", flush=True)
    r = run_scale(args, env, out)
    r["spans_received"] = len(receiver.spans())
    cpu = r.get("scheduler_cpu_seconds")  # the whole run; with short heartbeat windows mostly the burst
    r["scheduler_cpu_s_per_1000"] = round(cpu * 1000 / a.workloads, 3) if cpu and r["placements_per_s"] else None
    return r


def ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 4) if x and y else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="pairs of runs (plain, observed), order alternating")
    ap.add_argument("--ratio", type=float, default=DEFAULT_RATIO, help="trace sampling ratio of the observed runs")
    ap.add_argument("--scrape-interval", type=float, default=15.0,
                    help="seconds between scrapes of the observed runs (15: deploy/prometheus/prometheus.yml's; "
                         "1 for a harsh scraper)")
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--workloads", type=int, default=5000)
    a = ap.parse_args()
    if a.pairs < 1 or not 0.0 <= a.ratio <= 1.0:
        ap.error("--pairs must be at least 1 and --ratio between 0 and 1")
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="persys-obs-overhead-") as tmp, OtlpReceiver() as receiver:
        for i in range(a.pairs):
            order = ("plain", "observed") if i % 2 == 0 else ("observed", "plain")
            runs = {k: one_run(k, a, receiver, Path(tmp) / f"{i}-{k}.json") for k in order}
            p, o = runs["plain"], runs["observed"]
            pair = {"order": list(order), "plain": p, "observed": o,
                    "raw_ratio": ratio(o["placements_per_s"], p["placements_per_s"]),
                    "etcd_normalised_ratio": ratio(o["of_etcd_baseline"], p["of_etcd_baseline"]),
                    "cpu_ratio": ratio(o["scheduler_cpu_s_per_1000"], p["scheduler_cpu_s_per_1000"])}
            pairs.append(pair)
            print(f"pair {i + 1}: plain {p['placements_per_s']}/s, observed {o['placements_per_s']}/s "
                  f"({o['spans_received']} spans); raw x{pair['raw_ratio']}, of etcd x{pair['etcd_normalised_ratio']}, "
                  f"scheduler CPU per placement x{pair['cpu_ratio']}", flush=True)
    norm = [p["etcd_normalised_ratio"] for p in pairs if p["etcd_normalised_ratio"]]
    raw = [p["raw_ratio"] for p in pairs if p["raw_ratio"]]
    cpu = [p["cpu_ratio"] for p in pairs if p["cpu_ratio"]]
    summary = {"nodes": a.nodes, "workloads": a.workloads, "trace_ratio": a.ratio,
               "scrape_interval_s": a.scrape_interval, "pairs": pairs,
               "median_raw_ratio": statistics.median(raw) if raw else None,
               "median_etcd_normalised_ratio": statistics.median(norm) if norm else None,
               "median_cpu_ratio": statistics.median(cpu) if cpu else None}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"observability-overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2))
    cost = None if not norm else 1 - statistics.median(norm)
    verdict = "n/a" if cost is None else ("PASS" if cost < TARGET_COST else "FAIL")
    print(f"\nmedian over {len(pairs)} pairs: raw x{summary['median_raw_ratio']}, normalised by etcd "
          f"x{summary['median_etcd_normalised_ratio']}, scheduler CPU per placement x{summary['median_cpu_ratio']}")
    print(f"target: metrics + tracing (ratio {a.ratio}) cost < {TARGET_COST:.0%} of placement throughput: "
          f"{'n/a' if cost is None else f'{cost:+.1%}'} -> {verdict}; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
