"""What live streams cost (a benchmark, not a test).

    .venv/bin/python bench/live_streams.py [--events 20000] [--streams 1,10,50] [--changes 50000]

1. Event fan-out: the Watch service in this process over real gRPC (loopback, no TLS: the cost of
   TLS is the same for every stream and measured elsewhere) on the embedded event bus; `--events`
   published as fast as the bus takes them while N `Watch/Events` streams read them. Prints the
   publisher's rate with N streams against no stream (the baseline, same run) and the events/s
   delivered to all streams together.
2. Mirror feed: `--changes` workload documents folded into the scheduler's mirror with the
   shared change feed of `get -w` streams attached and 1 or 256 streams taking from it, against
   no listener.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from persys._pb.persys.v1 import watch_pb2, watch_pb2_grpc  # noqa: E402
from persys.events.base import ClusterEvent  # noqa: E402
from persys.events.memory import MemoryEventBus  # noqa: E402
from persys.model import Workload  # noqa: E402
from persys.scheduler.mirror import keys  # noqa: E402
from persys.scheduler.mirror.follower import ClusterState  # noqa: E402
from persys.scheduler.rpc.authorization import CALLER, Caller  # noqa: E402
from persys.scheduler.rpc.client.watch import WatchService  # noqa: E402
from persys.scheduler.views.changes import WORKLOADS, ChangeFeed  # noqa: E402
from persys.security.identity import from_subject  # noqa: E402
from persys.store.base import KeyValue  # noqa: E402
from persys.store.sqlite import SqliteStore  # noqa: E402


class Source:
    """What the Watch service reads: the bus (and a mirror, unused by event streams)."""

    def __init__(self, bus: MemoryEventBus, state: ClusterState) -> None:
        self.events = bus
        self.state = state

    def workload_view(self, wid: str, summary: bool = False) -> dict[str, Any]:
        return {"id": wid}

    def node_view(self, node_id: str) -> dict[str, Any]:
        return {"id": node_id}


class BenchWatch(WatchService):
    """The service with the caller the authorization interceptor would set (from metadata here:
    the bench runs without TLS identities)."""

    async def Events(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        who = dict(context.invocation_metadata() or ()).get("bench-caller", "user:bench")
        CALLER.set(Caller(from_subject(str(who), ())))
        async for msg in super().Events(request, context):
            yield msg


async def fan_out(n_events: int, n_streams: int, state: ClusterState) -> tuple[float, float]:
    """(publish seconds, seconds until every stream had every event)."""
    bus = MemoryEventBus(maxlen=n_events + 10)
    # Each bench stream is its own caller (the service bounds streams per identity).
    server = grpc.aio.server()
    watch_pb2_grpc.add_WatchServicer_to_server(BenchWatch(Source(bus, state), per_caller=1, total=1000), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = watch_pb2_grpc.WatchStub(channel)
    counts = [0] * n_streams
    started = [asyncio.Event() for _ in range(n_streams)]

    async def read(i: int) -> None:
        request = watch_pb2.WatchEventsRequest(limit=n_events, keepalive_seconds=60)
        async for msg in stub.Events(request, metadata=(("bench-caller", f"user:bench{i}"),)):
            started[i].set()
            counts[i] += len(msg.events)

    readers = [asyncio.create_task(read(i)) for i in range(n_streams)]
    for e in started:
        await e.wait()
    t0 = time.perf_counter()
    for i in range(n_events):
        await bus.publish(ClusterEvent("WorkloadScheduled", f"workload/w{i % 500}", "bench", fields={"node": "n1"}))
        if i % 100 == 0:
            await asyncio.sleep(0)  # a publisher that yields, as the scheduler's outbox does
    published = time.perf_counter() - t0
    await asyncio.gather(*readers)
    delivered = time.perf_counter() - t0
    assert counts == [n_events] * n_streams, counts
    await channel.close()
    await server.stop(0)
    return published, delivered


def fold(state: ClusterState, docs: list[KeyValue]) -> float:
    t0 = time.perf_counter()
    for kv in docs:
        state.fold_read(kv)
    return time.perf_counter() - t0


def workload_docs(n: int, rev0: int) -> list[KeyValue]:
    out = []
    for i in range(n):
        w = Workload.model_validate({"id": f"w{i % 2000}", "name": f"w{i % 2000}", "revision": f"r{i}",
                                     "createdAt": 1.0, "updatedAt": 1.0, "spec": {
            "type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 8},
            "process": {"command": ["sleep", "1"]}}})
        out.append(KeyValue(keys.WORKLOADS + w.id, w.to_json(), 1, rev0 + i, 1))
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--streams", default="1,10,50")
    ap.add_argument("--changes", type=int, default=50_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="persys-bench-live-") as tmp:
        store = SqliteStore(str(Path(tmp) / "state.db"))
        state = ClusterState(store)
        base_pub, _ = await fan_out(args.events, 0, state)
        print(f"event fan-out, {args.events} events on the embedded bus (publisher baseline, no stream: "
              f"{args.events / base_pub:,.0f} events/s)")
        print(f"{'streams':>8} {'publish/s':>12} {'vs baseline':>12} {'delivered/s (all)':>18} {'all seen after':>15}")
        for n in (int(x) for x in args.streams.split(",")):
            pub, done = await fan_out(args.events, n, state)
            print(f"{n:>8} {args.events / pub:>12,.0f} {base_pub / pub:>11.2f}x {n * args.events / done:>18,.0f} "
                  f"{done:>14.2f}s")
        fold(state, workload_docs(args.changes, 1))  # warm-up: the mirror holds the workloads from here on
        base = fold(state, workload_docs(args.changes, 1 + args.changes))
        print(f"\nmirror: {args.changes} workload changes folded, no listener: {base / args.changes * 1e6:.1f} us each")
        rev = 1 + 2 * args.changes
        for k in (1, 256):
            # One shared feed per watched kind, whatever the number of streams; each stream takes
            # the changes after its cursor (here after every 100 changes).
            feed = ChangeFeed(WORKLOADS)
            feed.readers = k
            state.subscribe(feed.listener)
            docs = workload_docs(args.changes, rev)
            rev += args.changes
            cursors = [feed.cursor] * k
            t0 = time.perf_counter()
            for start in range(0, len(docs), 100):
                for kv in docs[start:start + 100]:
                    state.fold_read(kv)
                for i in range(k):
                    cursors[i] = feed.take(cursors[i])[2]
            t = time.perf_counter() - t0
            print(f"  with {k:>3} watch stream(s) reading: {t / args.changes * 1e6:.1f} us per change "
                  f"({t / base:.2f}x), of which the mirror's listener is the same for any number")
            state.unsubscribe(feed.listener)
        await store.close()


if __name__ == "__main__":
    asyncio.run(main())
