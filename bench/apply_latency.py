"""Where one apply's time goes, step by step, on an idle `persys dev` (a benchmark, not a test).

    .venv/bin/python bench/apply_latency.py [--applies 30] [--untraced 30]

Starts `persys dev` (embedded store, one node) twice:

1. untraced: `--untraced` process workloads applied one at a time through the REST API, each
   timed from the POST to phase Running as the API shows it (polled every 2 ms), then deleted;
   beside it, the same process started by hand (Popen until its pid exists): the floor.
2. traced: the same with every span exported (OTLP/gRPC to tests/otlp_receiver.py in this
   process, sampling ratio 1.0): the gateway's request, admission (validation and policy), the
   scheduler's apply with its store commit (the audit record rides in the same write), the
   placement (its decision and its commit), the agent's start of the instance and the runtime's
   start. Printed per step: the median and p90 of when it starts after the request began and how
   long it takes, and the gaps no span covers (queueing, the push to the agent, reports).

The traced run pays the exporter (a thread in each process): its figures locate the time, the
untraced run measures it. Every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from runtimes import Dev, manifest  # noqa: E402

from tests.otlp_receiver import OtlpReceiver, ReceivedSpan  # noqa: E402


def until_running(dev: Dev, name: str) -> float:
    """POST a sleeping process, poll until Running; the seconds it took."""
    doc = manifest(name, "process", {"command": ["sleep", "600"]})
    doc["spec"]["resources"] = {"cpuMillicores": 5, "memoryMb": 8}  # hundreds fit the one node
    t0 = time.perf_counter()
    r = dev.http.post("/v1/workloads", json=doc)
    if r.is_error:
        raise SystemExit(f"applying {name}: {r.status_code} {r.text}")
    while True:
        w = dev.http.get(f"/v1/workloads/{name}").json()
        if w["phase"] == "Running":
            return time.perf_counter() - t0
        if w["phase"] == "Failed" or time.perf_counter() - t0 > 60:
            raise SystemExit(f"{name} did not reach Running: {w['phase']} {w.get('message')}")
        time.sleep(0.002)


def by_hand() -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    p.kill()
    p.wait()
    return took


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def steps(traces: dict[str, list[ReceivedSpan]]) -> None:
    """Per span name: when it starts after the trace's first span, and its duration (ms)."""
    starts: dict[str, list[float]] = defaultdict(list)
    durations: dict[str, list[float]] = defaultdict(list)
    ends: dict[str, list[float]] = defaultdict(list)
    for spans in traces.values():
        t0 = min(s.start_ns for s in spans)
        seen: set[str] = set()
        for s in sorted(spans, key=lambda s: s.start_ns):
            key = f"{s.service}:{s.name}"
            if key in seen:  # a second span of the same name in one trace (a retry): the first counts
                continue
            seen.add(key)
            starts[key].append((s.start_ns - t0) / 1e6)
            ends[key].append((s.end_ns - t0) / 1e6)
            durations[key].append((s.end_ns - s.start_ns) / 1e6)
    order = sorted(starts, key=lambda k: statistics.median(starts[k]))
    print(f"\n{'step (service:span)':<44} {'n':>4} {'starts at':>10} {'p90':>8} {'takes':>8} {'p90':>8} "
          f"{'ends at':>9}   (ms after the request began)")
    for k in order:
        print(f"{k:<44} {len(starts[k]):>4} {statistics.median(starts[k]):10.2f} {pct(starts[k], 0.9):8.2f} "
              f"{statistics.median(durations[k]):8.2f} {pct(durations[k], 0.9):8.2f} {statistics.median(ends[k]):9.2f}")


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="persys-bench-apply-"))
    try:
        run(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(home: Path) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--applies", type=int, default=30, help="traced applies (0: the untraced run only)")
    ap.add_argument("--untraced", type=int, default=30, help="untraced applies")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    for part in ("plain", "traced"):
        (home / part).mkdir()
    plain: list[float] = []
    hand: list[float] = []
    dev = Dev(home / "plain")
    try:
        until_running(dev, "warm-up")  # imports and first-use costs, left out
        for i in range(args.untraced):
            plain.append(until_running(dev, f"plain-{i}"))
            hand.append(by_hand())
            dev.delete(f"plain-{i}")
    finally:
        dev.stop()
    traces: dict[str, list[ReceivedSpan]] = defaultdict(list)
    traced: list[float] = []
    if not args.applies:
        report(plain, hand, [], {})
        return
    with OtlpReceiver() as receiver:
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = "1.0"
        dev = Dev(home / "traced", "--otlp-endpoint", receiver.endpoint)
        try:
            until_running(dev, "warm-up")  # imports and first-use costs, left out
            time.sleep(6)  # the warm-up's spans exported (the SDK's batch delay is 5 s)
            receiver.clear()
            for i in range(args.applies):
                traced.append(until_running(dev, f"traced-{i}"))
            # every apply's trace, down to the runtime's start, exported
            receiver.wait_for(lambda ss: len({s.trace_id for s in ss if s.name == "runtime.start"}) >= args.applies,
                              timeout=60)
        finally:
            dev.stop()
        with_start = {s.trace_id for s in receiver.spans() if s.name == "runtime.start"}
        for s in receiver.spans():
            if s.trace_id in with_start:
                traces[s.trace_id].append(s)
    report(plain, hand, traced, traces)
    print(f"\nload average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (1 min; {os.cpu_count()} CPUs)")


def report(plain: list[float], hand: list[float], traced: list[float], traces: dict[str, list[ReceivedSpan]]) -> None:
    print(f"apply -> Running, untraced ({len(plain)} serial applies, REST polled every 2 ms): "
          f"median {statistics.median(plain) * 1e3:.1f} ms, p90 {pct(plain, 0.9) * 1e3:.1f} ms")
    print(f"the same process started by hand (Popen): median {statistics.median(hand) * 1e3:.2f} ms")
    if traced:
        print(f"apply -> Running, traced: median {statistics.median(traced) * 1e3:.1f} ms, "
              f"p90 {pct(traced, 0.9) * 1e3:.1f} ms ({len(traces)} whole traces)")
        steps(traces)


if __name__ == "__main__":
    main()
