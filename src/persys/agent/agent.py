"""The agent loop: receive desired state, reconcile locally, report.

The agent never decides placement. It keeps what it was last told in a local database so
that after a restart it adopts the workloads that still run instead of starting copies, and
it removes nothing until the scheduler has sent a fresh desired state in normal mode: an
agent that cannot reach its scheduler holds, it does not guess.

A desired-state message is merged by `persys.agent.decide.merge` (pure) and written to the local
records. One pass of `reconcile_once`: observe the runtimes (I/O), decide (`decide.plan`, pure),
execute the actions (I/O), then build the report (`decide.report`, pure) that the link sends.
Registration, heartbeats, reports, the desired-state stream and secret requests go through the
link (`persys.agent.link`); the agent is its `LinkHandler`. Only joining (`join`) and certificate
renewal (`cert_renewal`) dial the scheduler on their own channels.

Over 500 lines on purpose: the decisions are pure modules (agent/decide/: plan, merge,
report, disconnect); what remains is the I/O around them in one class that holds the runtimes,
the local records and the link. Its sections (lifecycle, LinkHandler, ServedNode, local
reconciliation, the loss of every replica) each act on that shared state.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import random
import socket
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from persys import __version__
from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent import devices, start_tracing, storage_setup
from persys.agent.agent_metrics import AgentMetrics
from persys.agent.cert_renewal import CertRenewer
from persys.agent.decide import disconnect, merge, plan, report
from persys.agent.decide.plan import Desired, Failure
from persys.agent.guard_keeper import GuardKeeper, fence_entries
from persys.agent.host import UsageSampler, capacity
from persys.agent.link import DesiredNotRecorded, GrpcLink, LinkOptions, SchedulerLink
from persys.agent.localstate import LocalState
from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    Runtime,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
    StartPending,
)
from persys.agent.runtimes.registry_auth import fingerprint as credentials_fingerprint
from persys.agent.secret_intake import fetch_secrets
from persys.agent.service import serve
from persys.agent.volume_attach import VolumeAttacher
from persys.agent.volume_work import VolumeWork
from persys.model import DesiredState, OnDisconnect, Taint, WorkloadSpec
from persys.model.devices import Device
from persys.model.limits import IMAGE_MAX_BYTES
from persys.observability import tracing
from persys.observability.metrics_http import MetricsServer
from persys.security.metrics_access import serve_metrics
from persys.security.private_files import AGENT_DEPTH, AGENT_FILES, tighten_tree
from persys.storage.base import StorageError
from persys.storage.ceph_open import open_ceph
from persys.storage.config import CephConfig, StorageConfig
from persys.storage.probe import DriverReport, probe_drivers, simulated_reports
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)
Observed = dict[str, tuple[Runtime, ObservedWorkload]]


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
    devices: list[Device] | None = None  # simulated GPUs (persys dev --nodes); None: detect the host's
    reconcile_interval: float = 2.0
    orphan_grace: float = 30.0  # seconds a never-desired workload is left alone before removal
    probe_interval: float = 30.0  # seconds between capability detections
    failure_grace: float = 30.0  # a retryable failure is reported Failed only once it lasts this long
    listen: str = ""  # where AgentService (logs) listens, e.g. 0.0.0.0:7444; "" = not served
    advertise_host: str = ""  # host the control plane dials for AgentService (default: from listen)
    renew_certificate: bool = False  # renew tls before it expires (persys.agent.cert_renewal)
    ack_deadline: float = 0.0  # seconds without an acknowledgement before leaving a replica; 0 = 2 heartbeats
    image_max_bytes: int = IMAGE_MAX_BYTES  # largest image upload AgentService.LoadImage accepts
    metrics_listen: str = ""  # HTTPS /metrics (client certificate, `get metrics`), host:port; "" = none
    metrics_plain_listen: str = ""  # plain HTTP /metrics, where an operator asks for it; "" = none
    storage: StorageConfig | None = None  # the node's volume drivers (persys agent --storage); None: none
    # The node's registry credentials (persys agent --registry-auth; the runtimes read it at pull
    # time): watched here only so that a pull refused under old credentials is tried again.
    registry_auth: Path | None = None
    # Run the node guard (persys.agent.node_guard): Stop instances are killed when this agent stops
    # renewing its lease for a node grace (killed, frozen). Off only where no real instance runs.
    node_guard: bool = True
    # The cluster's id (security.cluster_id; the CLI gives it from the cluster CA): in the local
    # pool's folder, so two clusters sharing a host and a pool never touch each other's volumes.
    cluster_id: str = ""


class Agent:
    def __init__(self, config: AgentConfig, runtimes: Sequence[Runtime], link: SchedulerLink | None = None) -> None:
        self.config = config
        self.storage = storage_setup.open_drivers(config.storage, config.node_id, config.cluster_id)
        self.storage_reports: list[DriverReport] = []  # probed at start
        self.volumes = VolumeAttacher(storage_setup.usable(self.storage))
        self.meter = AgentMetrics()
        self.all_runtimes = self.meter.wrap(runtimes)
        self.runtimes: dict[str, Runtime] = {}
        self.capabilities: list[pb.RuntimeCapability] = []
        self.unavailable: dict[str, str] = {}  # runtime -> why it does not work here (last probe)
        self.devices: list[Device] = []  # GPUs detected at the last probe (agent/devices.py)
        # Its database and logs its own (0600; folders not listable by others): issue #30.
        tighten_tree(config.state_dir, traversable=True, suffixes=AGENT_FILES, max_depth=AGENT_DEPTH)
        self.local = LocalState(config.state_dir / "agent.db")
        self.desired: dict[str, Desired] = {}
        self.synced = False  # a desired snapshot arrived in normal mode since we started
        self.mode = "normal"
        self.failures: dict[str, Failure] = {}
        self.restarts: dict[str, int] = self.local.restarts()  # kept across the agent's restarts
        self._known: set[str] = set()  # every workload desired here since start (or in local state)
        self._orphans: dict[str, float] = {}  # workload -> when first seen undesired and unknown
        # Desired here with a spec this agent cannot read (a workload the scheduler quarantines
        # after a stricter model, an old local record): kept as they run, never removed.
        self._unreadable: set[str] = set()
        self._volumes_swept = False  # leftovers of an earlier run detached (once per start)
        self.trace_parents: dict[str, str] = {}  # instance -> traceparent of the apply that sent it (in memory)
        self._kept_logged: set[str] = set()
        self.usage: dict[str, ObservedWorkload] = {}  # workload -> last usage sample (cpu, memory, io)
        self.usage_interval = 5.0
        self._wake = asyncio.Event()
        self._persisting: set[asyncio.Future[None]] = set()  # desired records being written
        self.volume_work = VolumeWork(self.volumes, self._wake.set)
        self._volumes_told: tuple[object, ...] | None = None  # the attachments the scheduler was last told
        self.last_exits: dict[str, str] = {}  # instance -> why it last exited before a restart
        self._sampler = UsageSampler(config.state_dir, [Path(config.storage.local.pool)]
                                     if config.storage is not None and config.storage.local is not None else [])
        self._server: grpc.aio.Server | None = None
        targets = [t.strip() for t in config.scheduler.split(",") if t.strip()] or [config.scheduler]
        self.link: SchedulerLink = link or GrpcLink(config.node_id, targets, config.tls, self,
                                                    LinkOptions(ack_deadline=config.ack_deadline))
        self._tasks: list[asyncio.Task[None]] = []
        self.renewer: CertRenewer | None = None
        self._stopping = False  # stop() is ending the tasks: their end is expected
        self._reported: dict[str, report.Fingerprint] | None = None  # what the scheduler was last told
        self._last_full_report = 0.0
        # Loss of every replica (persys.agent.decide.disconnect): when this agent started, when the
        # latest full desired set arrived, and the instances stopped for disconnection -> when.
        self._started_at = time.monotonic()
        self._full_set_at: float | None = None
        self._load_local()
        self.fenced: dict[str, float] = dict.fromkeys(self.local.disconnect_stops(), self._started_at)
        self._resume: frozenset[str] = frozenset()  # released from a disconnection stop: start regardless
        self.guard_keeper = GuardKeeper(config.state_dir / "guard", lambda: self.link.node_grace, self._guard_fired,
                                        spawn=config.node_guard)
        self.meter.install(lambda: list(self.runtimes.values()), lambda: len(self.desired),
                           self.link.registered.is_set)
        self.metrics_servers: list[MetricsServer] = []

    @property
    def registered(self) -> asyncio.Event:
        return self.link.registered

    def _load_local(self) -> None:
        held, refused = merge.restore(
            merge.Item(wid, rec.revision, rec.generation, rec.desired_state, rec.spec_json)
            for wid, rec in self.local.desired().items())
        for wid in refused:
            log.error("unreadable local record for %s: an instance of it is kept as it is", wid)
        self.desired = dict(held.desired)
        self._unreadable = set(held.unreadable)
        self._known.update(held.desired)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # First: a restart within the bound renews the lease the killed agent left, and the
        # instances the guard killed meanwhile are fenced before any reconciliation.
        self.guard_keeper.renew()
        await self.probe_runtimes()
        if self.storage:
            self.storage_reports = await asyncio.to_thread(probe_drivers, self.storage)
        if self.config.storage is not None and self.config.storage.simulate:
            # persys dev's simulated nodes: advertised as the file says, without the hardware.
            simulated = {r.driver: r for r in simulated_reports(self.config.storage) if r.configured}
            base = {r.driver: r for r in self.storage_reports}
            self.storage_reports = list({**base, **simulated}.values())
        if self.config.listen and self.config.tls:
            self._server, port = await serve(self, self.config.listen, self.config.tls, self.meter.metrics)
            host = self.config.advertise_host or self.config.listen.rpartition(":")[0]
            if host in ("0.0.0.0", "[::]", ""):
                host = socket.gethostname()
            self.config.address = f"{host}:{port}"
        keyed = self._keyed_ceph()
        self._tasks = [
            *self.link.start(),
            *([asyncio.create_task(self._storage_key_loop(keyed), name="agent-storage-key")] if keyed else []),
            asyncio.create_task(self._reconcile_loop(), name="agent-reconcile"),
            asyncio.create_task(self._usage_loop(), name="agent-usage"),
            asyncio.create_task(self._probe_loop(), name="agent-probe"),
            asyncio.create_task(self._disconnect_loop(), name="agent-disconnect"),
            asyncio.create_task(self.guard_keeper.run(), name="agent-node-guard"),
        ]
        if self.config.renew_certificate and self.config.tls:
            self.renewer = CertRenewer(self.config.node_id, self.config.tls, lambda: self.link.target,
                                       self.link.refresh_credentials)
            self._tasks.append(asyncio.create_task(self.renewer.run(), name="agent-cert-renewal"))
        for t in self._tasks:
            t.add_done_callback(self._task_ended)
        if self.config.tls and (self.config.metrics_listen or self.config.metrics_plain_listen):
            self.metrics_servers = await serve_metrics(self.meter.metrics, self.config.tls,
                                                       self.config.metrics_listen, self.config.metrics_plain_listen)

    def _keyed_ceph(self) -> CephConfig | None:
        """The ceph-rbd section when its key comes from the secret store (no keyFile)."""
        storage = self.config.storage
        if storage is None or storage.ceph is None or storage.ceph.key_file or storage.simulate:
            return None
        return storage.ceph

    async def _storage_key_loop(self, ceph: CephConfig) -> None:
        """ceph-rbd's cephx key from the secret store, through the scheduler (only the secret the
        cluster's storage configuration names); until it comes the node advertises ceph-rbd as
        missing, saying why. Then the driver is opened, probed, advertised (registering again);
        the key stays in memory only. Ends once the driver is there."""
        await self.link.registered.wait()
        delay = 1.0
        while True:
            try:
                key = (await self.link.resolve_storage_key("ceph-rbd", ceph.secret_name)).decode().strip()
                driver = await asyncio.to_thread(open_ceph, ceph, self.config.node_id, self.config.cluster_id, key)
                break
            except grpc.aio.AioRpcError as err:
                why = f"its cephx key (secret {ceph.secret_name}) not handed out: {(err.details() or '')[:300]}"
            except (StorageError, UnicodeDecodeError) as err:
                why = f"ceph-rbd driver could not start: {err}"
            self._storage_report(probe_drivers({"ceph-rbd": why}))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        self.storage["ceph-rbd"] = driver
        self.volumes.drivers["ceph-rbd"] = driver
        self._storage_report(await asyncio.to_thread(probe_drivers, {"ceph-rbd": driver}))
        log.info("ceph-rbd: cephx key received from the secret store (secret %s)", ceph.secret_name)

    def _storage_report(self, probed: list[DriverReport]) -> None:
        """Take a new probe of one driver (the others come back "not configured": ignored);
        register again when what the node advertises changed."""
        new = {r.driver: r for r in probed if r.configured}
        merged = [new.get(r.driver, r) for r in self.storage_reports]
        if merged != self.storage_reports:
            self.storage_reports = merged
            self.link.reregister()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """A long-lived loop must never end while the agent runs: say so loudly if one does.
        (The updates loop ends by itself against a scheduler without StreamUpdates.)"""
        if self._stopping:
            return
        if task.cancelled():
            log.error("agent task %s was cancelled while the agent runs", task.get_name())
        elif (exc := task.exception()) is not None:
            log.error("agent task %s died: %r", task.get_name(), exc, exc_info=exc)
        elif task.get_name() not in ("agent-updates", "agent-storage-key"):  # the key's ends once it has it
            log.error("agent task %s ended while the agent runs", task.get_name())

    async def stop(self) -> None:
        """Stop the agent only: workloads keep running and are adopted by the next agent."""
        self._stopping = True
        for m in self.metrics_servers:
            await m.stop()
        await stop_tasks(self._tasks)
        await self.volume_work.stop()
        for rt in self.all_runtimes:
            with contextlib.suppress(Exception):
                await rt.close()
        await self.link.close()
        if self._server is not None:
            await self._server.stop(1.0)
        await asyncio.to_thread(self.local.close)

    async def probe_runtimes(self) -> bool:
        """Advertise only the runtimes that really work on this host, right now.

        Returns True when the advertised set changed (the node must register again)."""
        available: dict[str, Runtime] = {}
        caps = []
        broken: dict[str, str] = {}  # why each runtime is not offered: registration carries it
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
            else:
                broken[rt.name] = p.reason or "unavailable"
                if rt.name in self.runtimes or not self.capabilities:
                    log.warning("runtime %s unavailable: %s", rt.name, p.reason)
        changed = [(c.workload_type, c.version, list(c.features)) for c in caps] != [
            (c.workload_type, c.version, list(c.features)) for c in self.capabilities
        ] or sorted(broken) != sorted(self.unavailable)
        gpus = list(self.config.devices) if self.config.devices is not None else \
            await asyncio.to_thread(devices.discover_nvidia)
        changed = changed or gpus != self.devices
        self.runtimes = available
        self.capabilities = caps
        self.unavailable = broken
        self.devices = gpus
        return changed

    async def _probe_loop(self) -> None:
        """Re-run capability detection: a runtime that breaks is withdrawn (the scheduler stops
        placing there), one that comes back is advertised again."""
        while True:
            await asyncio.sleep(self.config.probe_interval)
            if await self.probe_runtimes():
                log.warning("runtimes changed to: %s; registering again", ", ".join(sorted(self.runtimes)) or "none")
                self.link.reregister()

    # ------------------------------------------------------------------ LinkHandler (persys.agent.link)

    def register_request(self) -> pb.RegisterNodeRequest:
        c = self.config
        cap = capacity(c.state_dir)
        storage, storage_missing = storage_setup.advertised(self.storage_reports)
        return pb.RegisterNodeRequest(
            node_id=c.node_id,
            address=c.address,
            agent_version=__version__,
            capabilities=pb.NodeCapabilities(
                runtimes=self.capabilities,
                storage_drivers=storage,
                storage_missing=storage_missing,
                cpu_millicores=c.cpu_millicores or cap.cpu_millicores,
                memory_mb=c.memory_mb or cap.memory_mb,
                disk_mb=c.disk_mb or cap.disk_mb,
                unavailable_runtimes=self.unavailable,
                devices=[pb.Device(id=d.id, vendor=d.vendor, model=d.model, memory_mb=d.memory_mb, index=d.index)
                         for d in self.devices],
            ),
            labels=c.labels,
            taints=[pb.Taint(key=t.key, value=t.value, effect=t.effect) for t in c.taints],
        )

    def heartbeat_request(self) -> pb.HeartbeatRequest:
        h = self._sampler.sample()
        self.meter.node_usage = (h.cpu_percent, h.memory_used_mb, h.disk_used_mb)
        rd, wr, rx, tx = h.io
        return pb.HeartbeatRequest(
            node_id=self.config.node_id,
            usage=pb.NodeUsage(cpu_percent=h.cpu_percent, memory_used_mb=h.memory_used_mb,
                               disk_used_mb=h.disk_used_mb, workloads=len(self.desired), disk_read_bytes=rd,
                               disk_write_bytes=wr, net_rx_bytes=rx, net_tx_bytes=tx),
        )

    def on_registered(self, resp: pb.RegisterNodeResponse) -> None:
        return None

    def on_heartbeat_answer(self, resp: pb.HeartbeatResponse, sent: float | None) -> None:
        self.mode = resp.mode or "normal"
        if resp.volume_tasks:
            self.volume_work.offer(resp.volume_tasks)

    def on_new_stream(self) -> None:
        self._reported = None
        self._volumes_told = None

    def on_call_failed(self, call: str, err: grpc.aio.AioRpcError) -> None:
        return None  # the link has logged it and moved if need be

    # ------------------------------------------------------------------ ServedNode (persys.agent.service)

    @property
    def node_id(self) -> str:
        return self.config.node_id

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    @property
    def image_max_bytes(self) -> int:
        return self.config.image_max_bytes

    def log_sources(self, workload_id: str) -> tuple[list[Runtime], bool]:
        d = self.desired.get(workload_id)
        if d is not None and d.spec.type in self.runtimes:
            return [self.runtimes[d.spec.type]], True
        return list(self.runtimes.values()), d is not None

    def desired_specs(self) -> list[tuple[str, WorkloadSpec]]:
        return [(wid, d.spec) for wid, d in self.desired.items()]

    def exec_source(self, instance_id: str) -> tuple[str, Runtime | None]:
        d = self.desired.get(instance_id)
        if d is None:
            return "", None
        return d.spec.type, self.runtimes.get(d.spec.type)

    async def accept_desired(self, ds: pb.AssignmentSet) -> None:
        """Take a full desired set or a delta (see DesiredState in the proto): the pure
        `merge.merge` decides, this applies its result and writes it down."""
        m = merge.merge(merge.Held(self.desired, frozenset(self._unreadable)), delta_of(ds))
        for wid, why in m.refused.items():
            log.error("scheduler sent an unreadable spec for %s: %s", wid, why)
        self.mode = m.mode
        if m.synced:
            self.synced = True
            self._full_set_at = time.monotonic()
        self._unreadable = set(m.held.unreadable)
        self._kept_logged &= self._unreadable
        self.trace_parents.update(m.traces)
        for wid in m.removed:
            self.trace_parents.pop(wid, None)
        self.desired = dict(m.held.desired)
        self._known.update(m.changed)
        removed, changed = m.removed, m.changed

        def persist() -> None:
            for wid in removed:
                self.local.forget(wid)
            for wid, d in changed.items():
                self.local.save_desired(wid, d.revision, d.generation, str(d.desired_state), d.spec.to_json())

        # The next pass lists the runtimes while this is written (~1-2 ms each, an apply's path
        # to its start); it decides and acts only once the records are on disk (_durable).
        writing = asyncio.ensure_future(asyncio.to_thread(persist))
        self._persisting.add(writing)
        writing.add_done_callback(self._persisting.discard)
        self._wake.set()
        try:
            await writing
        except (OSError, sqlite3.Error) as err:
            # The set stays in memory (the scheduler means it); a restart would find the last set
            # written. The link asks for the full set again until one is written.
            raise DesiredNotRecorded(str(err)) from err

    # ------------------------------------------------------------------ local reconciliation

    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.reconcile_interval)
            self._wake.clear()
            self.meter.passes.inc()
            try:
                observed = await self.reconcile_once()
            except Exception:
                log.exception("local reconcile failed")
                continue
            if self.link.registered.is_set():
                await self._report(observed)

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

    async def _observe(self, only: frozenset[str] | None = None, before: Observed | None = None) -> Observed:
        """What every runtime runs. With `only`, just those runtimes are listed again and the
        others' instances are taken from `before` (listed moments ago, in the same pass): after
        a process start the pass need not wait on dockerd and libvirtd once more (5-40 ms on a
        busy node, as much as the rest of an apply's path to Running)."""
        # All runtimes at once: each waits on its engine (dockerd, libvirtd), ~1-2 ms apiece, and
        # this stands between an assignment's arrival and its start.
        runtimes = [rt for rt in self.runtimes.values() if only is None or rt.name in only]
        listed = await asyncio.gather(*(rt.list() for rt in runtimes), return_exceptions=True)
        seen: Observed = {} if before is None or only is None else {
            w: (rt, o) for w, (rt, o) in before.items() if rt.name not in only}
        for rt, found in zip(runtimes, listed, strict=True):
            if isinstance(found, RuntimeFailure):
                log.warning("runtime %s could not list workloads: %s", rt.name, found)
                continue
            if isinstance(found, BaseException):
                raise found
            for o in found:
                seen[o.workload_id] = (rt, o)
        return seen

    async def _durable(self) -> None:
        """Wait until the desired records being written are on disk, so that a pass acts on what a
        restart would find. A write that fails (accept_desired raises DesiredNotRecorded) leaves
        the set in memory, acted on as the scheduler means it, while the link asks for it again."""
        while self._persisting:
            await asyncio.wait(set(self._persisting))

    def _contact(self) -> plan.Contact:
        return plan.Contact(started_at=self._started_at, last_ack=self.link.last_ack, last_full_set=self._full_set_at,
                            grace=self.link.node_grace, heartbeat_interval=self.link.heartbeat_interval)

    def snapshot(self, observed: Observed, now: float) -> plan.Snapshot:
        """The state the pure plan step decides on."""
        return plan.Snapshot(
            now=now, desired=self.desired, observed={w: (rt.name, o) for w, (rt, o) in observed.items()},
            runtimes=frozenset(self.runtimes), contact=self._contact(), failures=self.failures,
            fenced=self.fenced, resume=self._resume, synced=self.synced, mode=self.mode,
            known=frozenset(self._known), unreadable=frozenset(self._unreadable), orphans=self._orphans,
            orphan_grace=self.config.orphan_grace, credentials=credentials_fingerprint(self.config.registry_auth))

    async def reconcile_once(self) -> Observed:
        """Drive local runtimes toward the desired set; returns what is observed afterwards."""
        observed = await self._observe()
        await self._durable()
        # The desired set and the runtimes are replaced (never changed in place) when new ones
        # arrive: the actions are carried out against those they were decided on.
        desired, runtimes = self.desired, self.runtimes
        p = plan.plan(self.snapshot(observed, time.monotonic()))
        await self._record_disconnect(p)
        self.failures, self._orphans = p.failures, p.orphans
        for wid in p.kept:
            if wid not in self._kept_logged:
                self._kept_logged.add(wid)
                log.warning("keeping %s as it is: its desired spec is unreadable here", wid)
        for action in p.actions:
            try:
                await self._act(action, desired, runtimes, observed)
            except Exception as exc:  # contained to its instance (CancelledError is no Exception)
                self._contain(action, desired.get(action.workload_id), exc)
        after = await self._observe(frozenset(a.runtime for a in p.actions), observed) if p.actions else observed
        self._guard(after)
        await self._sweep_volumes(after)
        return after

    def _guard(self, observed: Observed) -> None:
        """Tell the node guard which running instances to kill should this agent die or freeze:
        those desired Running here with `onDisconnect: Stop`."""
        running = [(wid, rt.name, o) for wid, (rt, o) in observed.items()
                   if (d := self.desired.get(wid)) is not None and d.desired_state == DesiredState.RUNNING
                   and d.spec.disconnect_policy() == OnDisconnect.STOP and wid not in self.fenced]
        try:
            self.guard_keeper.guard(fence_entries(running))
        except OSError as err:
            log.error("could not write the node guard's list: %s", err)

    def _guard_fired(self, fired: dict[str, float]) -> None:
        """The guard killed these while this agent was dead or frozen: fenced like a
        disconnection stop (started again only when the scheduler's full desired set says so)."""
        now = time.monotonic()
        self.fenced = {**self.fenced, **{w: now for w in fired if w not in self.fenced}}
        self.local.save_disconnect_stops(sorted(fired), disconnect.REASON)

    async def _act(self, action: plan.Action, desired: Mapping[str, Desired], runtimes: Mapping[str, Runtime],
                   observed: Observed) -> None:
        wid = action.workload_id
        if action.kind == "start":
            if action.restart and wid in observed:
                # Why it exited (OOMKilled, exited with code 1), reported with the running instance
                # after the restart (Kubernetes' lastState): a crash-loop restart is not a failure
                # report, so without it an exit between two reports leaves no word at all.
                self.last_exits[wid] = observed[wid][1].message
            await self._start(action, desired[wid], runtimes[action.runtime])
        elif action.kind == "stop":
            await runtimes[action.runtime].stop(wid)
        else:
            await self._remove(action, observed[wid][0])

    def _contain(self, action: plan.Action, d: Desired | None, exc: Exception) -> None:
        """A failing instance fails alone: an error no runtime foresaw (a bug, a spec it chokes on)
        ends this instance's action, never the pass, so every other instance goes on. A desired
        instance is recorded as a failure with the reason (reported Failed, retried with backoff);
        the pass after retries a stop or a remove."""
        wid = action.workload_id
        log.error("%s of %s failed: %s", action.kind, wid, exc, exc_info=exc)
        if d is None:
            return
        reason = f"{action.kind} failed in the agent: {type(exc).__name__}: {str(exc)[:500]}"
        self.failures[wid] = plan.after_failure(self.failures.get(wid), d.revision, "AgentError", reason, False,
                                                time.monotonic(), random.uniform(0.8, 1.2))

    async def _sweep_volumes(self, observed: Observed) -> None:
        """Once per start, when the desired set is known and every instance here is desired:
        detach what an earlier run of the agent left attached for instances gone meanwhile."""
        if self._volumes_swept or not self.synced or not self.volumes.drivers or set(observed) - set(self.desired):
            return
        self._volumes_swept = True
        done = await self.volumes.sweep({wid: d.spec for wid, d in self.desired.items()})
        if done:
            log.info("detached volumes no instance here uses any more: %s", ", ".join(done))

    async def _record_disconnect(self, p: plan.Plan) -> None:
        """Keep the plan's disconnection stops and releases, locally too (they outlive a restart)."""
        v = p.verdict
        if v.fence:
            log.warning("no scheduler replica acknowledged a heartbeat for %.1fs (limit %.1fs of grace %.1fs): "
                        "stopping %s (onDisconnect: Stop)", v.silent_for, v.stop_after, self.link.node_grace,
                        ", ".join(v.fence))
            await asyncio.to_thread(self.local.save_disconnect_stops, list(v.fence), disconnect.REASON)
        if v.release:
            log.info("scheduler reachable again: its desired state decides on %s", ", ".join(v.release))
            await asyncio.to_thread(self.local.clear_disconnect_stops, list(v.release))
        self.fenced, self._resume = p.fenced, p.resume

    async def _remove(self, action: plan.Action, rt: Runtime) -> None:
        wid = action.workload_id
        if action.orphan_for is not None:
            log.warning("removing orphan %s: unknown to the scheduler for %.0fs", wid, action.orphan_for)
        else:
            log.info("removing %s: no longer desired on this node", wid)
        await rt.remove(wid)
        await self.volumes.release(wid)
        self._orphans.pop(wid, None)
        self.failures.pop(wid, None)
        self.last_exits.pop(wid, None)
        if self.restarts.pop(wid, None):
            await asyncio.to_thread(self.local.save_restarts, wid, 0)

    async def _start(self, action: plan.Action, d: Desired, rt: Runtime) -> None:
        if not tracing.enabled():
            await self._start_instance(action, d, rt)
            return
        # A child of the apply that sent this spec (its traceparent came with the assignment).
        with tracing.span("agent.instance.start", start_tracing.attributes(self.config.node_id, action, d),
                          parent=self.trace_parents.get(action.workload_id, ""), record=False) as s:
            start_tracing.outcome(s, await self._start_instance(action, d, rt))

    async def _start_instance(self, action: plan.Action, d: Desired, rt: Runtime) -> RuntimeFailure | None:
        wid = action.workload_id
        prev, now = self.failures.get(wid), time.monotonic()
        try:
            try:
                material = await fetch_secrets(self.link, wid, d.spec)
            except RuntimeFailure:
                await rt.stop(wid)  # the start replaces what runs; without its secrets it cannot
                raise
            mounts = await self.volumes.prepare(wid, d.spec, d.fence_node) if d.spec.volumes else ()
            with start_tracing.runtime_call(d.spec.type):
                await rt.start(RuntimeWorkload(wid, d.revision, d.generation, d.spec, material, mounts, d.devices))
        except StartPending as pending:
            # Going on in the background (an image pull): reported as its progress, asked again at
            # the next pass, and at once when the background work ends.
            self.failures[wid] = plan.while_pending(prev, d.revision, pending.code, str(pending.args[0]), now)
            if pending.done is not None:
                pending.done.add_done_callback(lambda _: self._wake.set())
            else:
                self._wake.set()  # ImagePulled: the report goes out, then the start goes ahead
            return pending
        except RuntimeFailure as err:
            message = str(err.args[0] if err.args else err)
            self.failures[wid] = plan.after_failure(prev, d.revision, err.code, message, err.terminal, now,
                                                    random.uniform(0.8, 1.2), err.credentials)
            log.warning("starting %s failed: %s", wid, err)
            return err
        if action.restart:
            self.restarts[wid] = self.restarts.get(wid, 0) + 1
            await asyncio.to_thread(self.local.save_restarts, wid, self.restarts[wid])
            self.failures[wid] = plan.after_restart(prev, d.revision, now, random.uniform(0.8, 1.2))
        return None

    # ------------------------------------------------------------------ loss of every replica

    def _disconnect_verdict(self) -> disconnect.Verdict:
        s = plan.Snapshot(now=time.monotonic(), desired=self.desired, observed={}, runtimes=frozenset(),
                          contact=self._contact(), fenced=self.fenced)
        return disconnect.decide(plan.disconnect_snapshot(s))

    async def _disconnect_loop(self) -> None:
        """Wake the local reconciliation at the disconnection deadline, not a reconcile tick later;
        ask the link for a full desired set when fenced instances wait only for one."""
        while True:
            v = self._disconnect_verdict()
            if v.fence or v.release:
                self._wake.set()
            if v.resync:
                self.link.reopen_watch()
            wait = 1.0 if v.next_check is None else v.next_check - time.monotonic()
            await asyncio.sleep(min(max(wait, 0.05), 1.0))

    async def _report(self, observed: Observed) -> None:
        now, last = time.monotonic(), self._reported
        reports = report.build(report.Local(
            now=now, desired=self.desired, observed={w: o for w, (_rt, o) in observed.items()},
            failures=self.failures, restarts=self.restarts, usage=self.usage, fenced=self.fenced,
            failure_grace=self.config.failure_grace, last_exits=self.last_exits))
        out = report.select(reports, self._reported, now, self._last_full_report)
        # The volume part: every attachment (when this node has storage) and the outcomes of
        # volume steps; it alone is reason enough to report when it changed.
        # Not before the sweep after a start: until it adopts what running instances hold, the
        # list would be missing them and their records would be dropped.
        attached = self.volumes.attached() if self.volumes.drivers and self._volumes_swept else None
        told = tuple(a.SerializeToString() for a in attached) if attached is not None else None
        results = self.volume_work.take_results()
        if out is None and not results and told == self._volumes_told:
            return
        self._reported = None  # until this one is out
        req = pb.ReportStatusRequest(node_id=self.config.node_id, workloads=out.reports if out else [],
                                     complete=out.complete if out else False, volumes=attached or [],
                                     volumes_listed=attached is not None, volume_results=results)
        if not await self.link.report(req):
            self.volume_work.put_back(results)
            self._volumes_told = None
            return
        self._volumes_told = told
        if out is None:
            self._reported = last  # nothing about instances changed
            return
        self._reported = out.seen
        if out.complete:
            self._last_full_report = now


STOP_TASKS_WITHIN = 10.0


async def stop_tasks(tasks: Sequence[asyncio.Task[None]], within: float = STOP_TASKS_WITHIN) -> None:
    """Cancel the agent's loops and wait for them, bounded: a loop that swallows its cancellation
    (one that tells its own call's cancel from a stop wrongly) must not hang the agent's shutdown.
    Such a loop is logged with where it stands, then left behind."""
    for t in tasks:
        t.cancel()
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=within)
    for t in pending:
        log.error("agent loop %s did not stop within %.0fs; left behind at:\n%s", t.get_name(), within,
                  _task_stack(t))
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            log.warning("agent loop %s ended with %r", t.get_name(), t.exception())


def delta_of(ds: pb.AssignmentSet) -> merge.Delta:
    """A desired-state message as the pure merge takes it."""
    return merge.Delta(tuple(merge.Item(a.instance_id, a.revision, a.generation, a.desired_state, a.spec_json,
                                        a.fence_node, a.traceparent, tuple(a.device_ids)) for a in ds.workloads),
                       ds.mode or merge.NORMAL, ds.full, tuple(ds.removed))


def _task_stack(task: asyncio.Task[None]) -> str:
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()
