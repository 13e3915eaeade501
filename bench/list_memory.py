"""Scheduler memory under concurrent lists of workloads with large specs (a benchmark, not a test).

    .venv/bin/python bench/list_memory.py [--workloads 2000] [--spec-kb 100] [--concurrency 200]

A real etcd and a scheduler process (no agents: workloads stay Pending). It stores N workloads
whose specs carry `--spec-kb` of environment each, lets the scheduler settle, then starts
`--concurrency` clients at once, each listing every workload the way `GET /v1/workloads` does
(following continue tokens where the scheduler gives them). It samples the scheduler's resident
memory every 20 ms and reports the settled figure, the peak during the lists and how long they
took. Above `--rss-cap-mb` the scheduler is killed (the run is then reported as capped), so a
scheduler that does not bound its lists cannot take the machine down with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.scale.infra import rss_bytes  # noqa: E402
from persys._pb.persys.v1 import control_pb2 as pb  # noqa: E402
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc  # noqa: E402
from persys.security.grpc_tls import channel_credentials  # noqa: E402
from persys.tlsfiles import TLSFiles  # noqa: E402
from tests.e2e.harness import Components  # noqa: E402
from tests.fixtures_infra import start_etcd  # noqa: E402

MB = 1 << 20


class Peak:
    """Samples a process's resident memory from a thread; kills it above the cap."""

    def __init__(self, pid: int, cap: int, kill: Any) -> None:
        self.pid, self.cap, self.kill = pid, cap, kill
        self.peak = 0
        self.capped_at: float | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                rss = rss_bytes(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, rss)
            if rss > self.cap and self.capped_at is None:
                self.capped_at = time.monotonic() - self._t0
                self.kill()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def manifest(i: int, spec_kb: int) -> bytes:
    return json.dumps({
        "apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": f"big-{i:05d}"},
        "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                 "process": {"command": ["sleep", "3600"], "env": {"BLOB": "x" * (spec_kb * 1024)}}},
    }).encode()


async def populate(stub: pb_grpc.AgentControlStub, n: int, spec_kb: int) -> None:
    # Batches small enough for one etcd request even where transactions are packed by count only.
    per = max(1, 1000 // spec_kb)
    sem = asyncio.Semaphore(4)

    async def batch(start: int) -> None:
        async with sem:
            await stub.ApplyWorkloads(pb.ApplyWorkloadsRequest(
                manifests_json=[manifest(i, spec_kb) for i in range(start, min(n, start + per))]), timeout=120)

    await asyncio.gather(*(batch(s) for s in range(0, n, per)))


async def list_all(stub: pb_grpc.AgentControlStub) -> int:
    count, token = 0, ""
    while True:
        resp = await stub.ListWorkloads(pb.ListRequest(continue_token=token), timeout=600)
        count += len(resp.items)
        token = resp.continue_token
        if not token:
            return count


async def run(args: argparse.Namespace, c: Components) -> dict[str, Any]:
    tls = TLSFiles(c.pki / "ca.crt", c.pki / "admin.crt", c.pki / "admin.key")
    channel = grpc.aio.secure_channel(c.target, channel_credentials(tls),
                                      options=[("grpc.max_receive_message_length", -1)])
    stub = pb_grpc.AgentControlStub(channel)
    pid = c.scheduler.pid
    try:
        t0 = time.monotonic()
        await populate(stub, args.workloads, args.spec_kb)
        populated_s = time.monotonic() - t0
        stored = (await stub.Health(pb.HealthRequest(), timeout=30)).workloads
        assert stored == args.workloads, f"{stored} of {args.workloads} workloads stored"
        await asyncio.sleep(args.settle)  # the reconcile worker writes every workload's Pending status
        settled = rss_bytes(pid)
        peak = Peak(pid, args.rss_cap_mb * MB, lambda: c.scheduler.proc.kill() if c.scheduler.proc else None)
        t1 = time.monotonic()
        results = await asyncio.gather(*(list_all(stub) for _ in range(args.concurrency)), return_exceptions=True)
        took = time.monotonic() - t1
        await asyncio.sleep(max(0.0, args.min_window - took))  # a control run: the same window, idle
        peak.stop()
        ok = [r for r in results if isinstance(r, int)]
        errors = sorted({f"{r.code().name}: {r.details()}" if isinstance(r, grpc.aio.AioRpcError) else repr(r)
                         for r in results if not isinstance(r, int)})
        return {
            "workloads": args.workloads, "specKb": args.spec_kb, "concurrency": args.concurrency,
            "populateSeconds": round(populated_s, 1), "settledRssMb": round(settled / MB),
            "peakRssMb": round(peak.peak / MB), "growthMb": round((peak.peak - settled) / MB),
            "listSeconds": round(took, 1), "listsCompleted": len(ok), "listsFailed": len(results) - len(ok),
            "itemsPerList": sorted(set(ok)), "errors": errors,
            "cappedAtSeconds": None if peak.capped_at is None else round(peak.capped_at, 1),
            "rssCapMb": args.rss_cap_mb,
        }
    finally:
        await channel.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", type=int, default=2000)
    ap.add_argument("--spec-kb", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between the last apply and the lists")
    ap.add_argument("--min-window", type=float, default=0.0,
                    help="sample at least this many seconds (with --concurrency 0: what an idle scheduler "
                    "costs over the same window, e.g. its rolling backup)")
    ap.add_argument("--rss-cap-mb", type=int, default=4096, help="kill the scheduler above this resident size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="persys-listmem-") as tmp:
        etcd = start_etcd(Path(tmp) / "etcd")
        c = Components(Path(tmp), etcd.url, nodes=())
        try:
            result = asyncio.run(run(args, c))
            print(json.dumps(result, indent=2))
            if result["errors"]:
                print(c.scheduler.text()[-6000:], file=sys.stderr)
        finally:
            c.stop()
            etcd.stop()


if __name__ == "__main__":
    main()
