"""The agent loop: register, heartbeat, receive desired state, reconcile locally, report.

The agent never decides placement. It keeps what it was last told in a local database so
that after a restart it adopts the workloads that still run instead of starting copies, and
it removes nothing until the scheduler has sent a fresh desired state in normal mode: an
agent that cannot reach its scheduler holds, it does not guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from persys import __version__
from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys.agent import disconnect
from persys.agent.failover import ACK_DEADLINE, AckDeadline, abandons, next_target
from persys.agent.host import UsageSampler, capacity
from persys.agent.localstate import LocalState
from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    Runtime,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.model import DesiredState, RestartPolicy, Taint, WorkloadSpec
from persys.model.limits import IMAGE_MAX_BYTES
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import TLSFiles

log = logging.getLogger(__name__)
FULL_REPORT_SECONDS = 10.0  # a complete report at least this often; changes go out at once

STATE_TO_PB = {
    RuntimeState.RUNNING: pb.WORKLOAD_STATE_RUNNING,
    RuntimeState.STOPPED: pb.WORKLOAD_STATE_STOPPED,
    RuntimeState.FAILED: pb.WORKLOAD_STATE_FAILED,
    RuntimeState.MISSING: pb.WORKLOAD_STATE_MISSING,
}
BACKOFF_CAP = 30.0
RESYNC_EVERY = 5.0  # seconds between reopenings of the desired-state stream to get a full set


def _backoff(attempts: int) -> float:
    """Exponential, capped, with +-20% jitter so a fleet of crash loops does not pulse in step."""
    return min(2.0**attempts, BACKOFF_CAP) * random.uniform(0.8, 1.2)


@dataclass
class AgentConfig:
    node_id: str = field(default_factory=socket.gethostname)
    scheduler: str = "127.0.0.1:7443"
    tls: TLSFiles | None = None
    state_dir: Path = Path("/var/lib/persys/agent")
    address: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    # Capacity overrides (e.g. to reserve part of the host for the system); 0 = measure.
    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    reconcile_interval: float = 2.0
    orphan_grace: float = 30.0  # seconds a never-desired workload is left alone before removal
    probe_interval: float = 30.0  # seconds between capability detections
    failure_grace: float = 30.0  # a retryable failure is reported Failed only once it lasts this long
    listen: str = ""  # where AgentService (logs) listens, e.g. 0.0.0.0:7444; "" = not served
    advertise_host: str = ""  # host the control plane dials for AgentService (default: from listen)
    ack_deadline: float = 0.0  # seconds without an acknowledgement before leaving a replica; 0 = 2 heartbeats
    image_max_bytes: int = IMAGE_MAX_BYTES  # largest image upload AgentService.LoadImage accepts


@dataclass
class Desired:
    revision: str
    generation: int
    desired_state: DesiredState
    spec: WorkloadSpec


@dataclass
class Failure:
    revision: str
    code: str
    message: str
    terminal: bool
    attempts: int = 1
    next_try: float = 0.0
    since: float = field(default_factory=time.monotonic)  # first failure of this streak


class Agent:
    def __init__(self, config: AgentConfig, runtimes: Sequence[Runtime]) -> None:
        self.config = config
        self.all_runtimes = list(runtimes)
        self.runtimes: dict[str, Runtime] = {}
        self.capabilities: list[pb.RuntimeCapability] = []
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.local = LocalState(config.state_dir / "agent.db")
        self.desired: dict[str, Desired] = {}
        self.synced = False  # a desired snapshot arrived in normal mode since we started
        self.mode = "normal"
        self.failures: dict[str, Failure] = {}
        self.restarts: dict[str, int] = {}
        self._known: set[str] = set()  # every workload desired here since start (or in local state)
        self._orphans: dict[str, float] = {}  # workload -> when first seen undesired and unknown
        # Desired here with a spec this agent cannot read (a workload the scheduler quarantines
        # after a stricter model, an old local record): kept as they run, never removed.
        self._unreadable: set[str] = set()
        self._kept_logged: set[str] = set()
        self.usage: dict[str, ObservedWorkload] = {}  # workload -> last usage sample (cpu, memory, io)
        self.usage_interval = 5.0
        self.heartbeat_interval = 3.0
        self.report_interval = 2.0
        self.registered = asyncio.Event()
        self._wake = asyncio.Event()
        self._sampler = UsageSampler(config.state_dir)
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        # Scheduler replicas to try; a standby names the active one and we follow it.
        self._targets = [t.strip() for t in config.scheduler.split(",") if t.strip()] or [config.scheduler]
        self.target = self._targets[0]
        self._channel_gen = 0
        self._switch_lock = asyncio.Lock()
        self._suspect_until: dict[str, float] = {}  # replica -> until when its pointers are not followed
        self._stub: pb_grpc.AgentControlStub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False  # stop() is ending the tasks: their end is expected
        self._updates: grpc.aio.StreamStreamCall | None = None  # heartbeats and reports, when open
        self._watch_call: grpc.aio.UnaryStreamCall | None = None  # WatchAssignments, when open
        self._watch_reopen = False  # the agent cancelled the watch call itself to get a full set
        self._resync_asked = float("-inf")
        self._reported: dict[str, tuple[object, ...]] | None = None  # what the scheduler was last told
        self._last_full_report = 0.0
        self._send_lock = asyncio.Lock()
        # Loss of every replica (persys.agent.disconnect): acknowledged contact, the scheduler's
        # node grace (0 until it tells us) and the instances stopped for disconnection -> when.
        self.contact = disconnect.AckClock()
        self.node_grace = 0.0
        self._started_at = time.monotonic()
        self._full_set_at: float | None = None
        self._heartbeat_now = asyncio.Event()  # (re)connected: heartbeat at once, not at the next tick
        self._load_local()
        self.fenced: dict[str, float] = dict.fromkeys(self.local.disconnect_stops(), self._started_at)
        self._resume: set[str] = set()  # released from a disconnection stop: start regardless of restartPolicy

    def _load_local(self) -> None:
        for wid, rec in self.local.desired().items():
            try:
                spec = WorkloadSpec.model_validate_json(rec.spec_json)
            except ValueError:
                log.error("unreadable local record for %s: an instance of it is kept as it is", wid)
                self._unreadable.add(wid)
                continue
            self.desired[wid] = Desired(rec.revision, rec.generation, DesiredState(rec.desired_state), spec)
            self._known.add(wid)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.probe_runtimes()
        if self.config.listen and self.config.tls:
            from persys.agent.service import serve

            self._server, port = await serve(self, self.config.listen, self.config.tls)
            host = self.config.advertise_host or self.config.listen.rpartition(":")[0]
            if host in ("0.0.0.0", "[::]", ""):
                host = socket.gethostname()
            self.config.address = f"{host}:{port}"
        await self._connect(self._targets[0])
        self._tasks = [
            asyncio.create_task(self._register_loop(), name="agent-register"),
            asyncio.create_task(self._watch_loop(), name="agent-watch"),
            asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat"),
            asyncio.create_task(self._updates_loop(), name="agent-updates"),
            asyncio.create_task(self._reconcile_loop(), name="agent-reconcile"),
            asyncio.create_task(self._usage_loop(), name="agent-usage"),
            asyncio.create_task(self._probe_loop(), name="agent-probe"),
            asyncio.create_task(self._disconnect_loop(), name="agent-disconnect"),
        ]
        for t in self._tasks:
            t.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """A long-lived loop must never end while the agent runs: say so loudly if one does.
        (The updates loop ends by itself against a scheduler without StreamUpdates.)"""
        if self._stopping:
            return
        if task.cancelled():
            log.error("agent task %s was cancelled while the agent runs", task.get_name())
        elif (exc := task.exception()) is not None:
            log.error("agent task %s died: %r", task.get_name(), exc, exc_info=exc)
        elif task.get_name() != "agent-updates":
            log.error("agent task %s ended while the agent runs", task.get_name())

    async def stop(self) -> None:
        """Stop the agent only: workloads keep running and are adopted by the next agent."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for rt in self.all_runtimes:
            with contextlib.suppress(Exception):
                await rt.close()
        if self._channel is not None:
            await self._channel.close()
        if self._server is not None:
            await self._server.stop(1.0)
        await asyncio.to_thread(self.local.close)

    async def probe_runtimes(self) -> bool:
        """Advertise only the runtimes that really work on this host, right now.

        Returns True when the advertised set changed (the node must register again)."""
        available: dict[str, Runtime] = {}
        caps = []
        for rt in self.all_runtimes:
            try:
                p = await asyncio.wait_for(rt.probe(), timeout=30)
            except Exception as err:  # a probe that hangs (TimeoutError) or breaks means "does not work"
                p = Probe(False, reason=f"probe failed: {err!r}")
            if p.available:
                available[rt.name] = rt
                caps.append(
                    pb.RuntimeCapability(workload_type=rt.name, version=p.version, features=p.features)
                )
            elif rt.name in self.runtimes or not self.capabilities:
                log.warning("runtime %s unavailable: %s", rt.name, p.reason)
        changed = [(c.workload_type, c.version, list(c.features)) for c in caps] != [
            (c.workload_type, c.version, list(c.features)) for c in self.capabilities
        ]
        self.runtimes = available
        self.capabilities = caps
        return changed

    async def _probe_loop(self) -> None:
        """Re-run capability detection: a runtime that breaks is withdrawn (the scheduler stops
        placing there), one that comes back is advertised again."""
        while True:
            await asyncio.sleep(self.config.probe_interval)
            if await self.probe_runtimes():
                log.warning("runtimes changed to: %s; registering again", ", ".join(sorted(self.runtimes)) or "none")
                self.registered.clear()

    # ------------------------------------------------------------------ scheduler protocol

    async def _connect(self, target: str) -> None:
        old = self._channel
        self.target = target
        self._channel = (  # only a scheduler's certificate completes the handshake
            secure_channel(target, self.config.tls, expect=peer_names.SCHEDULER) if self.config.tls
            else grpc.aio.insecure_channel(target)
        )
        self._stub = pb_grpc.AgentControlStub(self._channel)
        self._channel_gen += 1
        if old is not None:
            await old.close(grace=1.0)

    async def _after_error(self, err: grpc.aio.AioRpcError, gen: int) -> None:
        """Follow a standby's pointer to the active replica, or try the next known replica."""
        leader = ""
        for k, v in (err.trailing_metadata() or ()):
            if k == "persys-leader":
                leader = str(v)
        await self._move(err.code().name, leader, gen, str(err.details()))

    async def _move(self, code: str, pointer: str, gen: int, why: str) -> None:
        """Leave the current replica if `code` says so (see persys.agent.failover)."""
        async with self._switch_lock:
            if gen != self._channel_gen:
                return  # another loop already switched
            now = time.monotonic()
            if abandons(code, pointer, self.target):
                self._suspect_until[self.target] = now + self._ack_deadline()
            nxt = next_target(self._targets, self.target, code, pointer, self._suspect_until, now)
            if nxt is None:
                return  # stay: ask again later (a standby learns the new active within a lease TTL)
            log.info("switching scheduler %s -> %s (%s)", self.target, nxt, why)
            await self._connect(nxt)
            self.registered.clear()  # register with the replica we now talk to

    def _ack_deadline(self) -> float:
        """No answer on the update stream for this long: the replica is gone for us."""
        return self.config.ack_deadline or 2 * self.heartbeat_interval

    def _switched_under(self, gen: int) -> bool:
        """Whether a call ended in CancelledError because the agent switched replicas under it
        (closing a channel cancels its calls), not because the loop itself is being stopped."""
        task = asyncio.current_task()
        return gen != self._channel_gen and not (task is not None and task.cancelling())

    async def _ack_watchdog(self, deadline: AckDeadline, gen: int) -> None:
        """Leave a replica that acknowledges nothing within the deadline. When there is nowhere
        to go (one replica, or every other one suspect) the stream stays and is watched again:
        the next silent deadline tries again."""
        while gen == self._channel_gen:
            left = deadline.due_in(time.monotonic())
            if left > 0:
                await asyncio.sleep(max(left, 0.05))  # acks move the deadline: look again when it is due
                continue
            log.warning("scheduler %s acknowledged nothing for %.1fs; trying another replica", self.target,
                        deadline.seconds)
            # Shielded: switching closes the channel, which ends the stream whose loop cancels us.
            await asyncio.shield(self._move(ACK_DEADLINE, "", gen, "no acknowledgement within the deadline"))
            deadline.rearm(time.monotonic())  # stayed: a full deadline again before the next try

    @property
    def stub(self) -> pb_grpc.AgentControlStub:
        assert self._stub is not None, "agent not started"
        return self._stub

    def _register_request(self) -> pb.RegisterNodeRequest:
        c = self.config
        cap = capacity(c.state_dir)
        return pb.RegisterNodeRequest(
            node_id=c.node_id,
            address=c.address,
            agent_version=__version__,
            capabilities=pb.NodeCapabilities(
                runtimes=self.capabilities,
                storage_drivers=["local"],
                cpu_millicores=c.cpu_millicores or cap.cpu_millicores,
                memory_mb=c.memory_mb or cap.memory_mb,
                disk_mb=c.disk_mb or cap.disk_mb,
            ),
            labels=c.labels,
            taints=[pb.Taint(key=t.key, value=t.value, effect=t.effect) for t in c.taints],
        )

    async def _register_loop(self) -> None:
        delay = 0.2
        while True:
            if self.registered.is_set():
                await asyncio.sleep(1.0)
                continue
            gen = self._channel_gen
            try:
                sent = time.monotonic()
                resp = await self.stub.RegisterNode(self._register_request(), timeout=10)
                self.contact.contact(sent)  # a registration counts as a heartbeat there
                self.node_grace = resp.node_grace_seconds or self.node_grace
                self._heartbeat_now.set()
                self.heartbeat_interval = resp.heartbeat_interval_seconds or self.heartbeat_interval
                self.report_interval = resp.report_interval_seconds or self.report_interval
                self.registered.set()
                delay = 0.2
                log.info("registered node %s with %s", self.config.node_id, self.target)
            except asyncio.CancelledError:
                if not self._switched_under(gen):
                    raise
                continue  # the replica was switched under the call: register with the new one
            except grpc.aio.AioRpcError as err:
                log.warning("registration failed (%s); retrying in %.1fs", err.details(), delay)
                await self._after_error(err, gen)
                await asyncio.sleep(delay)
                # A standby answers at once: ask again soon, the election takes about a lease TTL.
                delay = min(delay * 2, 1.0 if err.code() == grpc.StatusCode.FAILED_PRECONDITION else 5.0)

    async def _heartbeat_loop(self) -> None:
        await self.registered.wait()
        while True:
            cpu, mem, disk = self._sampler.sample()
            req = pb.HeartbeatRequest(
                node_id=self.config.node_id,
                usage=pb.NodeUsage(cpu_percent=cpu, memory_used_mb=mem, disk_used_mb=disk,
                                   workloads=len(self.desired)),
            )
            self._heartbeat_now.clear()
            self.contact.sent(time.monotonic())
            if not await self._send(pb.AgentUpdate(heartbeat=req)):
                self.contact.unsent()
                gen = self._channel_gen
                try:
                    sent = time.monotonic()
                    resp = await self.stub.Heartbeat(req, timeout=5)
                    self._on_heartbeat_answer(resp)
                    if resp.acknowledged:
                        self.contact.contact(sent)
                except asyncio.CancelledError:
                    if not self._switched_under(gen):
                        raise
                except grpc.aio.AioRpcError as err:
                    log.debug("heartbeat failed: %s", err.details())
                    await self._after_error(err, gen)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._heartbeat_now.wait(),
                                       disconnect.heartbeat_interval(self.heartbeat_interval, self.node_grace))

    def _on_heartbeat_answer(self, resp: pb.HeartbeatResponse) -> None:
        self.mode = resp.mode or "normal"
        self.node_grace = resp.node_grace_seconds or self.node_grace
        if resp.reregister:
            self.registered.clear()
            self._reported = None

    async def _updates_loop(self) -> None:
        """Keep one StreamUpdates call open for heartbeats and reports (see the proto). Against a
        scheduler without it, the agent falls back to one call per heartbeat and report."""
        delay = 0.2
        while True:
            await self.registered.wait()
            gen = self._channel_gen
            call = self.stub.StreamUpdates()
            self._updates = call
            deadline = AckDeadline(self._ack_deadline(), time.monotonic())
            watchdog = asyncio.create_task(self._ack_watchdog(deadline, gen), name="agent-ack-deadline")
            self._heartbeat_now.set()
            try:
                async for ack in call:
                    deadline.acked(time.monotonic())
                    delay = 0.2
                    if ack.HasField("heartbeat"):
                        self.contact.answered(ack.heartbeat.acknowledged)
                        self._on_heartbeat_answer(ack.heartbeat)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("scheduler %s has no update stream; using one call per update", self.target)
                    return
                log.info("update stream interrupted (%s); reconnecting in %.1fs", err.details(), delay)
                await self._after_error(err, gen)
            except asyncio.CancelledError:
                if not self._switched_under(gen):
                    raise
            finally:
                watchdog.cancel()
                self._updates = None
                self.contact.reset()
                self._reported = None  # a new stream (or replica) starts with a complete report
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _send(self, update: pb.AgentUpdate) -> bool:
        """Write to the update stream; False when it is not open (the caller makes a call instead)."""
        call = self._updates
        if call is None:
            return False
        async with self._send_lock:  # one write at a time on a stream
            try:
                await call.write(update)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as err:
                log.debug("update stream write failed: %s", err)
                return False
        return True

    async def _watch_loop(self) -> None:
        delay = 0.2
        while True:
            await self.registered.wait()
            gen = self._channel_gen
            self._watch_reopen = False
            try:
                call = self.stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id=self.config.node_id,
                                                                             deltas=True))
                self._watch_call = call
                async for ds in call:
                    delay = 0.2
                    await self._accept_desired(ds)
            except grpc.aio.AioRpcError as err:
                log.info("desired-state stream interrupted (%s); reconnecting in %.1fs", err.details(), delay)
                await self._after_error(err, gen)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                reopen = self._watch_reopen and not (task is not None and task.cancelling())
                if not (reopen or self._switched_under(gen)):
                    raise
                if reopen:
                    delay = 0.2
            finally:
                self._watch_call = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _accept_desired(self, ds: pb.DesiredState) -> None:
        """Take a full desired set or a delta (see DesiredState in the proto)."""
        self.mode = ds.mode or "normal"
        changed: dict[str, Desired] = {}
        unreadable: set[str] = set()
        dropped = set(self._unreadable)
        for a in ds.workloads:
            try:
                spec = WorkloadSpec.model_validate_json(a.spec_json)
            except ValueError as err:
                if a.workload_id not in self._unreadable:
                    log.error("scheduler sent an unreadable spec for %s: %s", a.workload_id, err)
                unreadable.add(a.workload_id)
                continue
            d = Desired(a.revision, a.generation, DesiredState(a.desired_state), spec)
            old = self.desired.get(a.workload_id)
            if old is not None and old.generation > d.generation:
                continue  # fencing: never go back to an older generation
            changed[a.workload_id] = d
        holding = self.mode != "normal"  # hold: accept updates but never remove anything
        if ds.full and not holding:
            self.synced = True
            self._full_set_at = time.monotonic()
            removed = set(self.desired) - {a.workload_id for a in ds.workloads}
            self._unreadable = unreadable  # the scheduler's list replaces what we had
        else:
            removed = set() if holding else set(ds.removed) & set(self.desired)
            if not holding:
                self._unreadable -= set(ds.removed)
            self._unreadable = (self._unreadable - set(changed)) | unreadable
        self._kept_logged &= self._unreadable
        removed |= dropped - self._unreadable - set(changed)  # unreadable local records no longer listed
        incoming = {wid: d for wid, d in self.desired.items() if wid not in removed}
        incoming.update(changed)
        self.desired = incoming
        self._known.update(changed)

        def persist() -> None:
            for wid in removed:
                self.local.forget(wid)
            for wid, d in changed.items():
                self.local.save_desired(wid, d.revision, d.generation, str(d.desired_state), d.spec.to_json())

        await asyncio.to_thread(persist)
        self._wake.set()

    # ------------------------------------------------------------------ local reconciliation

    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.reconcile_interval)
            self._wake.clear()
            try:
                observed = await self.reconcile_once()
            except Exception:
                log.exception("local reconcile failed")
                continue
            if self.registered.is_set():
                gen = self._channel_gen
                try:
                    await self._report(observed)
                except asyncio.CancelledError:
                    if not self._switched_under(gen):
                        raise
                except grpc.aio.AioRpcError as err:
                    log.debug("status report failed: %s", err.details())
                    await self._after_error(err, gen)

    async def _usage_loop(self) -> None:
        """Sample per-workload usage apart from reconciliation: Docker's stats call alone
        takes about a second, which must not slow convergence."""
        while True:
            await asyncio.sleep(self.usage_interval)
            sampled: dict[str, ObservedWorkload] = {}
            for wid, d in list(self.desired.items()):
                rt = self.runtimes.get(d.spec.type)
                if rt is None:
                    continue
                try:
                    o = await rt.inspect(wid)
                except RuntimeFailure:
                    continue
                if o is not None and o.state == RuntimeState.RUNNING:
                    sampled[wid] = o
            self.usage = sampled

    async def _observe(self) -> dict[str, tuple[Runtime, ObservedWorkload]]:
        seen: dict[str, tuple[Runtime, ObservedWorkload]] = {}
        for rt in self.runtimes.values():
            try:
                for o in await rt.list():
                    seen[o.workload_id] = (rt, o)
            except RuntimeFailure as err:
                log.warning("runtime %s could not list workloads: %s", rt.name, err)
        return seen

    async def reconcile_once(self) -> dict[str, tuple[Runtime, ObservedWorkload]]:
        """Drive local runtimes toward the desired set; returns what is observed afterwards."""
        observed = await self._observe()
        acted = False
        fenced = await self._apply_disconnect()
        now = time.monotonic()
        for wid, d in list(self.desired.items()):
            rt = self.runtimes.get(d.spec.type)
            if rt is None:
                self.failures[wid] = Failure(
                    d.revision, "RuntimeUnavailable", f"no working {d.spec.type} runtime on this node", True
                )
                continue
            o = observed.get(wid, (rt, None))[1]
            running = o is not None and o.state == RuntimeState.RUNNING
            if wid in fenced:  # stopped for disconnection: only the scheduler may start it again
                if running:
                    await rt.stop(wid)
                    acted = True
                continue
            if d.desired_state == DesiredState.STOPPED:
                if running:
                    await rt.stop(wid)
                    acted = True
                continue
            if running and o is not None and o.revision == d.revision:
                f = self.failures.get(wid)
                if f is not None and f.revision == d.revision and not f.terminal:
                    self.failures.pop(wid, None)
                continue
            exited = (
                o is not None and not running and o.revision == d.revision and o.state != RuntimeState.MISSING
            )
            if wid in self._resume:  # we stopped it for disconnection, it did not exit by itself
                self._resume.discard(wid)
                exited = False
            if exited and o is not None:
                policy = d.spec.restart_policy
                if policy == RestartPolicy.NEVER or (policy == RestartPolicy.ON_FAILURE and o.exit_code == 0):
                    continue
            f = self.failures.get(wid)
            if f is not None and f.revision == d.revision and (f.terminal or now < f.next_try):
                continue
            try:
                await rt.start(RuntimeWorkload(wid, d.revision, d.generation, d.spec))
                acted = True
                if exited:
                    self.restarts[wid] = self.restarts.get(wid, 0) + 1
                    # A crash loop backs off like any failure.
                    attempts = (f.attempts + 1) if f and f.revision == d.revision else 1
                    self.failures[wid] = Failure(
                        d.revision, "Restarted", "", False, attempts, now + _backoff(attempts)
                    )
            except RuntimeFailure as err:
                streak = f is not None and f.revision == d.revision
                attempts = (f.attempts + 1) if f and streak else 1
                self.failures[wid] = Failure(
                    d.revision,
                    err.code,
                    str(err.args[0] if err.args else err),
                    err.terminal,
                    attempts,
                    now + _backoff(attempts),
                    f.since if f and streak else now,
                )
                log.warning("starting %s failed: %s", wid, err)
        if self.synced and self.mode == "normal":
            for wid, (rt, _o) in observed.items():
                if wid in self.desired:
                    self._orphans.pop(wid, None)
                    continue
                if wid in self._unreadable:
                    # Listed for this node, but in a form this agent cannot read: neither start
                    # nor remove it (the scheduler keeps such a workload as it is, too).
                    if wid not in self._kept_logged:
                        self._kept_logged.add(wid)
                        log.warning("keeping %s as it is: its desired spec is unreadable here", wid)
                    self._orphans.pop(wid, None)
                    continue
                if wid not in self._known:
                    # Never desired here since we started: an orphan. Give the scheduler a grace
                    # period to claim it (a restore in progress, a slow replica) before removing.
                    first = self._orphans.setdefault(wid, now)
                    if now - first < self.config.orphan_grace:
                        continue
                    log.warning("removing orphan %s: unknown to the scheduler for %.0fs", wid, now - first)
                else:
                    log.info("removing %s: no longer desired on this node", wid)
                await rt.remove(wid)
                self._orphans.pop(wid, None)
                self.failures.pop(wid, None)
                self.restarts.pop(wid, None)
                acted = True
        return await self._observe() if acted else observed

    # ------------------------------------------------------------------ loss of every replica

    def _disconnect_verdict(self) -> disconnect.Verdict:
        policies = {wid: d.spec.disconnect_policy() for wid, d in self.desired.items()
                    if d.desired_state == DesiredState.RUNNING}
        return disconnect.decide(disconnect.Snapshot(
            now=time.monotonic(), started_at=self._started_at, last_ack=self.contact.last_ack,
            last_full_set=self._full_set_at, grace=self.node_grace,
            heartbeat_interval=disconnect.heartbeat_interval(self.heartbeat_interval, self.node_grace),
            policies=policies, fenced=self.fenced))

    async def _apply_disconnect(self) -> set[str]:
        """Record instances to stop for disconnection and those the scheduler decides on again;
        returns the ones that must not run now."""
        v = self._disconnect_verdict()
        if v.fence:
            log.warning("no scheduler replica acknowledged a heartbeat for %.1fs (limit %.1fs of grace %.1fs): "
                        "stopping %s (onDisconnect: Stop)", v.silent_for, v.stop_after, self.node_grace,
                        ", ".join(v.fence))
            now = time.monotonic()
            self.fenced.update(dict.fromkeys(v.fence, now))
            await asyncio.to_thread(self.local.save_disconnect_stops, list(v.fence), disconnect.REASON)
        if v.release:
            log.info("scheduler reachable again: its desired state decides on %s", ", ".join(v.release))
            for wid in v.release:
                self.fenced.pop(wid, None)
                self._resume.add(wid)
            await asyncio.to_thread(self.local.clear_disconnect_stops, list(v.release))
        return set(self.fenced)

    async def _disconnect_loop(self) -> None:
        """Wake the local reconciliation at the disconnection deadline, not a reconcile tick later."""
        while True:
            v = self._disconnect_verdict()
            if v.fence or v.release:
                self._wake.set()
            if v.resync:
                self._reopen_watch()
            wait = 1.0 if v.next_check is None else v.next_check - time.monotonic()
            await asyncio.sleep(min(max(wait, 0.05), 1.0))

    def _reopen_watch(self) -> None:
        """Instances stopped for disconnection wait for a full desired set, but acknowledgements
        came back without the desired-state stream reopening (the scheduler sends a full set
        only when one opens): cancel the call so the watch loop opens a new one."""
        call, now = self._watch_call, time.monotonic()
        if call is None or now - self._resync_asked < RESYNC_EVERY:
            return
        self._resync_asked = now
        log.info("acknowledged again after a disconnection stop: reopening the desired-state stream "
                 "for a full desired set")
        self._watch_reopen = True
        call.cancel()

    async def _report(self, observed: dict[str, tuple[Runtime, ObservedWorkload]]) -> None:
        reports = []
        for wid, d in self.desired.items():
            o = observed.get(wid, (None, None))[1]
            f = self.failures.get(wid)
            r = pb.WorkloadReport(
                workload_id=wid, generation=d.generation, restarts=self.restarts.get(wid, 0)
            )
            if o is not None:
                r.revision = o.revision
                r.state = STATE_TO_PB[o.state]
                r.runtime_id = o.runtime_id
                r.message = o.message
                u = self.usage.get(wid, o)
                r.cpu_percent, r.memory_bytes = u.cpu_percent, u.memory_bytes
                r.disk_read_bytes, r.disk_write_bytes = u.disk_read_bytes, u.disk_write_bytes
                r.net_rx_bytes, r.net_tx_bytes = u.net_rx_bytes, u.net_tx_bytes
                if o.exit_code is not None:
                    r.exit_code, r.has_exit_code = o.exit_code, True
                if o.state == RuntimeState.STOPPED and d.desired_state == DesiredState.STOPPED:
                    r.reason = "Stopped"
                if wid in self.fenced and o.state != RuntimeState.RUNNING:
                    r.reason = disconnect.REASON
                    r.message = "stopped while no scheduler replica answered (onDisconnect: Stop)"
            else:
                r.revision = d.revision
                r.state = pb.WORKLOAD_STATE_PENDING
            if (
                f is not None
                and f.revision == d.revision
                and f.code != "Restarted"
                and (o is None or o.state != RuntimeState.RUNNING)
            ):
                if f.terminal or time.monotonic() - f.since >= self.config.failure_grace:
                    r.state = pb.WORKLOAD_STATE_FAILED
                    r.reason, r.message, r.terminal = f.code, f.message, f.terminal
                else:
                    # Within the failure grace period a retryable failure is reported as still
                    # starting: one hiccup of a daemon does not make a workload Failed.
                    r.state = pb.WORKLOAD_STATE_PENDING
                    r.reason = "Retrying"
                    r.message = f"attempt {f.attempts} failed ({f.code}: {f.message}); retrying"
            reports.append(r)
        # Anything still running but no longer desired is listed too, so "complete" is honest.
        for wid, (_rt, o) in observed.items():
            if wid not in self.desired:
                reports.append(
                    pb.WorkloadReport(
                        workload_id=wid,
                        revision=o.revision,
                        generation=o.generation,
                        state=STATE_TO_PB[o.state],
                        runtime_id=o.runtime_id,
                    )
                )
        # Only what changed since the last report goes out, except for a complete one (which
        # lets the scheduler act on absences) after (re)connecting, when something disappeared,
        # and every FULL_REPORT_SECONDS (which also refreshes usage figures).
        seen: dict[str, tuple[object, ...]] = {
            r.workload_id: (r.revision, r.state, r.reason, r.message, r.terminal, r.runtime_id, r.restarts,
                            r.has_exit_code, r.exit_code) for r in reports}
        now = time.monotonic()
        last = self._reported
        complete = last is None or now - self._last_full_report >= FULL_REPORT_SECONDS or not last.keys() <= seen.keys()
        if not complete:
            assert last is not None
            reports = [r for r in reports if last.get(r.workload_id) != seen[r.workload_id]]
            if not reports:
                return
        req = pb.ReportStatusRequest(node_id=self.config.node_id, workloads=reports, complete=complete)
        self._reported = None  # until this one is out
        if not await self._send(pb.AgentUpdate(report=req)):
            await self.stub.ReportStatus(req, timeout=10)
        self._reported = seen
        if complete:
            self._last_full_report = now
