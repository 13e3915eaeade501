"""What authorization and the audit log cost on the apply path (a benchmark, not a test).

    .venv/bin/python bench/audit_cost.py [--applies 1000] [--concurrency 32] [--batches 10]

A scheduler in this process on a private etcd (real fsync), called over mTLS with the admin
certificate: `--applies` single ApplyWorkload calls one after another, the same number again
`--concurrency` at a time, then `--batches` ApplyWorkloads of 100 manifests. Every apply is a
new workload (a store write and a placement attempt; no agents, so they stay Pending) and, with
the audit log, one audit record per call. Run it on a tree without the audit log (PYTHONPATH at
that tree's src) for the figures before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import persys  # noqa: E402
from bench.scale.infra import start_etcd  # noqa: E402
from persys._pb.persys.v1 import control_pb2 as pb  # noqa: E402
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc  # noqa: E402
from persys.scheduler.rpc.server import start_scheduler  # noqa: E402
from persys.security import peer_names  # noqa: E402
from persys.security.grpc_tls import secure_channel  # noqa: E402
from persys.security.pki import ClusterCA, standard_identities  # noqa: E402


def manifest(name: str) -> bytes:
    return json.dumps({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                       "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 8},
                                "process": {"command": ["sleep", "3600"]}}}).encode()


def summary(lat: list[float], wall: float) -> dict[str, float]:
    lat = sorted(lat)
    return {"calls": len(lat), "per_s": round(len(lat) / wall, 1), "p50_ms": round(statistics.median(lat) * 1e3, 2),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 2)}


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    (tmp / "etcd").mkdir()
    etcd, endpoint = start_etcd(tmp / "etcd")
    ca = ClusterCA(tmp / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    s = await start_scheduler(f"etcd://{endpoint}", "memory://", "127.0.0.1:0", ids["scheduler"])
    out: dict[str, object] = {"persys": str(Path(persys.__file__).parent)}
    try:
        async with secure_channel(f"127.0.0.1:{s.port}", ids["admin"], expect=peer_names.SCHEDULER) as ch:
            stub = pb_grpc.AgentControlStub(ch)
            lat: list[float] = []
            t0 = time.perf_counter()
            for i in range(args.applies):
                t = time.perf_counter()
                await stub.ApplyWorkload(pb.ApplyWorkloadRequest(manifest_json=manifest(f"s{i}")), timeout=30)
                lat.append(time.perf_counter() - t)
            out["sequential"] = summary(lat, time.perf_counter() - t0)

            lat = []
            sem = asyncio.Semaphore(args.concurrency)

            async def one(i: int) -> None:
                async with sem:
                    t = time.perf_counter()
                    await stub.ApplyWorkload(pb.ApplyWorkloadRequest(manifest_json=manifest(f"c{i}")), timeout=30)
                    lat.append(time.perf_counter() - t)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(args.applies)))
            out["concurrent"] = summary(lat, time.perf_counter() - t0)

            lat = []
            t0 = time.perf_counter()
            for b in range(args.batches):
                t = time.perf_counter()
                await stub.ApplyWorkloads(pb.ApplyWorkloadsRequest(
                    manifests_json=[manifest(f"b{b}-{i}") for i in range(100)]), timeout=60)
                lat.append(time.perf_counter() - t)
            out["batches_of_100"] = summary(lat, time.perf_counter() - t0)
    finally:
        await s.stop()
        etcd.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--applies", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--batches", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="persys-audit-cost-") as tmp:
        print(json.dumps(asyncio.run(run(args, Path(tmp))), indent=1))


if __name__ == "__main__":
    main()
