"""The gateway under a storm of 1,000 concurrent `GET /v1/workloads` (300 workloads stored), each
on its own TLS connection from a separate process, while threads probe `/healthz` every 50 ms
on the API port (a kept-alive connection) and on `--health-listen` (a new plain HTTP connection
each, answered by the gateway's health thread): how long answers take and how the connection
bound (`persys gateway --max-connections`, gateway.tls_gate) changes that. Settings alternate within
one run (same machine, same load), the load average is printed before and after each storm.

    .venv/bin/python -m bench.gateway_storm [--rounds 2] [--bound 128]

`--budget`: alternate the connection bound alone with the bound plus `--read-budget 1.5` (the
answer deadline of reads and the bounded scheduler calls: gateway.read_budget, scheduler_gate)
instead of no bound with the bound; `--frozen`: the scheduler is stopped (SIGSTOP) during the
storm, the most overloaded scheduler there is. RSS is read right after the storm and once 30 s
later (the gateway trims its heap after a quiet second).

Status 0 in the counts: the connection was refused (the bound, at the ClientHello) or dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx

from tests.gateway.cluster import GatewayCluster, start_cluster

ROOT = Path(__file__).resolve().parents[1]
OFF = 100_000  # a bound no storm here reaches: the gateway as before the gate


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def storm(c: GatewayCluster, n: int, frozen: bool = False) -> dict[str, object]:
    with c.client() as http:
        for _ in range(3):
            http.get("/v1/workloads")
    baseline = _rss_mb(c.gateway.pid)
    probes: list[float] = []
    side: list[float] = []  # the health listener's thread
    bad_probes = 0
    stop = threading.Event()
    m = re.search(r"/healthz: (http://\S+/healthz)", c.gateway.text())
    assert m, "started without --health-listen"
    side_url = m.group(1)

    def side_probe() -> None:
        nonlocal bad_probes
        while not stop.is_set():
            t0 = time.monotonic()
            with urllib.request.urlopen(side_url, timeout=60) as r:
                bad_probes += r.status != 200
            side.append(time.monotonic() - t0)
            time.sleep(0.05)

    def probe() -> None:
        nonlocal bad_probes
        with httpx.Client(base_url=c.url, verify=c.ssl_context(), timeout=60) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                if client.get("/healthz").status_code != 200:
                    bad_probes += 1
                probes.append(time.monotonic() - t0)
                time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    side_prober = threading.Thread(target=side_probe, daemon=True)
    side_prober.start()
    load_before = _load()
    if frozen:
        os.kill(c.scheduler.pid, signal.SIGSTOP)
    try:
        out = subprocess.run([sys.executable, "-m", "tests.gateway.storm_client", c.url, str(c.pki / "ca.crt"),
                              str(c.pki / "admin.crt"), str(c.pki / "admin.key"), "/v1/workloads", str(n)],
                             capture_output=True, text=True, timeout=600, cwd=ROOT, check=True)
    finally:
        if frozen:
            os.kill(c.scheduler.pid, signal.SIGCONT)
        stop.set()
        prober.join(timeout=60)
        side_prober.join(timeout=60)
    rss_after = _rss_mb(c.gateway.pid)
    with c.client(timeout=120) as http:  # a request after the storm starts the quiet second's trim
        http.get("/healthz")
        http.get("/v1/nodes")
    time.sleep(30)
    answers = [(int(s), float(t)) for s, t in json.loads(out.stdout)]
    times = [t for _, t in answers]
    counts: dict[int, int] = {}
    for s, _ in answers:
        counts[s] = counts.get(s, 0) + 1
    return {"load": f"{load_before} -> {_load()}", "statuses": dict(sorted(counts.items())),
            "answer_p50_s": round(statistics.median(times), 2), "answer_p99_s": round(_pct(times, 0.99), 2),
            "answer_max_s": round(max(times), 2), "within_2s": sum(1 for t in times if t <= 2.0),
            "healthz_p99_ms": round(_pct(probes, 0.99) * 1000), "healthz_max_ms": round(max(probes) * 1000),
            "healthz_probes": len(probes), "healthz_not_200": bad_probes,
            "health_listener_p99_ms": round(_pct(side, 0.99) * 1000), "health_listener_max_ms": round(max(side) * 1000),
            "health_listener_probes": len(side),
            "rss_mb": f"{baseline:.0f} -> {rss_after:.0f} -> {_rss_mb(c.gateway.pid):.0f} after 30 s"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bound", type=int, default=128, help="--max-connections of the gated runs")
    ap.add_argument("-n", type=int, default=1000, help="concurrent requests in the storm")
    ap.add_argument("--budget", action="store_true", help="compare the bound alone with bound + --read-budget 1.5")
    ap.add_argument("--frozen", action="store_true", help="stop the scheduler during each storm")
    args = ap.parse_args()
    settings: list[tuple[str, tuple[str, ...]]] = [
        ("off", ("--max-connections", str(OFF))), (str(args.bound), ("--max-connections", str(args.bound)))]
    if args.budget:
        settings = [(f"{args.bound}", ("--max-connections", str(args.bound))),
                    (f"{args.bound}+budget", ("--max-connections", str(args.bound), "--read-budget", "1.5"))]
    with tempfile.TemporaryDirectory(prefix="persys-bench-storm-") as tmp:
        for r in range(args.rounds):
            for label, extra in settings:
                c = start_cluster(Path(tmp) / f"r{r}-{label}", with_agent=False,
                                  gateway_args=(*extra, "--health-listen", "127.0.0.1:0"))
                try:
                    docs = [{"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": f"w-{i:03d}"},
                             "spec": {"type": "process", "process": {"command": ["sleep", "600"]},
                                      "resources": {"cpuMillicores": 10, "memoryMb": 8}}} for i in range(300)]
                    with c.client(timeout=120) as http:
                        http.post("/v1/workloads:batch", json=docs).raise_for_status()
                    got = storm(c, args.n, args.frozen)
                finally:
                    c.stop()
                print(json.dumps({"round": r, "gateway": label, "frozen": args.frozen, **got}), flush=True)


if __name__ == "__main__":
    main()
