"""A scheduler replica: the shell around pure decisions (like etcd raft's Ready loop: the
decisions decide, the shell does the I/O). It holds the queue, the loops (reconcile worker,
node monitor, health, election, membership) and the commits, and wires the components:

* decisions (pure): decide/reconcile.py (a workload's plan of writes), decide/liveness.py (node
  transitions), decide/drift.py, mirror/reports.py (status changes), work/delivery.py's DeltaSender (the delta
  protocol), views/documents.py, api/backup.py's documents;
* components doing I/O through the `Shell` protocol (work/shell.py): work/placer.py and
  work/reconcile_worker.py (the placement pipeline), api/workloads.py and api/nodes.py (clients'
  changes), api/agents.py (agents' calls), work/node_monitor.py (the liveness loop), api/node_volumes.py,
  api/backup.py (backup and restore); work/delivery.py (desired-state streams) takes the mirror. The
  volume, bucket and automation APIs take the shell too (created with their servicers).

One worker drains a de-duplicating queue of workload ids and reconciles each one against the
mirror of the durable state (level-triggered: it looks at what is, not at what happened).
Agents' heartbeats and usage stay in memory; only transitions are written to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from typing import Any

from persys.events.base import ClusterEvent, EventBus
from persys.events.outbox import EventOutbox
from persys.events.sample_outbox import SampleOutbox
from persys.events.samples import SampleBus
from persys.model import Phase, Workload, WorkloadUsage
from persys.model.workload import workload_of
from persys.observability.health_checks import NamedCheck
from persys.observability.metrics import Metrics
from persys.scheduler import placement as pl
from persys.scheduler.api.agents import AgentApi
from persys.scheduler.api.backup import Backups
from persys.scheduler.api.node_volumes import NodeVolumes
from persys.scheduler.api.nodes import NodeApi
from persys.scheduler.api.workloads import WorkloadApi
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.decide.liveness import GuardState
from persys.scheduler.errors import Frozen
from persys.scheduler.ha.election import BlockingLease, LeaderElection
from persys.scheduler.ha.membership import Membership
from persys.scheduler.ha.mode_guard import Mode, ModeGuard
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.mirror.reports import LiveNode, runs_on
from persys.scheduler.placing import queueing_hints
from persys.scheduler.placing.engine_adapter import PlacementService
from persys.scheduler.replica.dependency_probe import DependencyProbe
from persys.scheduler.replica.health import health
from persys.scheduler.replica.heap import HeapGuard
from persys.scheduler.replica.stalls import StallWatchdog
from persys.scheduler.rules import failures
from persys.scheduler.views import documents as views
from persys.scheduler.views import event_trace
from persys.scheduler.views.pages import SortedIds
from persys.scheduler.work import metrics as replica_metrics
from persys.scheduler.work import taint_eviction
from persys.scheduler.work.delivery import Delivery
from persys.scheduler.work.metrics import ReplicaMetrics
from persys.scheduler.work.node_monitor import NodeMonitor
from persys.scheduler.work.placer import Placer
from persys.scheduler.work.reconcile_worker import ReconcileWorker
from persys.scheduler.work.telemetry import Telemetry
from persys.scheduler.work.worker_watch import WorkerWatch
from persys.store.base import StateStore, StoreUnavailable

log = logging.getLogger(__name__)
STOP_WAIT_SECONDS = 5.0  # the longest stop() waits for one of its steps


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        events: EventBus,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        blocking_lease: Callable[[], BlockingLease] | None = None,
        metrics: Metrics | None = None,
        samples: SampleBus | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.state = ClusterState(store)
        # Lists walk ids in order from a position: kept sorted as the mirror changes (views/pages.py).
        self.sorted_workloads = SortedIds("workload", self.state.workloads)
        self.sorted_nodes = SortedIds("node", self.state.nodes)
        self.state.subscribe(self.sorted_workloads.on_change)
        self.state.subscribe(self.sorted_nodes.on_change)
        weights = {**pl.DEFAULT_WEIGHTS, "observed_load": self.config.load_aware_weight}
        self.placement = PlacementService(
            self.state, pl.PlacementConfig(percentage_of_nodes_to_score=self.config.nodes_to_score_percent,
                                           weights=weights))
        self.live: dict[str, LiveNode] = {}
        if self.config.load_aware_weight > 0:
            self.placement.observed = lambda n: self.live[n].recent.p95() if n in self.live else None
        self.usage: dict[str, WorkloadUsage] = {}
        self.metrics = ReplicaMetrics(metrics or Metrics(process=False))
        self.placement.decision_histogram = self.metrics.decision_seconds
        # Persys Meter's samples, published off the report path (dropped, counted, when behind).
        self.sample_outbox = SampleOutbox(samples) if samples is not None else None
        self.telemetry = Telemetry(self.sample_outbox)
        self.meter_status: Callable[[], dict[str, Any]] = dict  # set where this process runs the meter
        self._commit_tasks: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[Any]] = []
        self.guard = ModeGuard(store, self.config.data_dir, self._mode_changed, lambda: self.state.revision)
        self._last_backup = 0.0
        self.heap = HeapGuard()
        stall = self.config.stall_log_seconds
        self.stall_watchdog = StallWatchdog(stall) if stall > 0 else None
        self._backup_every = self.config.backup_interval_seconds
        self.election = LeaderElection(
            store, self.config.replica_id or uuid.uuid4().hex[:12], self.config.advertise,
            self._elected, self._deposed, ttl=self.config.leader_ttl_seconds, blocking_lease=blocking_lease,
        )
        self.state.fences["leader"] = lambda: self.election.fence() if self.election.is_leader else None
        self.outbox = EventOutbox(events, self.election.replica_id)  # lost events counted, then announced
        self.membership = Membership(store, self.state, self.config, self.election, lambda: self.is_active,
                                     lambda: self.catching_up)
        self.state.fences["node"] = self.membership.node_fence
        self._active_tasks: list[asyncio.Task[Any]] = []
        self.worker_watch = WorkerWatch()
        self.elected_at_wall = 0.0  # wall-clock time of the last election win (health, failover timing)
        # Dependencies' checks for health, registered at start (rpc/server.py: the secret store; the meter).
        self.health_checks: list[NamedCheck] = []
        self.health_probe = DependencyProbe(self, lambda rev: self.state.observe_store_revision(rev, self.clock()))
        # Loops that run only while this replica is active (rpc/server.py: the volume controller).
        self.active_services: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._active_fence = 0  # the leader term (fence revision) this replica has caught up for
        # The components (each takes this shell through the narrow Shell protocol); their
        # operations are this replica's API.
        self.delivery = Delivery(self.state, self.require_owner)
        self.monitor = NodeMonitor(self)
        self.placement.heard = self.monitor.heard  # only nodes heard from since this replica became active
        self.evictions = taint_eviction.EvictionTimers(self.state, self.enqueue_node_workloads, time.time)
        self.hints = queueing_hints.PendingHints()
        self._check_nodes, self.resume_liveness = self.monitor.check_nodes, self.monitor.resume_liveness
        self.placer = Placer(self)
        self.worker = ReconcileWorker(self, self.placer)
        self.workload_api = WorkloadApi(self, self.worker.admit)
        self.node_volumes = NodeVolumes(self)
        self.agent_api = AgentApi(self, self.require_owner, self.delivery, self.node_volumes)
        self.node_api = NodeApi(self, self.workload_api, self._forget_node)
        self.backups = Backups(self)
        # No re-exports of the components' methods: callers (the servicers, tests) name the component
        # (`workload_api.apply`, `agent_api.report`, `node_api.drain`, `backups.restore`, ...).
        # Views (views/documents.py) over the mirror and what agents sent.
        self.workload_view = partial(views.workload_view, self.state, self.usage)
        self.workload_page = partial(views.workload_page, self.state, self.usage, self.sorted_workloads)
        self.node_view = partial(views.node_view, self.state, self.live)
        self.node_page = partial(views.node_page, self.state, self.live, self.sorted_nodes)
        self.drain_status = partial(views.drain_status, self.state, self.live)
        replica_metrics.install(self.metrics.metrics, self)

    # What the metrics' scrape reads (replica_metrics.ReplicaView).
    queue_depth = property(lambda self: len(self.worker.queued))
    commits_in_flight = property(lambda self: len(self.placer.inflight))
    reservations = property(lambda self: len(self.placement.ledger))
    sharded = property(lambda self: self.config.sharded)

    @property
    def is_active(self) -> bool:
        """Elected AND the mirror has caught up with the store as of the election: a replica that
        acted on a mirror missing changes would withdraw what it does not know from agents."""
        return self.election.is_leader and self._active_fence == self.election.fence_revision

    @property
    def catching_up(self) -> bool:
        return self.election.is_leader and not self.is_active

    # ------------------------------------------------------------------ shards (ha/membership.py)

    def owns(self, node_id: str) -> bool:
        return self.membership.owns(node_id)

    def require_owner(self, node_id: str) -> None:
        self.membership.require_owner(node_id)

    def leader_address(self) -> str:
        return self.membership.leader_address()

    def _shards_changed(self) -> None:
        self.membership.hand_over(self.live, self.clock())
        self.delivery.wake_all()

    @property
    def active_tasks(self) -> list[asyncio.Task[Any]]:
        return self._active_tasks

    async def _elected(self) -> None:
        # Catch up before acting: the mirror must have applied every change up to our own leader
        # key (a standby whose watch was cut off may be far behind, or reloading after a
        # compaction). Until then agents are told to retry and nothing is placed or judged.
        fence = self.election.fence_revision
        if self.state.revision < fence:
            log.warning("replica %s elected at revision %d; catching up (mirror at %d)",
                        self.election.replica_id, fence, self.state.revision)
            await self.state.wait_for_revision(fence)
        self._active_fence = fence
        self.elected_at_wall = time.time()
        # Start from the durable truth: no reservations of an earlier term, fresh liveness.
        self.placement.reset()
        self.monitor.fresh_grace(keep_later=False)
        self.enqueue_all()
        self._active_tasks = [self.worker.start(),
                              *(asyncio.create_task(run(), name="active-service") for run in self.active_services)]
        self._spawn(self.membership.sync_shards())
        self.emit("SchedulerElected", "cluster", f"replica {self.election.replica_id} is active")

    async def _deposed(self) -> None:
        self._active_fence = 0
        self.worker.backlog_low.set()  # nothing drains the queue here now: do not hold applies for it
        for t in self._active_tasks:
            t.cancel()
        for t in self._active_tasks:
            # Its error must not escape into the election, which would then never stop; but a
            # task that had already ended on its own (before the cancel) is logged here, since
            # _worker_ended says nothing of a task it no longer counts as active.
            already = t.done() and not t.cancelled()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
            if already and (err := t.exception()) is not None:
                log.error("active-replica task %s had failed: %s", t.get_name(), failures.describe(err),
                          exc_info=err)
        self._active_tasks = []
        self.delivery.wake_all()  # agents' streams end and they look for the active replica

    @property
    def mode(self) -> str:
        return str(self.guard.mode)

    def require_normal(self) -> None:
        if self.guard.mode == Mode.DEGRADED:
            raise Frozen(f"control plane is degraded ({self.guard.reason}); changes are refused until the "
                         "state store is back, running workloads keep running")
        if self.guard.mode == Mode.RECOVERY:
            raise Frozen(f"control plane is in recovery: {self.guard.reason}")

    def _mode_changed(self, old: Mode, new: Mode, reason: str) -> None:
        self.emit("ModeChanged", "cluster", f"{old} -> {new}" + (f": {reason}" if reason else ""), str(new))
        self.delivery.wake_all()  # agents learn the mode at once (hold / resume)
        if new == Mode.NORMAL:
            # Heartbeats could not be judged while frozen: every node gets a fresh grace period.
            self.monitor.fresh_grace(keep_later=True)
            self.enqueue_all()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.heap.install()
        if self.stall_watchdog is not None:
            self.stall_watchdog.start()
        self._tasks = [asyncio.create_task(self.health_probe.run(self.config.health_interval_seconds),
                                           name="dependency-probe")]
        try:
            await self._load()
        except StoreUnavailable as err:
            # An outage, not a configuration error: start frozen and thaw when the store answers.
            self.guard.set(Mode.DEGRADED, f"state store unreachable at start ({err}); frozen until it answers")
            log.warning("state store unreachable at start: serving frozen until it answers (%s)", err)
            self._tasks.append(asyncio.create_task(self._start_when_the_store_answers(), name="store-wait"))
            return
        await self._run()

    async def _load(self) -> None:
        await self.state.load()
        has_state = bool(self.state.workloads or self.state.refused or self.state.nodes or self.state.assignments)
        await self.guard.establish(self.state.cluster_marker, has_state)

    async def _start_when_the_store_answers(self) -> None:
        delay = 0.5
        while True:
            await asyncio.sleep(delay)
            try:
                await self._load()
            except StoreUnavailable as err:
                log.debug("state store still unreachable: %s", err)
                delay = min(delay * 2, 5.0)
                continue
            log.info("the state store answers: this replica starts (mode %s)", self.guard.mode)
            await self._run()
            return

    async def _run(self) -> None:
        self.state.subscribe(self._on_change)
        self.state.start_following()
        self.monitor.started_at = self.monitor.active_since = self.clock()
        self.enqueue_all()
        self._tasks += [
            asyncio.create_task(self.outbox.run(), name="event-publisher"),
            asyncio.create_task(self._health_loop(), name="mode-guard"),
            asyncio.create_task(self.monitor.run(), name="node-monitor"),
        ]
        if self.sample_outbox is not None:
            self._tasks.append(asyncio.create_task(self.sample_outbox.run(), name="sample-publisher"))
        if self.config.sharded:
            self._tasks.append(asyncio.create_task(self.membership.announce(), name="replica-membership"))
        self.election.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.election.settled.wait(), timeout=self.config.leader_ttl_seconds * 3)

    async def stop(self) -> None:
        # Every wait is bounded: a stuck or failed task must not hold the process at exit.
        try:
            # Steps down at once: a standby takes over without waiting.
            await asyncio.wait_for(self.election.stop(), STOP_WAIT_SECONDS)
        except Exception as err:  # includes TimeoutError
            log.warning("stepping down did not finish cleanly: %s", failures.describe(err))
        if self._commit_tasks or self.placer.tasks:
            await asyncio.wait({*self._commit_tasks, *self.placer.tasks}, timeout=5)
        for t in [*self._tasks, *self._active_tasks]:
            t.cancel()
        pending = [t for t in [*self._tasks, *self._active_tasks] if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_SECONDS)
        self.evictions.close()
        await self.state.stop()
        self.heap.uninstall()
        if self.stall_watchdog is not None:
            await self.stall_watchdog.stop()

    # ------------------------------------------------------------------ events and change routing

    def emit(self, kind: str, subject: str, message: str, reason: str = "", node: str = "") -> None:
        trace_id = event_trace.trace_id(subject, self._workload_doc)
        fields = {"traceId": trace_id} if trace_id else {}
        if node:  # the node the event concerns: what `events --node` matches
            fields["node"] = node
        self.outbox.emit(ClusterEvent(kind=kind, subject=subject, message=message, reason=reason, fields=fields))

    def _workload_doc(self, wid: str) -> Workload | None:
        cur = self.state.workloads.get(wid)
        return cur.value if cur is not None else None

    def _on_change(self, kind: str, ident: str) -> None:
        if kind == "assignment":
            node_id, _, instance = ident.partition("/")
            self.delivery.wake(node_id)
            self.enqueue(workload_of(instance))
        elif kind == "workload":
            self.enqueue(ident)
        elif kind == "status":
            if not self._settled(ident):
                self.enqueue(workload_of(ident))
        elif kind == "reset":
            self.hints.reset()  # the mirror was reloaded: node changes in between are unknown
        elif kind == "replicas":
            self._spawn(self.membership.sync_shards())
        elif kind == "shards":
            self._shards_changed()
        elif kind == "node":
            self.delivery.wake(ident)
            self.monitor.pending_dirty = True  # a node changed: Pending workloads may fit now
            node = self.state.nodes.get(ident)
            self.hints.node_changed(ident, node.value if node is not None else None)  # which ones: queueing_hints
            if node is not None and node.value.draining:
                self.enqueue_node_workloads(ident)
            self.evictions.node_changed(ident)  # NoExecute taints: move off now or at tolerationSeconds

    def _settled(self, inst: str) -> bool:
        """An instance running where it is assigned, of a workload not being deleted, with no move
        in progress: a status change of such an instance (an agent's report) needs no reconcile.
        Skipping it saves a queue round trip per placement at thousands per second."""
        st = self.state.statuses.get(inst)
        if st is None:
            return False
        s = st.value
        if s.phase != Phase.RUNNING or s.relocating_from or s.left_node:
            return False
        if self.state.placement_of.get(inst) != s.node_id:
            return False
        w = self.state.workloads.get(workload_of(inst))
        return w is not None and not w.value.deleting

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._commit_tasks.add(task)
        task.add_done_callback(self._commit_tasks.discard)

    def enqueue(self, wid: str) -> None:
        self.worker.enqueue(wid)

    def enqueue_all(self) -> None:
        for wid in [*self.state.workloads, *self.state.refused]:
            self.enqueue(wid)

    def enqueue_node_workloads(self, node_id: str) -> None:
        for inst in list(self.state.assignments.get(node_id, {})):
            self.enqueue(workload_of(inst))

    def enqueue_pending(self, hinted: frozenset[str] | None = None) -> None:
        pending: Iterable[str] = self.state.pending
        if hinted is not None:  # only those the node changes could help (queueing_hints)
            statuses = {i: st.value for i in self.state.pending if (st := self.state.statuses.get(i)) is not None}
            pending = queueing_hints.helped(self.state.pending, statuses, hinted)
        for inst in pending:
            self.enqueue(workload_of(inst))

    def runs_on(self, inst: str, node_id: str) -> bool:
        return runs_on(self.state, self.live, self.owns(node_id), inst, node_id)

    async def refresh(self, key: str) -> None:
        """After a lost compare-and-swap, fold the winner's write into the mirror."""
        kv = await self.store.get(key)
        if kv is not None:
            self.state.fold_read(kv)

    # ------------------------------------------------------------------ loops: health, liveness

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_seconds)
            self.heap.tick()
            try:
                await self.guard.check()
                if self.guard.store_revision:
                    self.state.observe_store_revision(self.guard.store_revision, self.clock())
                if (self.guard.mode == Mode.NORMAL and self.config.data_dir is not None
                        and time.monotonic() - self._last_backup >= self._backup_every):
                    started = self._last_backup = time.monotonic()
                    await self.backups.write_local()
                    # A large cluster's backup takes a while and loads the store: keep it under
                    # about 5% of the time (and never more often than the configured interval).
                    self._backup_every = max(self.config.backup_interval_seconds, 20 * (time.monotonic() - started))
            except Exception:
                log.exception("health check failed")

    @property
    def liveness_guard(self) -> GuardState:
        return self.monitor.guard

    def liveness_view(self) -> dict[str, Any]:
        return self.monitor.liveness_view()

    def _forget_node(self, node_id: str) -> None:
        """A deleted node: drop what this replica kept in memory about it."""
        self.live.pop(node_id, None)
        self.agent_api.drift.pop(node_id, None)

    def meter_view(self) -> dict[str, Any]:
        """Persys Meter in health: the samples this replica published or dropped, and the meter's
        own figures (ingest lag, backlog, store) where this process runs it."""
        out: dict[str, Any] = {"samples": self.sample_outbox.health() if self.sample_outbox else None}
        return {**out, **self.meter_status()}

    async def health(self) -> dict[str, Any]:
        return await health(self)


__all__ = ["Scheduler"]
