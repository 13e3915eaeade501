"""What the automation's pure parts cost (a benchmark, not a test).

    .venv/bin/python bench/automation_replay.py [--days 7] [--replicas 4] [--repeat 5]

One autoscale decision (`autoscale.decide`, with a full 300 s window of history), and a replay of
`--days` of meter history at a 10 s step with decisions every 15 s (what `persysctl policy replay
P --since 7d` computes once the meter's answer is in: the window figures and the decisions),
over `--replicas` instance series of a noisy daily load. Medians of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from persys.automation.autoscale import History, Observation, Recommendation, decide  # noqa: E402
from persys.automation.observe import Series  # noqa: E402
from persys.automation.replay import report, simulate, steps_from_series  # noqa: E402
from persys.model.automation import Autoscale  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    spec = Autoscale(workload="web", target=50, max_replicas=20, interval_seconds=15)
    hist = History(tuple(Recommendation(1000.0 - k * 15, 4) for k in range(20)))
    obs = Observation(1000.0, 4, 260.0, 995.0, 4)
    n = 20_000
    per_decision = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            decide(spec, obs, hist)
        per_decision.append((time.perf_counter() - t0) / n * 1e6)
    rnd = random.Random(7)
    end = a.days * 86_400
    series = [Series(f"web.{i}", tuple((float(t), max(0.0, 40 + 30 * math.sin(2 * math.pi * t / 86_400)
                                                        + rnd.gauss(0, 8)))
                                       for t in range(0, int(end), 10))) for i in range(a.replicas)]
    runs = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        steps = steps_from_series(spec, series, 60.0, end, 15, 10)
        rep = report(spec, simulate(spec, steps, a.replicas), 15)
        runs.append(time.perf_counter() - t0)
    print(f"decide: median {statistics.median(per_decision):.1f} us per decision (300 s of history)")
    print(f"replay of {a.days:g} days, {a.replicas} series at 10 s, {len(steps)} decisions: median "
          f"{statistics.median(runs):.1f} s ({statistics.median(runs) / len(steps) * 1e6:.0f} us per decision); "
          f"{rep['actions']} actions, {rep['flaps']} flaps")


if __name__ == "__main__":
    main()
