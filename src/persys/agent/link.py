"""The agent's link to the scheduler: the only agent code that speaks gRPC to a replica.

It registers the node, heartbeats, keeps the StreamUpdates call (heartbeats and reports, with
their acknowledgements) and the WatchAssignments call open, and moves between replicas (the
choice is the pure `persys.agent.failover`). What it carries comes from and goes to a
`LinkHandler`: the agent, or a hollow node of the scale benchmark (bench/scale/hollow.py),
which reuses this link with nothing running behind it, as kubemark's hollow nodes do.
The agent loop sees the link through the narrow `SchedulerLink` protocol.

Over 500 lines on purpose: one GrpcLink, with the SchedulerLink protocol it implements and
the LinkHandler it drives. Registration, heartbeats, the update stream, the watch, fail-over
between replicas and channel renewal share one generation counter and set of channels;
splitting them would expose that state. Its decisions are pure (`persys.agent.failover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from persys._pb.persys.v1 import control_pb2 as pb
from persys._pb.persys.v1 import control_pb2_grpc as pb_grpc
from persys._pb.persys.v1 import secrets_pb2 as spb
from persys._pb.persys.v1 import secrets_pb2_grpc as spb_grpc
from persys.agent.decide import disconnect
from persys.agent.failover import (
    ACK_DEADLINE,
    ACTIVE,
    PROBED_CODES,
    REFUSING,
    SILENT,
    STANDBY,
    AckDeadline,
    Probe,
    abandons,
    better_target,
    next_target,
)
from persys.observability.grpc_tracing import with_trace_context
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)
RESYNC_EVERY = 5.0  # seconds between reopenings of the desired-state stream to get a full set
# A channel replaced by a renewed certificate's waits this long for unary calls begun on it (their
# timeouts are shorter) once its streams have ended.
RETIRED_GRACE = 15.0
# A replica gets this long to answer a probe before it counts as silent (persys.agent.failover);
# the watchdog probes again this often while the update stream stays silent.
PROBE_TIMEOUT = 2.0
REPROBE_EVERY = 1.0


class DesiredNotRecorded(Exception):
    """accept_desired could not make a desired set durable (a full or failing disk). The stream's
    next deltas would build on the set that was lost: the link asks for the full set again."""


class LinkHandler(Protocol):
    """What the link needs from the node it speaks for."""

    def register_request(self) -> pb.RegisterNodeRequest: ...

    def heartbeat_request(self) -> pb.HeartbeatRequest | None:
        """The next heartbeat, or None to skip this beat (a paused hollow node)."""
        ...

    async def accept_desired(self, ds: pb.AssignmentSet) -> None: ...

    def on_registered(self, resp: pb.RegisterNodeResponse) -> None: ...

    def on_heartbeat_answer(self, resp: pb.HeartbeatResponse, sent: float | None) -> None:
        """A replica answered a heartbeat sent at `sent` (monotonic; None when unknown)."""
        ...

    def on_new_stream(self) -> None:
        """The update stream (or the replica) changed: the next report must be complete."""
        ...

    def on_call_failed(self, call: str, err: grpc.aio.AioRpcError) -> None:
        """A call to the scheduler failed (already logged and acted on here)."""
        ...


class SchedulerLink(Protocol):
    """What the agent loop uses of its link."""

    @property
    def registered(self) -> asyncio.Event: ...

    @property
    def last_ack(self) -> float | None:
        """Send time of the latest heartbeat a replica acknowledged (persys.agent.decide.disconnect)."""
        ...

    @property
    def node_grace(self) -> float: ...

    @property
    def heartbeat_interval(self) -> float: ...

    @property
    def target(self) -> str:
        """The replica the link talks to now."""
        ...

    def start(self) -> list[asyncio.Task[None]]: ...

    async def close(self) -> None: ...

    def reregister(self) -> None: ...

    def reopen_watch(self) -> None: ...

    async def resolve_secrets(self, instance_id: str) -> spb.ResolveSecretsResponse:
        """The secret values one of this node's instances references, resolved now."""
        ...

    async def resolve_storage_key(self, driver: str, secret_name: str) -> bytes:
        """A storage driver's key, from the secret the cluster's storage configuration names."""
        ...

    def refresh_credentials(self) -> None:
        """The node's certificate was renewed: new calls use it, open streams go on."""
        ...

    async def report(self, req: pb.ReportStatusRequest) -> bool:
        """Send a status report; False when it did not go out (the next one must be complete)."""
        ...


def dial(target: str, tls: TLSFiles | None) -> grpc.aio.Channel:
    """The one place the agent opens a channel to a scheduler replica."""
    # Only a scheduler's certificate completes the handshake.
    return secure_channel(target, tls, expect=peer_names.SCHEDULER) if tls else grpc.aio.insecure_channel(target)


@dataclass
class LinkOptions:
    ack_deadline: float = 0.0  # seconds without an acknowledgement before leaving a replica; 0 = 2 heartbeats
    heartbeat_interval: float = 0.0  # fixed interval; 0 = as the scheduler says at registration
    register_timeout: float = 10.0
    register_gate: asyncio.Semaphore | None = None  # bounds concurrent registrations (hollow nodes)
    # Share of an interval the first heartbeat waits after registering: nodes started together
    # in one process (hollow nodes) spread their heartbeats instead of sending them in step.
    heartbeat_phase: float = 0.0
    # Opens a channel to a replica; None = `dial` with the link's TLS files. A channel from a
    # given factory is shared (hollow nodes multiplex over a few) and never closed here.
    channel_factory: Callable[[str], grpc.aio.Channel] | None = None


class GrpcLink:
    def __init__(self, node_id: str, targets: Sequence[str], tls: TLSFiles | None, handler: LinkHandler,
                 options: LinkOptions | None = None) -> None:
        self.node_id = node_id
        self.tls = tls
        self.handler = handler
        self.options = options or LinkOptions()
        # Scheduler replicas to try; a standby names the active one and we follow it.
        self._targets = list(targets)
        self.target = self._targets[0]
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.AgentControlStub | None = None
        self._channel_gen = 0
        # Channels replaced by refresh_credentials, kept while a stream opened on them runs;
        # `_stream_channels` says which channel each open stream ("watch", "updates") uses.
        self._retired: list[grpc.aio.Channel] = []
        self._stream_channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._switch_lock = asyncio.Lock()
        self._suspect_until: dict[str, float] = {}  # replica -> until when its pointers are not followed
        self._registered = asyncio.Event()
        self._unregistered = asyncio.Event()
        self._unregistered.set()
        self._updates: grpc.aio.StreamStreamCall | None = None  # heartbeats and reports, when open
        self._watch_call: grpc.aio.UnaryStreamCall | None = None  # WatchAssignments, when open
        self._watch_reopen = False  # the link cancelled the watch call itself to get a full set
        self._resync_asked = float("-inf")
        self._send_lock = asyncio.Lock()
        self._heartbeat_now = asyncio.Event()  # (re)connected: heartbeat at once, not at the next tick
        self.contact = disconnect.AckClock()
        self._node_grace = 0.0  # the scheduler's, once it tells us
        self._heartbeat_interval = self.options.heartbeat_interval or 3.0
        self.report_interval = 2.0

    # ------------------------------------------------------------------ SchedulerLink

    @property
    def registered(self) -> asyncio.Event:
        return self._registered

    @property
    def last_ack(self) -> float | None:
        return self.contact.last_ack

    @property
    def node_grace(self) -> float:
        return self._node_grace

    @node_grace.setter
    def node_grace(self, value: float) -> None:
        self._node_grace = value

    @property
    def heartbeat_interval(self) -> float:
        return self._heartbeat_interval

    @heartbeat_interval.setter
    def heartbeat_interval(self, value: float) -> None:
        self._heartbeat_interval = value

    def start(self) -> list[asyncio.Task[None]]:
        self._connect(self._targets[0])
        return [
            asyncio.create_task(self._register_loop(), name="agent-register"),
            asyncio.create_task(self._watch_loop(), name="agent-watch"),
            asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat"),
            asyncio.create_task(self._updates_loop(), name="agent-updates"),
        ]

    async def close(self) -> None:
        """Close the channel (the caller has cancelled the tasks `start` returned)."""
        if self._channel is not None and self.options.channel_factory is None:
            await self._channel.close()
        await self._close_retired()

    def reregister(self) -> None:
        self._registered.clear()
        self._unregistered.set()

    def reopen_watch(self) -> None:
        """Cancel the desired-state stream so the watch loop opens a new one, which starts with
        a full set (asked at most every RESYNC_EVERY seconds)."""
        call, now = self._watch_call, time.monotonic()
        if call is None or now - self._resync_asked < RESYNC_EVERY:
            return
        self._resync_asked = now
        log.info("acknowledged again after a disconnection stop: reopening the desired-state stream "
                 "for a full desired set")
        self._watch_reopen = True
        call.cancel()

    def _delivery(self) -> spb_grpc.SecretDeliveryStub:
        if self._channel is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="not connected to a scheduler yet")
        return spb_grpc.SecretDeliveryStub(self._channel)

    async def resolve_storage_key(self, driver: str, secret_name: str) -> bytes:
        """A storage driver's key from the secret store (SecretDelivery.ResolveStorageKey);
        raises grpc.aio.AioRpcError."""
        r: spb.ResolveStorageKeyResponse = await self._delivery().ResolveStorageKey(
            spb.ResolveStorageKeyRequest(node_id=self.node_id, driver=driver, secret_name=secret_name), timeout=10)
        return r.key

    async def resolve_secrets(self, instance_id: str) -> spb.ResolveSecretsResponse:
        """The secret values an instance assigned here references (SecretDelivery, over this
        link's mTLS channel to the active replica); raises grpc.aio.AioRpcError."""
        stub = self._delivery()
        # With the trace context of the instance's start: the scheduler's span joins the apply's trace.
        r: spb.ResolveSecretsResponse = await stub.ResolveSecrets(
            spb.ResolveSecretsRequest(node_id=self.node_id, instance_id=instance_id), timeout=10,
            metadata=with_trace_context(()) or None)
        return r
    def refresh_credentials(self) -> None:
        """New calls go over a new channel, dialled with the renewed certificate; the streams open
        on the old one go on until they end by themselves (their connection was authenticated
        when it opened), and then the old channel is closed. Nothing re-registers: this is no
        switch of replica."""
        if self._channel is None or self.options.channel_factory is not None:
            return
        self._retired.append(self._channel)
        self._channel = dial(self.target, self.tls)
        self._stub = pb_grpc.AgentControlStub(self._channel)
        log.info("renewed certificate: new calls to %s use it", self.target)
        self._close_idle_retired()

    def _close_idle_retired(self) -> None:
        busy = [id(c) for c in self._stream_channels.values()]
        for ch in [c for c in self._retired if id(c) not in busy]:
            self._retired.remove(ch)
            task = asyncio.get_running_loop().create_task(ch.close(grace=RETIRED_GRACE))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_retired(self) -> None:
        """A switch or the end: every retired channel goes now (with the streams on it)."""
        retired, self._retired = self._retired, []
        for ch in retired:
            await ch.close(grace=1.0)

    def _stream_opened(self, name: str) -> None:
        if self._channel is not None:  # (tests drive the loops with a stub and no channel)
            self._stream_channels[name] = self._channel

    def _stream_ended(self, name: str) -> None:
        self._stream_channels.pop(name, None)
        if self._retired:
            self._close_idle_retired()

    async def report(self, req: pb.ReportStatusRequest) -> bool:
        if await self._send(pb.AgentUpdate(report=req)):
            return True
        gen = self._channel_gen
        try:
            await self.stub.ReportStatus(req, timeout=10)
            return True
        except asyncio.CancelledError:
            if not self._switched_under(gen):
                raise
        except grpc.aio.AioRpcError as err:
            log.debug("status report failed: %s", err.details())
            self.handler.on_call_failed("report", err)
            await self._after_error(err, gen)
        return False

    # ------------------------------------------------------------------ replicas

    @property
    def stub(self) -> pb_grpc.AgentControlStub:
        assert self._stub is not None, "link not started"
        return self._stub

    def _connect(self, target: str) -> grpc.aio.Channel | None:
        """Talk to `target` from now on; returns the channel to close (the caller awaits that)."""
        old = self._channel
        self.target = target
        factory = self.options.channel_factory
        self._channel = factory(target) if factory is not None else dial(target, self.tls)
        self._stub = pb_grpc.AgentControlStub(self._channel)
        self._channel_gen += 1
        return old if factory is None else None

    async def _after_error(self, err: grpc.aio.AioRpcError, gen: int) -> None:
        """Follow a standby's pointer to the active replica, or try the next known replica."""
        leader = ""
        for k, v in (err.trailing_metadata() or ()):
            if k == "persys-leader":
                leader = str(v)
        await self._move(err.code().name, leader, gen, str(err.details()))

    async def _move(self, code: str, pointer: str, gen: int, why: str) -> bool:
        """Leave the current replica if `code` says so and there is a better one (see
        persys.agent.failover); True when the link switched."""
        async with self._switch_lock:
            if gen != self._channel_gen:
                return True  # another loop already switched
            now = time.monotonic()
            if code in PROBED_CODES and (probes := await self._probe_all()) is not None:
                # Silent or failing: go only where a probe found something better.
                nxt = better_target(self._targets, self.target, probes, self._suspect_until, time.monotonic())
                if probes.get(self.target, Probe(SILENT)).outcome == ACTIVE:
                    return False  # it answered: slow, not gone
            else:
                if abandons(code, pointer, self.target):
                    self._suspect_until[self.target] = now + self._ack_deadline()
                nxt = next_target(self._targets, self.target, code, pointer, self._suspect_until, now)
            if nxt is None:
                return False  # stay: ask again later (a standby learns the new active within a lease TTL)
            self._suspect_until[self.target] = time.monotonic() + self._ack_deadline()
            log.info("switching scheduler %s -> %s (%s)", self.target, nxt, why)
            old = self._connect(nxt)
            if old is not None:
                await old.close(grace=1.0)
            await self._close_retired()
            self.reregister()  # register with the replica we now talk to
            return True

    async def _probe_all(self) -> dict[str, Probe] | None:
        """One heartbeat to every known replica at once, each bounded by PROBE_TIMEOUT (None:
        this node sends no heartbeat now, e.g. a paused hollow node)."""
        req = self.handler.heartbeat_request()
        if req is None:
            return None
        targets = list(dict.fromkeys([self.target, *self._targets]))
        found = await asyncio.gather(*(self._probe(t, req) for t in targets))
        return dict(zip(targets, found, strict=True))

    async def _probe(self, target: str, req: pb.HeartbeatRequest) -> Probe:
        own = target == self.target and self._channel is not None
        factory = self.options.channel_factory
        channel = self._channel if own else (factory(target) if factory is not None else dial(target, self.tls))
        assert channel is not None
        try:
            sent = time.monotonic()
            resp: pb.HeartbeatResponse = await pb_grpc.AgentControlStub(channel).Heartbeat(req, timeout=PROBE_TIMEOUT)
            if own:  # an answer from the current replica is contact like any other
                self._on_heartbeat_answer(resp, sent)
                if resp.acknowledged:
                    self.contact.contact(sent)
            return Probe(ACTIVE)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                pointer = next((str(v) for k, v in (err.trailing_metadata() or ()) if k == "persys-leader"), "")
                return Probe(STANDBY, pointer)
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return Probe(REFUSING)
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return Probe(SILENT)
            return Probe(ACTIVE)  # it answered (e.g. refused this call for a reason of its own)
        finally:
            if not own and factory is None:
                await channel.close()

    def _ack_deadline(self) -> float:
        """No answer on the update stream for this long: the replica is gone for us."""
        return self.options.ack_deadline or 2 * self._heartbeat_interval

    def _switched_under(self, gen: int) -> bool:
        """Whether a call ended in CancelledError because the link switched replicas under it
        (closing a channel cancels its calls), not because the loop itself is being stopped."""
        task = asyncio.current_task()
        return gen != self._channel_gen and not (task is not None and task.cancelling())

    async def _ack_watchdog(self, deadline: AckDeadline, gen: int) -> None:
        """Leave a replica that acknowledges nothing within the deadline, but only for a better
        one (persys.agent.failover.better_target): while the stream stays silent the replicas
        are probed every REPROBE_EVERY seconds; one that answers the probe is kept for another
        full deadline."""
        while gen == self._channel_gen:
            left = deadline.due_in(time.monotonic())
            if left > 0:
                await asyncio.sleep(max(left, 0.05))  # acks move the deadline: look again when it is due
                continue
            log.warning("scheduler %s acknowledged nothing on the update stream for %.1fs; probing the replicas",
                        self.target, deadline.seconds)
            before = self.contact.last_ack
            # Shielded: switching closes the channel, which ends the stream whose loop cancels us.
            if await asyncio.shield(self._move(ACK_DEADLINE, "", gen, "no acknowledgement within the deadline")):
                return
            if self.contact.last_ack != before:  # the replica answered the probe: a full deadline again
                deadline.rearm(time.monotonic())
            else:
                await asyncio.sleep(REPROBE_EVERY)

    # ------------------------------------------------------------------ loops

    async def _register_once(self) -> pb.RegisterNodeResponse:
        req = self.handler.register_request()
        gate = self.options.register_gate
        resp: pb.RegisterNodeResponse
        if gate is None:
            resp = await self.stub.RegisterNode(req, timeout=self.options.register_timeout)
            return resp
        async with gate:
            resp = await self.stub.RegisterNode(req, timeout=self.options.register_timeout)
        return resp

    async def _register_loop(self) -> None:
        delay = 0.2
        while True:
            await self._unregistered.wait()
            gen = self._channel_gen
            try:
                sent = time.monotonic()
                resp = await self._register_once()
                self.contact.contact(sent)  # a registration counts as a heartbeat there
                self._node_grace = resp.node_grace_seconds or self._node_grace
                self._heartbeat_now.set()
                if not self.options.heartbeat_interval:
                    self._heartbeat_interval = resp.heartbeat_interval_seconds or self._heartbeat_interval
                self.report_interval = resp.report_interval_seconds or self.report_interval
                self._unregistered.clear()
                self._registered.set()
                delay = 0.2
                log.info("registered node %s with %s", self.node_id, self.target)
                self.handler.on_registered(resp)
            except asyncio.CancelledError:
                if not self._switched_under(gen):
                    raise
                continue  # the replica was switched under the call: register with the new one
            except grpc.aio.AioRpcError as err:
                log.warning("registration failed (%s); retrying in %.1fs", err.details(), delay)
                self.handler.on_call_failed("register", err)
                await self._after_error(err, gen)
                await asyncio.sleep(delay)
                # A standby answers at once: ask again soon, the election takes about a lease TTL.
                delay = min(delay * 2, 1.0 if err.code() == grpc.StatusCode.FAILED_PRECONDITION else 5.0)

    async def _heartbeat_loop(self) -> None:
        await self._registered.wait()
        if self.options.heartbeat_phase > 0:
            await asyncio.sleep(self.options.heartbeat_phase * self._heartbeat_interval)
        while True:
            req = self.handler.heartbeat_request()
            self._heartbeat_now.clear()
            if req is not None:
                await self._heartbeat(req)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._heartbeat_now.wait(),
                                       disconnect.heartbeat_interval(self._heartbeat_interval, self._node_grace))

    async def _heartbeat(self, req: pb.HeartbeatRequest) -> None:
        """On the update stream when it is open (answered there), else as a call."""
        self.contact.sent(time.monotonic())
        if await self._send(pb.AgentUpdate(heartbeat=req)):
            return
        self.contact.unsent()
        gen = self._channel_gen
        try:
            sent = time.monotonic()
            resp = await self.stub.Heartbeat(req, timeout=5)
            self._on_heartbeat_answer(resp, sent)
            if resp.acknowledged:
                self.contact.contact(sent)
        except asyncio.CancelledError:
            if not self._switched_under(gen):
                raise
        except grpc.aio.AioRpcError as err:
            log.debug("heartbeat failed: %s", err.details())
            self.handler.on_call_failed("heartbeat", err)
            await self._after_error(err, gen)

    def _on_heartbeat_answer(self, resp: pb.HeartbeatResponse, sent: float | None) -> None:
        self._node_grace = resp.node_grace_seconds or self._node_grace
        if resp.reregister:
            self.reregister()
            self.handler.on_new_stream()
        self.handler.on_heartbeat_answer(resp, sent)

    async def _updates_loop(self) -> None:
        """Keep one StreamUpdates call open for heartbeats and reports (see the proto). Against a
        scheduler without it, the link falls back to one call per heartbeat and report."""
        delay = 0.2
        while True:
            await self._registered.wait()
            gen = self._channel_gen
            call = self.stub.StreamUpdates()
            self._stream_opened("updates")
            self._updates = call
            deadline = AckDeadline(self._ack_deadline(), time.monotonic())
            watchdog = asyncio.create_task(self._ack_watchdog(deadline, gen), name="agent-ack-deadline")
            self._heartbeat_now.set()
            try:
                async for ack in call:
                    deadline.acked(time.monotonic())
                    delay = 0.2
                    if ack.HasField("heartbeat"):
                        sent = self.contact.answered(ack.heartbeat.acknowledged)
                        self._on_heartbeat_answer(ack.heartbeat, sent)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("scheduler %s has no update stream; using one call per update", self.target)
                    return
                log.info("update stream interrupted (%s); reconnecting in %.1fs", err.details(), delay)
                self.handler.on_call_failed("updates", err)
                await self._after_error(err, gen)
            except asyncio.CancelledError:
                if not self._switched_under(gen):
                    raise
            finally:
                watchdog.cancel()
                self._updates = None
                self._stream_ended("updates")
                self.contact.reset()
                self.handler.on_new_stream()  # a new stream (or replica) starts with a complete report
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
            await self._registered.wait()
            gen = self._channel_gen
            self._watch_reopen = False
            call = None
            try:
                call = self.stub.WatchAssignments(pb.WatchAssignmentsRequest(node_id=self.node_id, deltas=True))
                self._stream_opened("watch")
                self._watch_call = call
                async for ds in call:
                    await self.handler.accept_desired(ds)
                    delay = 0.2  # after the set is taken: a disk that refuses each one backs off
            except grpc.aio.AioRpcError as err:
                log.info("desired-state stream interrupted (%s); reconnecting in %.1fs", err.details(), delay)
                self.handler.on_call_failed("watch", err)
                await self._after_error(err, gen)
            except DesiredNotRecorded as err:
                log.error("the desired state could not be recorded here (%s); asking for the full set again in "
                          "%.1fs", err, delay)
                if call is not None:
                    call.cancel()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                reopen = self._watch_reopen and not (task is not None and task.cancelling())
                if not (reopen or self._switched_under(gen)):
                    raise
                if reopen:
                    delay = 0.2
            finally:
                self._watch_call = None
                self._stream_ended("watch")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
