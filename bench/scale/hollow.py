"""Hollow agents: thousands of simulated nodes in one process, on the real agent link.

Like Kubernetes' kubemark "hollow nodes": every simulated node speaks to the scheduler through
the agent's own link (`persys.agent.link.GrpcLink`: registration, heartbeats and reports on its
StreamUpdates stream with their acknowledgements, its WatchAssignments stream asking for deltas,
the acknowledgement deadline), with a fake runtime behind it: on every DesiredState it reports
WORKLOAD_STATE_RUNNING for each assigned workload at once. Differences from the real agent, on
purpose:

* one certificate with common name `admin` for the whole process (the scheduler lets `admin`
  act for any node), instead of one `node:<id>` certificate per node: issuing 5,000 leaf
  certificates would dominate the set-up time and measures nothing about the scheduler;
* nodes are multiplexed over `--channels` mTLS connections per replica (the link's channel
  factory; the real agent has one each), and registrations are bounded by
  `--register-concurrency`; `--scheduler` may list several replicas (a,b), which the link
  fails over between as the agent's does;
* spec_json is not parsed, nothing is persisted locally, and there is no periodic complete
  report unless `--report-interval` is set (the real agent sends one at least every 10 s);
* the heartbeat interval comes from `--heartbeat-interval` (default 10 s), not from the
  scheduler's RegisterNodeResponse (3 s), and each node's first heartbeat is offset within it;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from mix import node_profile

from persys import __version__
from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.link import GrpcLink, LinkOptions
from persys.scheduler.replica.heap import HeapGuard
from persys.scheduler.replica.stalls import StallWatchdog
from persys.security.grpc_tls import channel_credentials
from persys.tlsfiles import TLSFiles

log = logging.getLogger("hollow")


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


class HollowNode:
    """One simulated node: the link's handler, with a fake runtime that runs whatever it is given."""

    def __init__(self, hollow: Hollow, index: int, channels: dict[str, grpc.aio.Channel],
                 gate: asyncio.Semaphore) -> None:
        self.hollow = hollow
        self.index = index
        p = node_profile(index)
        self.node_id = p.node_id
        self.request = pb.RegisterNodeRequest(
            node_id=p.node_id,
            address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:7070",
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
        self.desired: dict[str, tuple[str, int]] = {}  # workload -> (revision, generation)
        self.ever_registered = False
        self.synced = False
        self.reporting = False
        self.dirty = False
        self.unreported: set[str] | None = None  # changed since the last report; None: send a complete one
        options = LinkOptions(heartbeat_interval=hollow.args.heartbeat_interval, register_timeout=60.0,
                              register_gate=gate, heartbeat_phase=(index * 0.6180339887) % 1.0,
                              channel_factory=lambda target: channels[target],
                              ack_deadline=hollow.args.ack_deadline)
        self.link = GrpcLink(self.node_id, list(channels), None, self, options)

    # ------------------------------------------------------------------ LinkHandler

    def register_request(self) -> pb.RegisterNodeRequest:
        return self.request

    def heartbeat_request(self) -> pb.HeartbeatRequest | None:
        if self.hollow.paused:
            return None
        return pb.HeartbeatRequest(
            node_id=self.node_id,
            usage=pb.NodeUsage(cpu_percent=1.0, memory_used_mb=256, disk_used_mb=1024, workloads=len(self.desired)),
        )

    def on_registered(self, resp: pb.RegisterNodeResponse) -> None:
        h = self.hollow
        if self.ever_registered:
            return
        self.ever_registered = True
        h.c.registered += 1
        if h.c.registered == len(h.nodes):
            h.register_done = time.monotonic()
        if h.args.report_interval > 0:
            h.spawn(self._periodic_reports())

    def on_heartbeat_answer(self, resp: pb.HeartbeatResponse, sent: float | None) -> None:
        h = self.hollow
        h.c.heartbeats_ok += 1
        if sent is not None:
            h.hb_latency.append(time.monotonic() - sent)
        if resp.reregister:
            h.c.reregisters += 1

    def on_new_stream(self) -> None:
        self.unreported = None  # a new stream starts with a complete report, as the agent's does

    def on_call_failed(self, call: str, err: grpc.aio.AioRpcError) -> None:
        h = self.hollow
        counter = {"register": "register_errors", "heartbeat": "heartbeat_errors", "report": "report_errors"}
        name = counter.get(call, "stream_errors")
        setattr(h.c, name, getattr(h.c, name) + 1)
        h.errors_by_code[f"{call} {err.code().name}"] += 1
        h.c.last_error = f"{call} {self.node_id}: {err.code().name} {err.details()}"

    async def accept_desired(self, ds: pb.AssignmentSet) -> None:
        h = self.hollow
        now = time.monotonic()
        if not self.synced:
            self.synced = True
            h.c.streams_ready += 1
        h.c.desired_msgs += 1
        h.c.desired_items += len(ds.workloads)
        if ds.full:  # otherwise a delta: changed workloads plus `removed`
            self.desired = {}
            self.unreported = None
        if ds.removed:
            self.unreported = None  # something is gone: the next report is complete, as the agent's is
        for wid in ds.removed:
            self.desired.pop(wid, None)
        for a in ds.workloads:
            wid = a.instance_id
            h.received(wid, now)
            self.desired[wid] = (a.revision, a.generation)
            if self.unreported is not None:
                self.unreported.add(wid)
        self._schedule_report()

    # ------------------------------------------------------------------ the fake runtime's reports

    def _schedule_report(self) -> None:
        if self.reporting:
            self.dirty = True  # coalesce: the running report loop sends the latest set again
            return
        self.reporting = True
        self.hollow.spawn(self._report())

    async def _report(self) -> None:
        h = self.hollow
        try:
            while not h.stopping.is_set():
                self.dirty = False
                # Like the agent: only what changed, or everything when a complete report is due.
                complete = self.unreported is None
                wids = list(self.desired) if complete else [w for w in self.unreported or () if w in self.desired]
                self.unreported = set()
                req = pb.ReportStatusRequest(
                    node_id=self.node_id,
                    workloads=[
                        pb.WorkloadReport(
                            instance_id=wid, revision=self.desired[wid][0], generation=self.desired[wid][1],
                            state=pb.WORKLOAD_STATE_RUNNING, runtime_id=f"hollow-{wid}",
                        )
                        for wid in wids
                    ],
                    complete=complete,
                )
                if await self.link.report(req):
                    h.c.reports_ok += 1
                else:
                    self.unreported = None
                    self.dirty = True
                    await asyncio.sleep(1.0)
                if not self.dirty:
                    return
        finally:
            self.reporting = False

    async def _periodic_reports(self) -> None:
        while True:
            await asyncio.sleep(self.hollow.args.report_interval)
            if self.synced:
                self.unreported = None  # the periodic report is a complete one
                self._schedule_report()


class Hollow:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        tls_dir = Path(args.tls_dir)
        files = TLSFiles(tls_dir / "ca.crt", tls_dir / f"{args.cert}.crt", tls_dir / f"{args.cert}.key")
        creds = channel_credentials(files)
        targets = [t.strip() for t in args.scheduler.split(",") if t.strip()]
        self.channels = [
            grpc.aio.secure_channel(
                target,
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
            for target in targets for i in range(max(1, args.channels))
        ]
        per = max(1, args.channels)
        gate = asyncio.Semaphore(max(1, args.register_concurrency))
        self.c = Counters()
        self.nodes = [HollowNode(self, args.offset + i,
                                 {t: self.channels[k * per + i % per] for k, t in enumerate(targets)}, gate)
                      for i in range(args.nodes)]
        self.first_seen: dict[str, float] = {}
        self.waiters: dict[str, list[asyncio.Future[float]]] = {}
        self.hb_latency: list[float] = []
        self.errors_by_code: collections.Counter[str] = collections.Counter()
        self.paused = False
        self.register_started = 0.0
        self.register_done = 0.0
        self._links: list[asyncio.Task[None]] = []
        self._bg: set[asyncio.Task[None]] = set()
        self.stopping = asyncio.Event()

    def received(self, wid: str, now: float) -> None:
        """First receipt of a workload by any node (what the driver measures)."""
        if wid in self.first_seen:
            return
        self.first_seen[wid] = now
        for fut in self.waiters.pop(wid, ()):
            if not fut.done():
                fut.set_result(now)

    # ------------------------------------------------------------------ plumbing

    def spawn(self, coro: Any) -> None:
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
        self.register_started = time.monotonic()
        for node in self.nodes:
            self._links += node.link.start()
        # Thousands of nodes' streams and state are millions of long-lived objects: without this,
        # a full garbage collection now and then stops this process for 40-100 ms, and the probe
        # that was being delivered meanwhile shows it as scheduler latency. The same guard as
        # the scheduler's (persys.scheduler.replica.heap).
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
            tasks = [*self._links, *self._bg]
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
            for ch in self.channels:
                with contextlib.suppress(Exception):
                    await ch.close(grace=None)
            with contextlib.suppress(OSError):
                os.unlink(self.args.control)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", required=True, help="scheduler gRPC address host:port (replicas: a,b)")
    ap.add_argument("--ack-deadline", type=float, default=0.0,
                    help="seconds without an acknowledgement before probing the replicas (0: two heartbeats)")
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
