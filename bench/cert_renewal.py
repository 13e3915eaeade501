"""Certificate renewals under load, on real processes: the long form of tests/e2e/test_cert_lifecycle.py.

    .venv/bin/python bench/cert_renewal.py [--ttl 120] [--minutes 10] [--pause-at 300 --pause-for 60]

A private OpenBao dev server, `persys scheduler` and `persys gateway` with `--identity-from openbao`
and certificates of --ttl seconds (default 2 minutes: renewed about every 80 s). For --minutes,
a client calls the gateway four times a second, each call on a new TLS connection (whoami: the
gateway's certificate and its channel to the scheduler), and a node heartbeats once a second on
one StreamUpdates stream. With --pause-at, OpenBao is SIGSTOPped for --pause-for seconds at that
moment (keep it under a third of --ttl so the current certificates outlive it). Prints renewals per
service, calls, failed calls (target 0), heartbeats acknowledged and whether the stream survived
(target: yes), as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.cert_lifecycle import Cluster, cluster, traffic  # noqa: E402


async def _run(c: Cluster, seconds: float, pause_at: float | None, pause_for: float) -> dict[str, object]:
    t0 = time.monotonic()
    async with traffic(c) as report:
        paused = False
        while (elapsed := time.monotonic() - t0) < seconds:
            if pause_at is not None and not paused and elapsed >= pause_at:
                os.kill(c.bao.pid, signal.SIGSTOP)
                paused = True
                await asyncio.sleep(pause_for)
                os.kill(c.bao.pid, signal.SIGCONT)
            await asyncio.sleep(1)
    return {"seconds": round(time.monotonic() - t0), "renewals": {s: c.renewals(s) for s in ("scheduler", "gateway")},
            "callsOk": report.calls_ok, "callsFailed": len(report.failures), "firstFailures": report.failures[:5],
            "heartbeatsAcked": report.heartbeats_acked, "streamSurvived": not report.stream_error,
            "streamError": report.stream_error, "gatewayCertificatesServed": len(report.gateway_serials)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ttl", type=int, default=120, help="certificate lifetime, seconds")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--pause-at", type=float, default=None, help="seconds in: SIGSTOP OpenBao")
    ap.add_argument("--pause-for", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="persys-cert-bench-") as d, cluster(Path(d), args.ttl) as c:
        result = asyncio.run(_run(c, args.minutes * 60, args.pause_at, args.pause_for))
    print(json.dumps({"ttl": args.ttl, **result}, indent=2))
    sys.exit(0 if result["callsFailed"] == 0 and result["streamSurvived"] else 1)


if __name__ == "__main__":
    main()
