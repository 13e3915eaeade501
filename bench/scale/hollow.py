"""Hollow agents: thousands of simulated nodes in one process, speaking the real agent protocol.

Like Kubernetes' kubemark "hollow nodes": every simulated node registers, heartbeats, holds its
own WatchAssignments stream (asking for deltas), sends heartbeats and reports on its own
StreamUpdates stream exactly as `persys.agent.agent.Agent` does, but
runs nothing. On every DesiredState it immediately reports WORKLOAD_STATE_RUNNING for each
assigned workload (complete=true). Differences from the real agent, on purpose:

* one certificate with common name `admin` for the whole process (the scheduler lets `admin`
  act for any node), instead of one `node:<id>` certificate per node: issuing 5,000 leaf
  certificates would dominate the set-up time and measures nothing about the scheduler;
* nodes are multiplexed over `--channels` mTLS connections (the real agent has one each);
* spec_json is not parsed, nothing is persisted locally, and there is no periodic complete
  report unless `--report-interval` is set (the real agent sends one at least every 10 s);
* the heartbeat interval comes from `--heartbeat-interval` (default 10 s), not from the
  scheduler's RegisterNodeResponse (3 s);
* long-lived objects are frozen out of the garbage collector's way every second (the
  scheduler's own HeapGuard), so that this process's collections do not show up as latency.

The process is driven by bench/scale/scale.py through a JSON-lines control socket
(`--control PATH`): {"cmd": "stats"}, {"cmd": "mark"} (reset the heartbeat latency window),
{"cmd": "pause", "value": true|false} (heartbeats), {"cmd": "dump", "path": P} (first-receipt
time of every workload, CLOCK_MONOTONIC, which is system-wide on Linux), {"cmd": "wait",
"id": W, "timeout": S} (returns the receipt time of W once it arrives), {"cmd": "stop"}.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from mix import node_profile

from persys import __version__
from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.scheduler.heap import HeapGuard
from persys.scheduler.stalls import StallWatchdog
from persys.security.grpc_tls import channel_credentials
from persys.tlsfiles import TLSFiles

log = logging.getLogger("hollow")


@dataclass
class HollowNode:
    index: int
    node_id: str
    stub: pb_grpc.AgentControlStub
    request: pb.RegisterNodeRequest
    desired: dict[str, tuple[str, int]] = field(default_factory=dict)  # workload -> (revision, generation)
    synced: bool = False
    reporting: bool = False
    dirty: bool = False
    updates: Any = None  # the open StreamUpdates call (heartbeats and reports), as the agent keeps one
    hb_sent: collections.deque[float] = field(default_factory=collections.deque)  # unanswered heartbeats
    unreported: set[str] | None = None  # changed since the last report; None: send a complete one


@dataclass
class Counters:
    registered: int = 0
    register_errors: int = 0
    streams_ready: int = 0
    stream_errors: int = 0
    desired_msgs: int = 0
    desired_items: int = 0
    heartbeats_ok: int = 0
    heartbeat_errors: int = 0
    reregisters: int = 0
    reports_ok: int = 0
    report_errors: int = 0
    last_error: str = ""


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


class Hollow:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        tls_dir = Path(args.tls_dir)
        files = TLSFiles(tls_dir / "ca.crt", tls_dir / f"{args.cert}.crt", tls_dir / f"{args.cert}.key")
        creds = channel_credentials(files)
        self.channels = [
            grpc.aio.secure_channel(
                args.scheduler,
                creds,
                options=[
                    ("grpc.keepalive_time_ms", 10_000),
                    ("grpc.keepalive_timeout_ms", 5_000),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    # One TCP connection per channel (channels with equal arguments would
                    # otherwise share a subchannel, i.e. a connection).
                    ("grpc.use_local_subchannel_pool", 1),
                    ("persys.bench.channel", i),
                ],
            )
            for i in range(max(1, args.channels))
        ]
        stubs = [pb_grpc.AgentControlStub(c) for c in self.channels]
        self.nodes = [self._node(args.offset + i, stubs[i % len(stubs)]) for i in range(args.nodes)]
        self.c = Counters()
        self.first_seen: dict[str, float] = {}
        self.waiters: dict[str, list[asyncio.Future[float]]] = {}
        self.hb_latency: list[float] = []
        self.errors_by_code: collections.Counter[str] = collections.Counter()
        self.paused = False
        self.register_started = 0.0
        self.register_done = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._bg: set[asyncio.Task[None]] = set()
        self.stopping = asyncio.Event()

    @staticmethod
    def _node(i: int, stub: pb_grpc.AgentControlStub) -> HollowNode:
        p = node_profile(i)
        req = pb.RegisterNodeRequest(
            node_id=p.node_id,
            address=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            agent_version=f"{__version__}+hollow",
            capabilities=pb.NodeCapabilities(
                runtimes=[
                    pb.RuntimeCapability(workload_type="container", version="24.0.0-hollow", features=["cgroups:v2"]),
                    pb.RuntimeCapability(workload_type="process", version="hollow", features=["cgroups:v2"]),
                ],
                storage_drivers=["local"],
                cpu_millicores=p.cpu_millicores,
                memory_mb=p.memory_mb,
                disk_mb=p.disk_mb,
            ),
            labels=p.labels,
            taints=[pb.Taint(key=k, value=v, effect=e) for k, v, e in p.taints],
        )
        return HollowNode(i, p.node_id, stub, req)

    # ------------------------------------------------------------------ per-node protocol

    async def _register(self, node: HollowNode, sem: asyncio.Semaphore | None = None) -> None:
        delay = 0.2
        while True:
            try:
                if sem is not None:
                    async with sem:
                        await node.stub.RegisterNode(node.request, timeout=60)
                else:
                    await node.stub.RegisterNode(node.request, timeout=60)
                return
            except grpc.aio.AioRpcError as err:
                self.c.register_errors += 1
                self.c.last_error = f"register {node.node_id}: {err.code().name} {err.details()}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _run_node(self, node: HollowNode, sem: asyncio.Semaphore) -> None:
        try:
            await self._register(node, sem)
        except Exception as err:  # visible to the driver through stats, never silently lost
            self.c.register_errors += 1
            self.c.last_error = f"register {node.node_id}: {err!r}"
            return
        self.c.registered += 1
        if self.c.registered == len(self.nodes):
            self.register_done = time.monotonic()
        self._spawn(self._watch(node))
        self._spawn(self._updates(node))
        self._spawn(self._heartbeats(node))
        if self.args.report_interval > 0:
            self._spawn(self._periodic_reports(node))

    async def _watch(self, node: HollowNode) -> None:
        delay = 0.2
        while not self.stopping.is_set():
            call = node.stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id=node.node_id, deltas=True))
            try:
                async for ds in call:
                    self._on_desired(node, ds)
                    delay = 0.2
            except grpc.aio.AioRpcError as err:
                if self.stopping.is_set() or err.code() == grpc.StatusCode.CANCELLED:
                    return
                self.c.stream_errors += 1
                self.c.last_error = f"watch {node.node_id}: {err.code().name} {err.details()}"
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _updates(self, node: HollowNode) -> None:
        """The node's StreamUpdates call: heartbeats and reports are written to it; heartbeat
        acknowledgements come back in order (their latency is measured from the write)."""
        delay = 0.2
        while not self.stopping.is_set():
            call = node.stub.StreamUpdates()
            node.updates = call
            try:
                async for ack in call:
                    delay = 0.2
                    if node.hb_sent:
                        self.c.heartbeats_ok += 1
                        self.hb_latency.append(time.monotonic() - node.hb_sent.popleft())
                    if ack.heartbeat.reregister:
                        self.c.reregisters += 1
                        await self._register(node)
            except grpc.aio.AioRpcError as err:
                if self.stopping.is_set():
                    return
                self.c.stream_errors += 1
                self.errors_by_code[f"updates {err.code().name}"] += 1
                self.c.last_error = f"updates {node.node_id}: {err.code().name} {err.details()}"
            finally:
                node.updates = None
                self.c.heartbeat_errors += len(node.hb_sent)  # sent, never answered
                node.hb_sent.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _write(self, node: HollowNode, update: pb.AgentUpdate) -> bool:
        call = node.updates
        if call is None:
            return False
        try:
            await call.write(update)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            return False
        return True

    def _on_desired(self, node: HollowNode, ds: pb.DesiredState) -> None:
        now = time.monotonic()
        if not node.synced:
            node.synced = True
            self.c.streams_ready += 1
        self.c.desired_msgs += 1
        self.c.desired_items += len(ds.workloads)
        if ds.full:  # otherwise a delta: changed workloads plus `removed`
            node.desired = {}
            node.unreported = None
        if ds.removed:
            node.unreported = None  # something is gone: the next report is complete, as the agent's is
        for wid in ds.removed:
            node.desired.pop(wid, None)
        for a in ds.workloads:
            wid = a.workload_id
            if wid not in self.first_seen:
                self.first_seen[wid] = now
                for fut in self.waiters.pop(wid, ()):
                    if not fut.done():
                        fut.set_result(now)
            node.desired[wid] = (a.revision, a.generation)
            if node.unreported is not None:
                node.unreported.add(wid)
        self._schedule_report(node)

    def _schedule_report(self, node: HollowNode) -> None:
        if node.reporting:
            node.dirty = True  # coalesce: the running report loop sends the latest set again
            return
        node.reporting = True
        self._spawn(self._report(node))

    async def _report(self, node: HollowNode) -> None:
        try:
            while not self.stopping.is_set():
                node.dirty = False
                # Like the agent: only what changed, or everything when a complete report is due.
                complete = node.unreported is None
                wids = list(node.desired) if complete else [w for w in node.unreported or () if w in node.desired]
                node.unreported = set()
                req = pb.ReportStatusRequest(
                    node_id=node.node_id,
                    workloads=[
                        pb.WorkloadReport(
                            workload_id=wid, revision=node.desired[wid][0], generation=node.desired[wid][1],
                            state=pb.WORKLOAD_STATE_RUNNING, runtime_id=f"hollow-{wid}",
                        )
                        for wid in wids
                    ],
                    complete=complete,
                )
                try:
                    if not await self._write(node, pb.AgentUpdate(report=req)):
                        await node.stub.ReportStatus(req, timeout=60)
                    self.c.reports_ok += 1
                except grpc.aio.AioRpcError as err:
                    node.unreported = None
                    self.c.report_errors += 1
                    self.errors_by_code[f"report {err.code().name}"] += 1
                    self.c.last_error = f"report {node.node_id}: {err.code().name} {err.details()}"
                    node.dirty = True
                    await asyncio.sleep(1.0)
                if not node.dirty:
                    return
        finally:
            node.reporting = False

    async def _periodic_reports(self, node: HollowNode) -> None:
        while True:
            await asyncio.sleep(self.args.report_interval)
            if node.synced:
                node.unreported = None  # the periodic report is a complete one
                self._schedule_report(node)

    async def _heartbeats(self, node: HollowNode) -> None:
        interval = self.args.heartbeat_interval
        # Spread the nodes evenly over one interval, on an absolute schedule.
        next_t = time.monotonic() + interval * ((node.index * 0.6180339887) % 1.0)
        while True:
            now = time.monotonic()
            if next_t > now:
                await asyncio.sleep(next_t - now)
            next_t = max(next_t + interval, time.monotonic() - interval)
            if self.paused:
                continue
            req = pb.HeartbeatRequest(
                node_id=node.node_id,
                usage=pb.NodeUsage(cpu_percent=1.0, memory_used_mb=256, disk_used_mb=1024,
                                   workloads=len(node.desired)),
            )
            t0 = time.monotonic()
            node.hb_sent.append(t0)
            if await self._write(node, pb.AgentUpdate(heartbeat=req)):
                continue  # answered on the update stream
            node.hb_sent.pop()
            try:
                resp = await node.stub.Heartbeat(req, timeout=10)
            except grpc.aio.AioRpcError as err:
                self.c.heartbeat_errors += 1
                self.errors_by_code[f"heartbeat {err.code().name}"] += 1
                self.c.last_error = f"heartbeat {node.node_id}: {err.code().name} {err.details()}"
                continue
            self.c.heartbeats_ok += 1
            self.hb_latency.append(time.monotonic() - t0)
            if resp.reregister:
                self.c.reregisters += 1
                await self._register(node)

    # ------------------------------------------------------------------ plumbing

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def stats(self) -> dict[str, Any]:
        c = self.c
        lat = self.hb_latency
        return {
            "nodes": len(self.nodes),
            "registered": c.registered,
            "register_seconds": (self.register_done - self.register_started) if self.register_done else None,
            "register_errors": c.register_errors,
            "streams_ready": c.streams_ready,
            "stream_errors": c.stream_errors,
            "received": len(self.first_seen),
            "desired_msgs": c.desired_msgs,
            "desired_items": c.desired_items,
            "heartbeats_ok": c.heartbeats_ok,
            "heartbeat_errors": c.heartbeat_errors,
            "reregisters": c.reregisters,
            "reports_ok": c.reports_ok,
            "report_errors": c.report_errors,
            "last_error": c.last_error,
            "hb_latency_n": len(lat),
            "hb_latency_p50_ms": round(statistics.median(lat) * 1000, 2) if lat else None,
            "hb_latency_p99_ms": round(pct(lat, 0.99) * 1000, 2) if lat else None,
            "paused": self.paused,
            "errors_by_code": dict(self.errors_by_code),
            "monotonic": time.monotonic(),
        }

    async def _command(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "stats":
            return self.stats()
        if cmd == "mark":
            self.hb_latency = []
            return {"ok": True}
        if cmd == "pause":
            self.paused = bool(msg.get("value", True))
            return {"ok": True, "paused": self.paused}
        if cmd == "dump":
            path = Path(str(msg["path"]))
            data = json.dumps({"first_seen": self.first_seen})
            await asyncio.to_thread(path.write_text, data)
            return {"ok": True, "count": len(self.first_seen)}
        if cmd == "wait":
            wid = str(msg["id"])
            if wid in self.first_seen:
                return {"ok": True, "t": self.first_seen[wid]}
            fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self.waiters.setdefault(wid, []).append(fut)
            try:
                t = await asyncio.wait_for(fut, timeout=float(msg.get("timeout", 30)))
            except TimeoutError:
                return {"ok": False, "error": "timeout"}
            return {"ok": True, "t": t}
        if cmd == "stop":
            self.stopping.set()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    reply = await self._command(json.loads(line))
                except Exception as err:
                    reply = {"ok": False, "error": repr(err)}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        server = await asyncio.start_unix_server(self._client, path=self.args.control)
        print(f"hollow ready: {len(self.nodes)} nodes over {len(self.channels)} channels", flush=True)
        sem = asyncio.Semaphore(max(1, self.args.register_concurrency))
        self.register_started = time.monotonic()
        for node in self.nodes:
            self._spawn(self._run_node(node, sem))
        # Thousands of nodes' streams and state are millions of long-lived objects: without this,
        # a full garbage collection now and then stops this process for 40-100 ms, and the probe
        # that was being delivered meanwhile shows it as scheduler latency. The same guard as
        # the scheduler's (persys.scheduler.heap).
        heap = HeapGuard()
        heap.install()
        stalls = StallWatchdog(self.args.stall_log_ms / 1000) if self.args.stall_log_ms > 0 else None
        if stalls is not None:
            stalls.start()
        try:
            while not self.stopping.is_set():
                heap.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), timeout=1.0)
        finally:
            heap.uninstall()
            if stalls is not None:
                await stalls.stop()
            server.close()
            for t in list(self._bg):
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*self._bg, return_exceptions=True), timeout=5)
            for ch in self.channels:
                with contextlib.suppress(Exception):
                    await ch.close(grace=None)
            with contextlib.suppress(OSError):
                os.unlink(self.args.control)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", required=True, help="scheduler gRPC address host:port")
    ap.add_argument("--tls-dir", required=True, help="directory from `persys certs init`")
    ap.add_argument("--cert", default="admin", help="certificate name in --tls-dir (default admin)")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--offset", type=int, default=0, help="index of the first node (to split across processes)")
    ap.add_argument("--channels", type=int, default=8, help="mTLS connections to multiplex the nodes over")
    ap.add_argument("--heartbeat-interval", type=float, default=10.0)
    ap.add_argument("--report-interval", type=float, default=0.0, help="periodic re-report (0 = only on change)")
    ap.add_argument("--register-concurrency", type=int, default=64)
    ap.add_argument("--control", required=True, help="unix socket path for the driver")
    ap.add_argument("--stall-log-ms", type=float, default=0.0,
                    help="log what held this process's event loop longer than this (0 = off)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

    async def run() -> None:
        await Hollow(args).run()  # grpc.aio channels must be created inside the running loop

    asyncio.run(run())


if __name__ == "__main__":
    main()
