"""The scale benchmark's placement throughput without and with tracing, in one run.

    .venv/bin/python bench/tracing_scale.py [--ratios 0.1,1.0] [-- <bench/scale/scale.py options>]

Runs bench/scale/scale.py (default `--quick --profiler none`: 500 hollow nodes, 5,000 workloads)
first with tracing off, then once per sampling ratio with the scheduler exporting its spans over
OTLP/gRPC to a real endpoint in this process (tests/otlp_receiver.py; it shares the machine, as
a collector on the same host would). The benchmark's clients send no trace context, so every
apply call is a new trace sampled at the ratio, and its placements join it. Prints placements/s
of each run, each against the raw etcd transaction rate that scale.py measures in the same run
(the machine's load moves both), and the ratio of traced to untraced.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.otlp_receiver import OtlpReceiver  # noqa: E402

SCALE = REPO / "bench" / "scale" / "scale.py"


def run_scale(args: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    subprocess.run([sys.executable, str(SCALE), *args, "--out", str(out)], check=True, env={**os.environ, **env})
    res: dict[str, Any] = json.loads(out.read_text())
    burst = res.get("burst", {})
    # The raw etcd rate at the benchmark's concurrency (the concurrency_1 figure is the serial one).
    etcd = res.get("baseline_etcd_txn", {})
    conc = [v for k, v in etcd.items() if k != "concurrency_1"] or list(etcd.values())
    txn = conc[0].get("txn_per_s", 0) if conc else 0
    rate = burst.get("placements_per_s") or 0
    return {"placements_per_s": rate, "sustained_placements_per_s": burst.get("sustained_placements_per_s"),
            "etcd_txn_per_s": txn, "of_etcd_baseline": round(rate / txn, 4) if txn else None,
            "outcome": burst.get("outcome"), "scheduler_cpu_seconds": res.get("scheduler_cpu_seconds_total")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratios", default="0.1,1.0", help="sampling ratios to run with (comma-separated)")
    ap.add_argument("scale_args", nargs="*", help="options for bench/scale/scale.py (after --)")
    a = ap.parse_args()
    scale_args = a.scale_args or ["--quick", "--profiler", "none"]
    results: dict[str, Any] = {"scale_args": scale_args}
    with tempfile.TemporaryDirectory(prefix="persys-tracing-scale-") as tmp:
        results["off"] = run_scale(scale_args, {}, Path(tmp) / "off.json")
        with OtlpReceiver() as receiver:
            for ratio in a.ratios.split(","):
                receiver.clear()
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER_ARG": ratio}
                r = run_scale(scale_args, env, Path(tmp) / f"on-{ratio}.json")
                r["spans_received"] = len(receiver.spans())
                results[f"on_{ratio}"] = r
    print(json.dumps(results, indent=2))
    off = results["off"]
    for key, r in results.items():
        if not key.startswith("on_"):
            continue
        raw = r["placements_per_s"] / off["placements_per_s"] if off["placements_per_s"] else float("nan")
        norm = (r["of_etcd_baseline"] / off["of_etcd_baseline"]) if r["of_etcd_baseline"] and \
            off["of_etcd_baseline"] else float("nan")
        print(f"ratio {key[3:]}: {r['placements_per_s']} placements/s against {off['placements_per_s']} off "
              f"(x{raw:.3f}); against each run's etcd baseline x{norm:.3f}; {r['spans_received']} spans received")


if __name__ == "__main__":
    main()
