"""Looking at etcd from the outside: revision, db size, key counts and versions, and the
raw-transaction baseline (the same client machinery as the scheduler: persys.store.etcd)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from persys._pb.etcd.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from persys.store.base import Compare, Put, prefix_range_end
from persys.store.etcd import EtcdStore

PAGE = 2000


@dataclass
class KindStats:
    keys: int = 0
    versions: int = 0  # puts since creation, summed over keys
    rewritten: int = 0  # keys with more than one put
    value_bytes: int = 0


class EtcdProbe:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.channel = grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 256 << 20)])
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.maint = rpc_pb2_grpc.MaintenanceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def status(self) -> dict[str, int]:
        r = await self.maint.Status(rpc_pb2.StatusRequest(), timeout=10)
        return {"revision": int(r.header.revision), "db_size": int(r.dbSize), "raft_index": int(r.raftIndex)}

    async def wal_fsyncs(self) -> dict[float, int]:
        """etcd's cumulative WAL fsync histogram from its /metrics: upper bound (s) -> count.
        Every etcd commit waits for one fsync, so a slow disk shows here first."""
        def fetch() -> str:
            with urllib.request.urlopen(f"http://{self.endpoint}/metrics", timeout=10) as r:
                return str(r.read().decode())

        buckets: dict[float, int] = {}
        for line in (await asyncio.to_thread(fetch)).splitlines():
            if line.startswith('etcd_disk_wal_fsync_duration_seconds_bucket{le="'):
                le = line.split('"')[1]
                buckets[float("inf") if le == "+Inf" else float(le)] = int(float(line.rsplit(" ", 1)[1]))
        return buckets

    async def revision(self) -> int:
        return (await self.status())["revision"]

    async def count(self, prefix: str = "") -> int:
        key = prefix.encode() or b"\0"
        end = prefix_range_end(prefix.encode()) if prefix else b"\0"
        r = await self.kv.Range(rpc_pb2.RangeRequest(key=key, range_end=end, count_only=True), timeout=30)
        return int(r.count)

    async def scan(self, prefix: str, keys_only: bool = False, page: int = PAGE
                   ) -> AsyncIterator[rpc_pb2.RangeResponse]:
        start, end = prefix.encode(), prefix_range_end(prefix.encode())
        rev = 0
        while True:
            r = await self.kv.Range(
                rpc_pb2.RangeRequest(key=start, range_end=end, limit=page, revision=rev, keys_only=keys_only),
                timeout=120,
            )
            rev = rev or r.header.revision
            yield r
            if not r.more or not r.kvs:
                return
            start = r.kvs[-1].key + b"\0"

    async def key_stats(self, root: str = "/persys/", sample: int = 500) -> dict[str, KindStats]:
        """Per key kind (workloads, status, assignments, nodes, ...): count and puts of every key
        (keys only), value bytes from the first `sample` keys of each kind (values can be large)."""
        out: dict[str, KindStats] = {}
        async for page in self.scan(root, keys_only=True, page=10_000):
            for kv in page.kvs:
                kind = kv.key.decode().removeprefix(root).split("/", 1)[0]
                s = out.setdefault(kind, KindStats())
                s.keys += 1
                s.versions += kv.version
                s.rewritten += kv.version > 1
        for kind, s in out.items():
            prefix = f"{root}{kind}/" if s.keys > 1 else f"{root}{kind}"
            r = await self.kv.Range(rpc_pb2.RangeRequest(key=prefix.encode(), range_end=prefix_range_end(
                prefix.encode()), limit=sample), timeout=120)
            if r.kvs:
                s.value_bytes = round(sum(len(kv.value) for kv in r.kvs) / len(r.kvs) * s.keys)
        return out

    async def field_sizes(self, prefix: str) -> dict[str, int]:
        """Bytes of each top-level field (and of each `placement` sub-field) of one document."""
        r = await self.kv.Range(rpc_pb2.RangeRequest(key=prefix.encode(), range_end=prefix_range_end(prefix.encode()),
                                                     limit=1), timeout=10)
        if not r.kvs:
            return {}
        doc = json.loads(r.kvs[0].value)
        out = {"(total)": len(r.kvs[0].value)}
        for k, v in doc.items():
            out[k] = len(json.dumps(v, separators=(",", ":")))
            if isinstance(v, dict) and k == "placement":
                out.update({f"placement.{pk}": len(json.dumps(pv, separators=(",", ":"))) for pk, pv in v.items()})
        return out

    async def created_at(self, prefix: str) -> dict[str, float]:
        """`createdAt` of every JSON document under `prefix`, by workload id (last path part)."""
        out: dict[str, float] = {}
        async for page in self.scan(prefix, page=500):
            for kv in page.kvs:
                try:
                    doc: dict[str, Any] = json.loads(kv.value)
                except ValueError:
                    continue
                if "createdAt" in doc:
                    out[kv.key.decode().rsplit("/", 1)[1]] = float(doc["createdAt"])
        return out


async def txn_baseline(endpoint: str, n: int, concurrency: int, sizes: tuple[int, int],
                       prefix: str = "/bench-baseline/") -> dict[str, Any]:
    """`n` transactions like a placement commit: two create-if-absent compares and two puts of
    `sizes` bytes, `concurrency` in flight, through persys.store.etcd.EtcdStore. The keys are
    deleted afterwards (outside /persys/, so a scheduler never sees them)."""
    store = EtcdStore([endpoint], timeout=60)
    va, vb = b"a" * sizes[0], b"s" * sizes[1]
    lat: list[float] = []
    counter = iter(range(n))
    run = f"{time.time_ns():x}"

    async def worker() -> None:
        for i in counter:
            ka, kb = f"{prefix}{run}/a/{i}", f"{prefix}{run}/s/{i}"
            t = time.perf_counter()
            ok = await store.txn([Compare(ka, 0), Compare(kb, 0)], [Put(ka, va), Put(kb, vb)])
            lat.append(time.perf_counter() - t)
            assert ok is not None, "baseline compare failed"

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        elapsed = time.perf_counter() - t0
    finally:
        await store.close()
    probe = EtcdProbe(endpoint)
    try:  # one DeleteRange: a single revision
        await probe.kv.DeleteRange(
            rpc_pb2.DeleteRangeRequest(key=prefix.encode(), range_end=prefix_range_end(prefix.encode())), timeout=60
        )
    finally:
        await probe.close()
    lat.sort()
    return {
        "txns": n,
        "puts_per_txn": 2,
        "value_bytes": list(sizes),
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "txn_per_s": round(n / elapsed, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 2),
    }
