"""What Persys Intelligence's pure parts cost (a benchmark, not a test).

    .venv/bin/python bench/intelligence.py [--repeat 5]

  why        the workload rules over one bundle of a crash-looping workload with 100 events,
             3 nodes and a 40-line log excerpt (what the retriever reads at most), per call;
  insights   the rules over 200 failing workloads' summaries (the insights bound);
  rightsize  one recommendation from a week of samples at 5 minutes (2016 CPU + 2016 memory);
  forecast   fit + backtest of two weeks at 5 minutes (4032 points) a day ahead.

Figures are thread CPU seconds (the best of --repeat): wall time on the shared machine mostly
measures the other tenants.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from persys.intelligence.evidence import Evidence  # noqa: E402
from persys.intelligence.forecast import forecast  # noqa: E402
from persys.intelligence.insights import workload_recommendations  # noqa: E402
from persys.intelligence.rightsize import recommend  # noqa: E402
from persys.intelligence.why import why  # noqa: E402


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times)


def bundle(name: str) -> dict[str, object]:
    return {"now": 2000.0, "documents": [
        {"kind": "workload", "name": name, "revision": "r1", "body": {"phase": "Failed", "instances": [
            {"instance": name, "node": "n1", "phase": "Failed", "message": "exited with code 3", "restarts": 9}]}},
        *[{"kind": "node", "name": f"n{i}", "revision": "5", "body": {"status": "Ready"}} for i in range(3)],
        {"kind": "health", "name": "scheduler", "revision": "5", "body": {"mode": "normal", "dependencies": []}}],
        "events": [{"eventId": f"{i}-0", "ts": 1000.0 + i, "kind": "WorkloadFailed", "subject": f"workload/{name}",
                    "message": "exited with code 3"} for i in range(100)],
        "logs": [{"instance": name, "lines": [f"line {i}" for i in range(40)]}]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    ev = Evidence.from_dict(bundle("web"))
    summaries = [dict(bundle(f"w{i}")["documents"][0]["body"], id=f"w{i}", revision="r1")  # type: ignore[index]
                 for i in range(200)]
    week = [(i * 300.0, 50 + 30 * math.sin(i / 40)) for i in range(2016)]
    fortnight = [(i * 300.0, 50 + 20 * math.sin(2 * math.pi * i / 288) + (i % 7)) for i in range(4032)]
    out = {
        "why_ms": 1000 * best(lambda: [why(ev, "workload/web") for _ in range(100)], a.repeat) / 100,
        "insights_200_workloads_ms": 1000 * best(lambda: workload_recommendations({}, summaries, None, 2000.0),
                                                 a.repeat),
        "rightsize_week_ms": 1000 * best(lambda: recommend("w", week, week, 604800.0, 1000, 128), a.repeat),
        "forecast_fortnight_ms": 1000 * best(lambda: forecast(fortnight, 300.0, 86400.0), a.repeat),
    }
    print(json.dumps({k: round(v, 2) for k, v in out.items()}))


if __name__ == "__main__":
    main()
