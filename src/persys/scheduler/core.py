"""The scheduler's brain: desired state in, placements and convergence out.

One worker drains a de-duplicating queue of workload ids and reconciles each one against the
mirror of the durable state (level-triggered: it looks at what is, not at what happened).
Agents' heartbeats and usage stay in memory; only transitions are written to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from persys.events.base import ClusterEvent, EventBus
from persys.events.outbox import EventOutbox
from persys.model import (
    Assignment,
    DesiredState,
    Node,
    NodeStatus,
    NodeUsage,
    Phase,
    RestartPolicy,
    Taint,
    Workload,
    WorkloadManifest,
    WorkloadStatus,
    WorkloadUsage,
)
from persys.model.base import Model
from persys.model.workload import index_of, instance_id, workload_of
from persys.scheduler import failures, keys, quarantine
from persys.scheduler import placement as pl
from persys.scheduler.drift import Drift, Reported, detect
from persys.scheduler.group_commit import (
    FENCE_HEADROOM,
    TXN_MAX_BYTES,
    TXN_MAX_OPS,
    GroupCommit,
    Unit,
    commit_units,
)
from persys.scheduler.guard import Mode, ModeGuard
from persys.scheduler.ha import BlockingLease, LeaderElection, leader_address
from persys.scheduler.heap import HeapGuard
from persys.scheduler.liveness import GuardConfig, GuardState, end_suspension, judge
from persys.scheduler.pages import Page, SortedIds, take_page
from persys.scheduler.placement_adapter import PlacementService, has_local_volumes, to_request
from persys.scheduler.shards import encode_members
from persys.scheduler.shards import owner as shard_owner
from persys.scheduler.stalls import StallWatchdog
from persys.scheduler.state import ClusterState, Versioned, put_doc
from persys.scheduler.worker_watch import WorkerWatch
from persys.store.base import (
    Compare,
    Delete,
    KeyValue,
    LeaseKeeper,
    Put,
    StateStore,
    StoreUnavailable,
    TxnTooLarge,
    txn_bytes,
)

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Model)
BACKUP_FORMAT = "persys-backup/v1"
PLACE_CHUNK = 128  # placements decided between two yields to the event loop
# Each placement carries two compares and two puts; with the leader fence that stays within
# etcd's default --max-txn-ops of 128 per branch.
PLACEMENTS_PER_TXN = (TXN_MAX_OPS - FENCE_HEADROOM) // 2
STOP_WAIT_SECONDS = 5.0  # the longest stop() waits for one of its steps
SPEC_CACHE_ENTRIES = 16_384  # serialised specs kept for replicas and resends (see spec_json)


def _chunks(ops: list[Put | Delete], size: int) -> list[list[Put | Delete]]:
    """`ops` in order, at most `size` and TXN_MAX_BYTES to a chunk (an op larger than that goes
    alone, and the store refuses it)."""
    chunks: list[list[Put | Delete]] = []
    n_bytes = 0
    for op in ops:
        b = txn_bytes((), (op,))
        if not chunks or len(chunks[-1]) >= size or n_bytes + b > TXN_MAX_BYTES:
            chunks.append([])
            n_bytes = 0
        chunks[-1].append(op)
        n_bytes += b
    return chunks


def _page_json(view: dict[str, Any]) -> bytes:
    return json.dumps(view, separators=(",", ":")).encode()


def _placement_doc(decision: pl.Decision, explanation: str) -> dict[str, Any]:
    """What a status keeps of a decision: the explanation and the top candidates' scores. The
    per-node rejections are summarised in the explanation, never stored one by one: at thousands
    of nodes they would make every status document tens of kilobytes. Scores are kept compact,
    [node, total, [contribution per scorer]] with the scorer names once (a status per instance
    is held in memory: this is most of its size); `placement_view` expands them for people."""
    names = list(decision.scores[0].breakdown) if decision.scores else []
    return {
        "node_id": decision.node_id,
        "feasible": decision.feasible,
        "total": decision.total,
        "evaluated": decision.evaluated,
        "scorers": names,
        "scores": [[s.node_id, round(s.total, 3), [round(s.breakdown[k], 3) for k in names]]
                   for s in decision.scores],
        "explanation": explanation,
    }


def placement_view(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored placement document with every score spelled out (node_id, total, breakdown)."""
    names = doc.get("scorers")
    if not names:
        return doc  # nothing placed, or a document stored before scores were compact
    scores = [{"node_id": n, "total": t, "breakdown": dict(zip(names, parts, strict=False))}
              for n, t, parts in doc.get("scores", [])]
    return {k: v for k, v in doc.items() if k != "scorers"} | {"scores": scores}


@dataclass
class SchedulerConfig:
    node_grace_seconds: float = 10.0  # without heartbeats before a node is NotReady (3+ heartbeats)
    heartbeat_interval_seconds: float = 3.0
    report_interval_seconds: float = 2.0
    pending_retry_seconds: float = 5.0
    monitor_interval_seconds: float = 1.0
    batch_size: int = 256  # workloads reconciled per batch
    max_backlog: int = 2_000  # bulk applies wait while more workloads than this await reconciling
    admission_wait_seconds: float = 10.0
    commit_concurrency: int = 16  # placement transactions (of up to 63 placements each) in flight
    # Stop filtering once max(100, this % of nodes) feasible nodes are found (100 = score every
    # node). Like kube-scheduler's percentageOfNodesToScore and Nomad's candidate limit: at 5,000
    # nodes, 2% is about 4x faster per decision than kube's adaptive 10%. Pending decisions
    # always evaluate every node, so refusals are always complete.
    nodes_to_score_percent: int = 2
    # Where the scheduler remembers its cluster's id and keeps a rolling backup (None: nowhere,
    # which disables recognising a wiped store after a restart of the scheduler itself).
    data_dir: Path | None = None
    # More than this share of a replica's nodes going silent at once suspends NotReady marking
    # (with at least liveness_guard_min_nodes nodes), for at most liveness_suspension_seconds
    # (None: six grace periods, 60 s by default; 0: never suspend). See liveness.py.
    max_lost_fraction: float = 0.5
    liveness_guard_min_nodes: int = 10
    liveness_suspension_seconds: float | None = None
    health_interval_seconds: float = 1.0
    replica_id: str = ""  # unique per replica (default: a random id)
    advertise: str = ""  # address agents should use to reach this replica when it is active
    leader_ttl_seconds: float = 2.0  # failover happens within about this long
    # Active-active: node work (agents, liveness, statuses) is spread over all live replicas by
    # rendezvous hashing; placement stays with the elected leader. Off: one active replica.
    sharded: bool = False
    backup_interval_seconds: float = 60.0
    # Log what held the event loop whenever it stalls longer than this (0: off; see stalls.py).
    stall_log_seconds: float = 0.0


@dataclass
class WorkloadReport:
    """What an agent says about one workload (the gRPC message, decoupled from protobuf)."""

    workload_id: str
    revision: str
    generation: int
    phase: Phase
    reason: str = ""
    message: str = ""
    terminal: bool = False
    runtime_id: str = ""
    restarts: int = 0
    usage: WorkloadUsage | None = None  # None: nothing measured


@dataclass(slots=True)
class _Placed:
    """A decision on its way to the store."""

    workload: Workload
    wrev: int
    instance: str
    decision: pl.Decision
    explanation: str = ""
    moved_from: str = ""


@dataclass
class LiveNode:
    """Per-node facts kept only in memory: heartbeats never touch the store."""

    last_heartbeat: float  # monotonic
    last_heartbeat_wall: float
    usage: NodeUsage = field(default_factory=NodeUsage)
    present: set[str] = field(default_factory=set)  # workloads in the last complete report
    reported: bool = False
    # When the agent itself last spoke (heartbeat, report, registration). Unlike last_heartbeat,
    # which fresh grace periods move forward, only this can make a node Ready (liveness.py).
    heard_at: float = float("-inf")


class MutationRefused(Exception):
    """The control plane cannot accept a change right now (concurrent writers, ...)."""


class Frozen(MutationRefused):
    """Refused because the control plane is degraded or in recovery."""


class NotFound(KeyError):
    pass


class NotActive(Exception):
    """This replica is a standby; `leader` is the active replica's address ('' if unknown)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"this scheduler replica is a standby; the active one is {leader or 'not elected yet'}")
        self.leader = leader


class CatchingUp(NotActive):
    """Elected, but the mirror has not applied every change up to this replica's own leader key
    yet: it acts on nothing until it has. Agents are told the leader is this replica and retry."""

    def __init__(self, address: str, revision: int, needed: int) -> None:
        Exception.__init__(self, f"this scheduler replica was elected and is catching up with the state store "
                                 f"(mirror at revision {revision}, needs {needed}); retry shortly")
        self.leader = address


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        events: EventBus,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        blocking_lease: Callable[[], BlockingLease] | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.state = ClusterState(store)
        # Lists walk ids in order from a position: kept sorted as the mirror changes (pages.py).
        self.sorted_workloads = SortedIds("workload", self.state.workloads)
        self.sorted_nodes = SortedIds("node", self.state.nodes)
        self.state.subscribe(self.sorted_workloads.on_change)
        self.state.subscribe(self.sorted_nodes.on_change)
        self.placement = PlacementService(
            self.state, pl.PlacementConfig(percentage_of_nodes_to_score=self.config.nodes_to_score_percent)
        )
        self.live: dict[str, LiveNode] = {}
        self.usage: dict[str, WorkloadUsage] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._backlog_low = asyncio.Event()  # the reconcile backlog is short enough for bulk applies
        self._inflight: set[str] = set()  # instances whose placement is being committed
        self._pending_dirty = False
        self.liveness_guard = GuardState()  # the mass-loss guard (liveness.py)
        self._spec_cache: dict[tuple[str, str], bytes] = {}
        self._drift: dict[str, dict[tuple[str, str], tuple[Drift, float]]] = {}  # node -> open findings
        self._commit_slots = asyncio.Semaphore(self.config.commit_concurrency)
        self._status_writes = GroupCommit(lambda c, o: self.state.commit(c, o, fenced="node"))
        self._commit_tasks: set[asyncio.Task[None]] = set()
        self._node_changed: dict[str, asyncio.Event] = {}
        self._resync: set[str] = set()  # nodes whose next desired-state message must be a full set
        self._tasks: list[asyncio.Task[Any]] = []
        self._started_at = clock()
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
        self.state.fences["node"] = self._node_fence
        self._member_rev = 0  # mod revision of our /persys/replicas key (sharded mode)
        self._owned: set[str] = set()
        self._active_tasks: list[asyncio.Task[Any]] = []
        self.worker_watch = WorkerWatch()
        self.elected_at_wall = 0.0  # wall-clock time of the last election win (health, failover timing)
        self._active_fence = 0  # the leader term (fence revision) this replica has caught up for

    @property
    def is_active(self) -> bool:
        """Elected AND the mirror has caught up with the store as of the election: a replica that
        acted on a mirror missing changes would withdraw what it does not know from agents."""
        return self.election.is_leader and self._active_fence == self.election.fence_revision

    @property
    def catching_up(self) -> bool:
        return self.election.is_leader and not self.is_active

    # ------------------------------------------------------------------ shards

    def owner_of(self, node_id: str) -> str:
        members = self.state.shards[0]
        return shard_owner(node_id, members) if members else ""

    def owns(self, node_id: str) -> bool:
        """Whether this replica serves the node's agent and judges its liveness."""
        if not self.config.sharded:
            return self.is_active
        # Our own membership write must be in the mirror: nothing older is missing from it then.
        return (self._member_rev > 0 and self.state.revision >= self._member_rev
                and self.owner_of(node_id) == self.election.replica_id)

    def require_owner(self, node_id: str) -> None:
        if not self.owns(node_id):
            if not self.config.sharded:
                if self.catching_up:
                    raise CatchingUp(self.config.advertise, self.state.revision, self.election.fence_revision)
                raise NotActive(self.leader_address())
            raise NotActive(self.state.replicas.get(self.owner_of(node_id), ""))

    def _node_fence(self) -> list[Compare] | None:
        if not self.config.sharded:
            return self.election.fence() if self.election.is_leader else None
        members, rev = self.state.shards
        if not self._member_rev or not rev or self.election.replica_id not in members:
            return None
        # Our membership still holds (lease alive) and the shard map is the one we acted on.
        return [Compare(keys.REPLICAS + self.election.replica_id, self._member_rev), Compare(keys.SHARDS, rev)]

    async def _membership_loop(self) -> None:
        """Announce this replica (leased) for as long as it runs; re-announce after a lost lease."""
        key = keys.REPLICAS + self.election.replica_id
        value = json.dumps({"address": self.config.advertise}).encode()
        while True:
            try:
                lease = await self.store.grant_lease(self.config.leader_ttl_seconds)
                keeper = LeaseKeeper(self.store, lease, self.config.leader_ttl_seconds)
                keeper.start()
                try:
                    self._member_rev = await self.store.put(key, value, lease)
                    await keeper.lost.wait()
                finally:
                    self._member_rev = 0
                    await keeper.stop()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("replica membership: %s; retrying", err)
            await asyncio.sleep(self.config.leader_ttl_seconds / 4)

    async def _sync_shards(self) -> None:
        """Leader: record the live membership as the shard map when it changed."""
        if not (self.config.sharded and self.is_active):
            return
        live = set(self.state.replicas)
        members, rev = self.state.shards
        if live and live != set(members):
            await self.state.commit([Compare(keys.SHARDS, rev)], [Put(keys.SHARDS, encode_members(live))])

    def _shards_changed(self) -> None:
        """Hand nodes over: newly owned ones get a fresh grace period; agents of nodes we no
        longer own are pointed at their new owner when their streams end."""
        now = self.clock()
        owned = {n for n in self.state.nodes if self.owns(n)}
        for n in owned - self._owned:
            live = self.live.setdefault(n, LiveNode(now, time.time()))
            live.last_heartbeat = now
        self._owned = owned
        for ev in self._node_changed.values():
            ev.set()

    def leader_address(self) -> str:
        addr = leader_address(self.state.leader)
        # A replica that is not active never names itself: its mirror may be stale (it was cut off
        # or frozen), and pointing agents back at it would keep them from the real active replica.
        return "" if addr == self.config.advertise and not self.is_active else addr

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
        now = self.clock()
        self._started_at = now
        for live in self.live.values():
            live.last_heartbeat = now
        for wid in [*self.state.workloads, *self.state.refused]:
            self._enqueue(wid)
        self._active_tasks = [self._start_worker()]
        self._spawn(self._sync_shards())
        self.emit("SchedulerElected", "cluster", f"replica {self.election.replica_id} is active")

    async def _deposed(self) -> None:
        self._active_fence = 0
        self._backlog_low.set()  # nothing drains the queue here now: do not hold applies for it
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
        for ev in self._node_changed.values():
            ev.set()  # agents' streams end and they look for the active replica

    @property
    def mode(self) -> str:
        return str(self.guard.mode)

    def _require_normal(self) -> None:
        if self.guard.mode == Mode.DEGRADED:
            raise Frozen(f"control plane is degraded ({self.guard.reason}); changes are refused until the "
                         "state store is back, running workloads keep running")
        if self.guard.mode == Mode.RECOVERY:
            raise Frozen(f"control plane is in recovery: {self.guard.reason}")

    def _mode_changed(self, old: Mode, new: Mode, reason: str) -> None:
        self.emit("ModeChanged", "cluster", f"{old} -> {new}" + (f": {reason}" if reason else ""), str(new))
        for ev in self._node_changed.values():
            ev.set()  # agents learn the mode at once (hold / resume)
        if new == Mode.NORMAL:
            # Heartbeats could not be judged while frozen: every node gets a fresh grace period.
            now = self.clock()
            self._started_at = now
            for live in self.live.values():
                live.last_heartbeat = max(live.last_heartbeat, now)
            for wid in [*self.state.workloads, *self.state.refused]:
                self._enqueue(wid)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.heap.install()
        if self.stall_watchdog is not None:
            self.stall_watchdog.start()
        await self.state.load()
        has_state = bool(self.state.workloads or self.state.refused or self.state.nodes or self.state.assignments)
        await self.guard.establish(self.state.cluster_marker, has_state)
        self.state.subscribe(self._on_change)
        self.state.start_following()
        self._started_at = self.clock()
        for wid in [*self.state.workloads, *self.state.refused]:
            self._enqueue(wid)
        self._tasks = [
            asyncio.create_task(self._publisher(), name="event-publisher"),
            asyncio.create_task(self._health_loop(), name="mode-guard"),
            asyncio.create_task(self._monitor(), name="node-monitor"),
        ]
        if self.config.sharded:
            self._tasks.append(asyncio.create_task(self._membership_loop(), name="replica-membership"))
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
        if self._commit_tasks:
            await asyncio.wait(set(self._commit_tasks), timeout=5)
        for t in [*self._tasks, *self._active_tasks]:
            t.cancel()
        pending = [t for t in [*self._tasks, *self._active_tasks] if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_SECONDS)
        await self.state.stop()
        self.heap.uninstall()
        if self.stall_watchdog is not None:
            await self.stall_watchdog.stop()

    # ------------------------------------------------------------------ events

    def emit(self, kind: str, subject: str, message: str, reason: str = "") -> None:
        self.outbox.emit(ClusterEvent(kind=kind, subject=subject, message=message, reason=reason))

    async def _publisher(self) -> None:
        await self.outbox.run()

    # ------------------------------------------------------------------ change routing

    def _on_change(self, kind: str, ident: str) -> None:
        if kind == "assignment":
            node_id, _, instance = ident.partition("/")
            self._wake_node(node_id)
            self._enqueue(workload_of(instance))
        elif kind == "workload":
            self._enqueue(ident)
        elif kind == "status":
            if not self._settled(ident):
                self._enqueue(workload_of(ident))
        elif kind == "replicas":
            self._spawn(self._sync_shards())
        elif kind == "shards":
            self._shards_changed()
        elif kind == "node":
            self._wake_node(ident)
            self._pending_dirty = True  # a node changed: Pending workloads may fit now
            node = self.state.nodes.get(ident)
            if node is not None and node.value.draining:
                self._enqueue_node_workloads(ident)

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

    def _wake_node(self, node_id: str) -> None:
        ev = self._node_changed.get(node_id)
        if ev is not None:
            ev.set()

    def _enqueue(self, wid: str) -> None:
        if wid not in self._queued:
            self._queued.add(wid)
            self._queue.put_nowait(wid)

    def _enqueue_node_workloads(self, node_id: str) -> None:
        for inst in list(self.state.assignments.get(node_id, {})):
            self._enqueue(workload_of(inst))

    def _enqueue_pending(self) -> None:
        for inst in self.state.pending:
            self._enqueue(workload_of(inst))

    async def _worker(self, delay: float = 0.0) -> None:
        """Drain the queue in batches: reconcile each workload, then place what needs a node
        in one engine pass (reserving as it goes) and commit the placements concurrently.
        `delay`: wait that long first (a restart after repeated failures backs off)."""
        if delay > 0:
            log.warning("restarting the reconcile worker in %.1f s", delay)
            await asyncio.sleep(delay)
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.config.batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for wid in batch:
                self._queued.discard(wid)
            if len(self._queued) <= self.config.max_backlog:
                self._backlog_low.set()
            if self.guard.mode != Mode.NORMAL:
                # Frozen: decide nothing. Everything is re-enqueued when the mode returns to normal.
                await asyncio.sleep(0.2)
                continue
            needs: list[tuple[Workload, int, str]] = []
            for wid in batch:
                try:
                    needs += await self._reconcile(wid)
                except StoreUnavailable as err:
                    log.warning("store unavailable while reconciling %s: %s", wid, err)
                    await asyncio.sleep(1.0)
                    self._enqueue(wid)
                except Exception as err:
                    log.exception("reconcile of %s failed", wid)
                    await self._mark_failed(wid, None, failures.INTERNAL_ERROR, err)
            if needs:
                await self._place_isolated(needs)

    def _start_worker(self, delay: float = 0.0) -> asyncio.Task[None]:
        task = asyncio.create_task(self._worker(delay), name="reconcile-worker")
        task.add_done_callback(self._worker_ended)
        return task

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        """The worker only ends when cancelled (deposed, stopping). Should it end otherwise, say
        so in health and start another: one bug must not stop all scheduling."""
        if task.cancelled() or task not in self._active_tasks:
            return
        err = task.exception()
        why = failures.describe(err) if err is not None else "returned"
        log.error("reconcile worker ended unexpectedly (%s); restarting it", why, exc_info=err)
        self.worker_watch.failed(why, self.clock())
        self._active_tasks.remove(task)
        if self.is_active:
            self._active_tasks.append(self._start_worker(self.worker_watch.restart_delay()))
            for wid in [*self.state.workloads, *self.state.refused]:
                self._enqueue(wid)  # the batch it held is lost: look at everything again

    async def _place_isolated(self, needs: list[tuple[Workload, int, str]]) -> None:
        """`_place` the batch; if it raises, place its workloads one by one so that only the one
        that fails is marked (with the reason) and every other is placed."""
        try:
            await self._place(needs)
            return
        except StoreUnavailable as err:
            await self._requeue_unplaced(needs, err)
            return
        except Exception as err:
            if len({w.id for w, _, _ in needs}) == 1:
                self._undo_place(needs)
                log.warning("placing %s failed: %s", needs[0][0].id, failures.describe(err))
                await self._mark_failed(needs[0][0].id, [i for _, _, i in needs], failures.PLACEMENT_ERROR, err)
                return
            log.warning("placing a batch of %d failed (%s); placing them one workload at a time", len(needs),
                        failures.describe(err))
        self._undo_place(needs)
        by_workload: dict[str, list[tuple[Workload, int, str]]] = {}
        for item in needs:
            by_workload.setdefault(item[0].id, []).append(item)
        for wid, items in by_workload.items():
            try:
                await self._place(items)
            except StoreUnavailable as err:
                await self._requeue_unplaced(items, err)
            except Exception as err:
                self._undo_place(items)
                log.warning("placing %s failed: %s", wid, failures.describe(err))
                await self._mark_failed(wid, [i for _, _, i in items], failures.PLACEMENT_ERROR, err)

    async def _requeue_unplaced(self, needs: list[tuple[Workload, int, str]], err: StoreUnavailable) -> None:
        """The store failed, not the placement: nothing is wrong with these workloads. Release
        what was reserved for them and look at them again once the store answers."""
        self._undo_place(needs)
        wids = list(dict.fromkeys(w.id for w, _, _ in needs))
        log.warning("store unavailable while placing %d workload(s): %s; retrying", len(wids), err)
        await asyncio.sleep(1.0)
        for wid in wids:
            self._enqueue(wid)

    def _undo_place(self, needs: list[tuple[Workload, int, str]]) -> None:
        """Release what a failed `_place` reserved for instances it did not hand to a commit."""
        for _, _, inst in needs:
            if inst not in self._inflight:
                self.placement.release(inst)

    async def _mark_failed(self, wid: str, instances: list[str] | None, reason: str, err: BaseException) -> None:
        """Say on the workload's unplaced instances (all of them when None) why they have no
        node, and publish it; never raises (the worker must go on)."""
        message = failures.describe(err)
        self.emit("WorkloadFailed" if reason == failures.INTERNAL_ERROR else "PlacementFailed",
                  f"workload/{wid}", message, reason)
        try:
            cur = self.state.workloads.get(wid)
            if cur is None:
                return
            if instances is None:
                instances = [instance_id(wid, i) for i in range(cur.value.spec.replicas)]
            now = time.time()
            for inst in failures.unplaced(instances, self.state.placement_of):
                st = self.state.statuses.get(inst)
                new = failures.failure_status(st.value if st else None, reason, message, now)
                if new is not None:
                    await self.state.commit([Compare(keys.workload(wid), cur.mod_revision)],
                                            [Put(keys.status(inst), new.to_json())])
        except Exception:
            log.exception("could not record the failure of %s", wid)

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
                    await self._write_local_backup()
                    # A large cluster's backup takes a while and loads the store: keep it under
                    # about 5% of the time (and never more often than the configured interval).
                    self._backup_every = max(self.config.backup_interval_seconds,
                                             20 * (time.monotonic() - started))
            except Exception:
                log.exception("health check failed")

    async def _monitor(self) -> None:
        last_retry = self.clock()
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.config.monitor_interval_seconds)
            # Time this process could not listen (an overloaded event loop, a pause) is not
            # the nodes' fault: it does not count against their grace period.
            lag = time.monotonic() - before - self.config.monitor_interval_seconds
            if lag > 0.5:
                for live in self.live.values():
                    live.last_heartbeat += lag
            if self.guard.mode != Mode.NORMAL:
                continue  # liveness cannot be judged or recorded while frozen
            try:
                await self._check_nodes()
                if not self.is_active:
                    continue
                # A quiet moment: bring the placement snapshot up to date now, in small steps,
                # rather than in one piece inside the next decision (after a start or failover
                # that is every node).
                await self.placement.prepare()
                if self._pending_dirty or self.clock() - last_retry >= self.config.pending_retry_seconds:
                    # Coalesced: a burst of node changes costs one pass over the workloads.
                    self._pending_dirty = False
                    last_retry = self.clock()
                    self._enqueue_pending()
            except StoreUnavailable as err:
                log.warning("node monitor: store unavailable: %s", err)
            except Exception:
                log.exception("node monitor failed")

    # ------------------------------------------------------------------ client API

    async def apply(self, manifest: WorkloadManifest, dry_run: bool = False) -> tuple[Workload, bool, bool]:
        """Create or update a workload. Returns (workload, created, changed); idempotent."""
        if not dry_run:
            self._require_normal()
        now = time.time()
        incoming = Workload.from_manifest(manifest, now)
        key = keys.workload(incoming.id)
        for _ in range(10):
            current = self.state.workloads.get(incoming.id)
            if current is None:
                if dry_run:
                    return incoming, True, True
                # rev_of: 0, or the revision of a stored document the model refuses, which a
                # valid manifest of the same name replaces.
                if await self.state.commit([Compare(key, self.state.rev_of(key))], [Put(key, incoming.to_json())],
                                           fenced=False):
                    self.emit("WorkloadCreated", f"workload/{incoming.id}", f"revision {incoming.revision}")
                    return incoming, True, True
                await self._refresh(key)
                continue
            old = current.value
            same_spec = old.spec.spec_revision() == incoming.revision
            if same_spec and old.labels == incoming.labels and not old.deleting:
                return old, False, False
            revision = Workload.revision_of(incoming.spec, old.restart_epoch)
            updated = old.model_copy(
                update={
                    "spec": incoming.spec,
                    "labels": incoming.labels,
                    "revision": revision,
                    "generation": old.generation + (0 if same_spec else 1),
                    "updated_at": now,
                    "deleting": False,
                }
            )
            if dry_run:
                return updated, False, True
            if await self.state.commit([Compare(key, current.mod_revision)], [Put(key, updated.to_json())],
                                       fenced=False):
                self.emit("WorkloadUpdated", f"workload/{old.id}", f"revision {updated.revision}")
                return updated, False, True
            await self._refresh(key)
        raise MutationRefused(f"workload {incoming.id} is being changed concurrently; try again")

    async def apply_many(self, manifests: list[WorkloadManifest]) -> list[tuple[Workload, bool, bool]]:
        """Apply many manifests at once (same results as `apply` one by one, in order).

        New workloads are created together, many per transaction; a name applied twice in the
        batch, an existing workload, or a create that lost a race goes through `apply`."""
        self._require_normal()
        await self._admit()
        now = time.time()
        incoming = [Workload.from_manifest(m, now) for m in manifests]
        puts = [put_doc(keys.workload(w.id), w) for w in incoming]
        for i, put in enumerate(puts):  # refuse the batch before anything is written
            if txn_bytes([Compare(put.key, 0)], [put]) > TXN_MAX_BYTES:
                raise TxnTooLarge(f"manifest {i + 1} ({incoming[i].id}): its stored document of {len(put.value)} "
                                  f"bytes exceeds the limit of {TXN_MAX_BYTES} bytes per store write")
        fresh: dict[str, int] = {}  # workload id -> index of its only occurrence
        seen: set[str] = set()
        for i, w in enumerate(incoming):
            if w.id in seen:
                fresh.pop(w.id, None)
            elif w.id not in self.state.workloads:
                fresh[w.id] = i
            seen.add(w.id)
        created: dict[int, bool] = {}
        if fresh:
            units = [Unit([Compare(keys.workload(wid), 0)], [puts[i]]) for wid, i in fresh.items()]
            oks = await commit_units(lambda c, o: self.state.commit(c, o, fenced=False), units)
            for (wid, i), ok in zip(fresh.items(), oks, strict=True):
                created[i] = ok
                if ok:
                    self.emit("WorkloadCreated", f"workload/{wid}", f"revision {incoming[i].revision}")
        out = []
        for i, m in enumerate(manifests):
            out.append((incoming[i], True, True) if created.get(i) else await self.apply(m))
        return out

    async def _admit(self) -> None:
        """Hold a bulk apply while this (active) replica's reconcile backlog is long, for at most
        a while: taking work faster than it is placed only grows memory and latency, and a
        saturated replica answers heartbeats and reports late."""
        if not self.is_active or len(self._queued) <= self.config.max_backlog:
            return
        self._backlog_low.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._backlog_low.wait(), self.config.admission_wait_seconds)

    async def _cas_change(self, key: str, what: str, read: Callable[[], Versioned[M] | None],
                          change: Callable[[M], M], stamp: Callable[[M], None] | None = None) -> tuple[M, bool]:
        """Apply an operator's change to one document with compare-and-swap (any replica may).

        Returns the document and whether it was written; `stamp` runs only on a real change."""
        self._require_normal()
        for _ in range(10):
            cur = read()
            if cur is None:
                raise NotFound(what)
            updated = change(cur.value.model_copy(deep=True))
            if updated == cur.value:
                return updated, False
            if stamp is not None:
                stamp(updated)
            if await self.state.commit([Compare(key, cur.mod_revision)], [Put(key, updated.to_json())], fenced=False):
                return updated, True
            await self._refresh(key)
        raise MutationRefused(f"{what} is being changed concurrently; try again")

    async def _change_workload(self, wid: str, change: Callable[[Workload], Workload], event: str) -> Workload:
        def read() -> Versioned[Workload] | None:
            cur = self.state.workloads.get(wid)
            return cur if cur is not None and not cur.value.deleting else None

        def stamp(w: Workload) -> None:
            w.updated_at = time.time()

        updated, written = await self._cas_change(keys.workload(wid), f"workload {wid!r}", read, change, stamp)
        if written:
            self.emit(event, f"workload/{wid}", f"revision {updated.revision}")
        return updated

    async def set_desired_state(self, wid: str, state: DesiredState) -> Workload:
        """Start or stop a workload without editing its manifest."""

        def change(w: Workload) -> Workload:
            if w.spec.desired_state != state:
                w.spec.desired_state = state
                w.revision = Workload.revision_of(w.spec, w.restart_epoch)
                w.generation += 1
            return w

        return await self._change_workload(wid, change, "WorkloadStarted" if state == DesiredState.RUNNING
                                           else "WorkloadStopping")

    async def restart(self, wid: str) -> Workload:
        """Replace every instance with a fresh copy of the same spec (a new revision)."""

        def change(w: Workload) -> Workload:
            w.restart_epoch += 1
            w.revision = Workload.revision_of(w.spec, w.restart_epoch)
            w.generation += 1
            return w

        return await self._change_workload(wid, change, "WorkloadRestarting")

    async def delete(self, wid: str) -> tuple[bool, bool]:
        """Ask for a workload's removal. Returns (deleted, already_gone); idempotent."""
        self._require_normal()
        key = keys.workload(wid)
        for _ in range(10):
            current = self.state.workloads.get(wid)
            refused = self.state.refused.get(wid) if current is None else None
            if refused is not None:  # stored, but refused by the model: deletable all the same
                if refused.value.deleting:
                    return True, False
                if await self.state.commit([Compare(key, refused.mod_revision)],
                                           [Put(key, quarantine.marked_deleting(refused.value, time.time()))],
                                           fenced=False):
                    self.emit("WorkloadDeleting", f"workload/{wid}", "deletion requested")
                    return True, False
                await self._refresh(key)
                continue
            if current is None:
                return False, True
            if current.value.deleting:
                return True, False
            marked = current.value.model_copy(update={"deleting": True, "updated_at": time.time()})
            if await self.state.commit([Compare(key, current.mod_revision)], [Put(key, marked.to_json())],
                                       fenced=False):
                self.emit("WorkloadDeleting", f"workload/{wid}", "deletion requested")
                return True, False
            await self._refresh(key)
        raise MutationRefused(f"workload {wid} is being changed concurrently; try again")

    async def _refresh(self, key: str) -> None:
        """After a lost compare-and-swap, fold the winner's write into the mirror."""
        kv = await self.store.get(key)
        if kv is not None:
            self.state.fold_read(kv)

    def plan(self, manifest: WorkloadManifest) -> list[tuple[str, pl.Decision]]:
        """Where the workload's replicas would go now, and why. Writes and reserves nothing."""
        w = Workload.from_manifest(manifest, time.time())
        current = self.state.workloads.get(w.id)
        requests = []
        for i in range(w.spec.replicas):
            inst = instance_id(w.id, i)
            st = self.state.statuses.get(inst)
            pinned = st.value.volume_node if st and st.value.volume_node and current else None
            requests.append(to_request(w, inst, pinned or None))
        decisions = self.placement.plan(requests)
        return [(r.id, d) for r, d in zip(requests, decisions, strict=True)]

    def explain(self, wid: str, node_id: str = "") -> dict[str, Any]:
        """The stored placement explanation of each replica; with `node_id`, every filter's
        verdict and the score breakdown for that node as the cluster stands now."""
        cur = self.state.workloads.get(wid)
        if cur is None:
            raise NotFound(f"workload {wid!r}")
        w = cur.value
        out: dict[str, Any] = {"workload": wid, "replicas": []}
        for i in range(w.spec.replicas):
            inst = instance_id(wid, i)
            st = self.state.statuses.get(inst)
            status = st.value if st else WorkloadStatus(reason="Scheduling")
            out["replicas"].append({
                "instance": inst, "phase": str(status.phase), "node": self.state.placement_of.get(inst, ""),
                "explanation": status.placement.get("explanation", status.message),
                "decision": placement_view(status.placement),
            })
        if node_id:
            if node_id not in self.state.nodes:
                raise NotFound(f"node {node_id!r}")
            ev = self.placement.evaluate(to_request(w, wid), node_id)
            out["node"] = ev.to_dict() if ev else None
        return out

    # ------------------------------------------------------------------ reconcile one workload

    async def _reconcile(self, wid: str) -> list[tuple[Workload, int, str]]:
        """Converge one workload's instances; returns the instances that need a node."""
        cur = self.state.workloads.get(wid)
        existing = set(self.state.instances.get(wid, ()))
        if cur is None and wid in self.state.refused:
            await self._reconcile_refused(wid, existing)
            return []
        if cur is None:
            await self._cleanup_orphans(existing)
            return []
        w, wrev = cur.value, cur.mod_revision
        if w.deleting:
            await self._reconcile_deletion(w.id, wrev, existing)
            return []
        wanted = {instance_id(wid, i) for i in range(w.spec.replicas)}
        extra = existing - wanted
        if extra:  # scaled down: withdraw the surplus replicas (agents remove them)
            await self._cleanup_orphans(extra)
        needs = []
        for inst in sorted(wanted, key=index_of):
            node_id = self.state.placement_of.get(inst)
            if node_id is not None:
                if await self._relocate_if_needed(w, wrev, inst, node_id):
                    continue
                await self._sync_assignment(w, inst, node_id)
            elif inst not in self._inflight and not self._still_on_old_node(inst):
                needs.append((w, wrev, inst))
        return needs

    async def _reconcile_refused(self, wid: str, existing: set[str]) -> None:
        """A stored workload the model refuses: never placed, never removed unasked; its unplaced
        instances say why (see quarantine)."""
        cur = self.state.refused[wid]
        r, rev = cur.value, cur.mod_revision
        if r.deleting:
            await self._reconcile_deletion(wid, rev, existing)
            return
        now = time.time()
        for inst in failures.unplaced(existing | {wid}, self.state.placement_of):
            st = self.state.statuses.get(inst)
            new = quarantine.refused_status(st.value if st else None, r, now)
            if new is not None and await self.state.commit([Compare(keys.workload(wid), rev)],
                                                           [Put(keys.status(inst), new.to_json())]):
                self.emit("WorkloadInvalid", f"workload/{wid}", r.message, quarantine.INVALID_SPEC)

    async def _relocate_if_needed(self, w: Workload, wrev: int, inst: str, node_id: str) -> bool:
        """Move an instance off a draining or lost node. True if it was withdrawn."""
        node = self.state.nodes.get(node_id)
        if node is None:
            why = f"node {node_id} is gone"
        elif node.value.draining:
            why = f"node {node_id} is draining"
        elif node.value.status == NodeStatus.NOT_READY:
            why = f"node {node_id} is lost ({node.value.status_reason})"
        else:
            return False
        st = self.state.statuses.get(inst)
        prev = st.value if st else WorkloadStatus()
        if has_local_volumes(w) and (prev.volume_node or node_id) == node_id:
            # A node-local volume cannot follow: the instance stays (a drain reports it as
            # blocking), and says why.
            msg = f"{why}; not relocated: its node-local volume lives on {node_id}"
            if prev.message != msg:
                new = prev.model_copy(update={"reason": "NodeLost", "message": msg, "updated_at": time.time()})
                await self.state.commit([Compare(keys.workload(w.id), wrev)], [Put(keys.status(inst), new.to_json())])
                self.emit("RelocationBlocked", f"workload/{w.id}", f"{inst}: {msg}", "NodeLocalVolume")
            return False
        new = prev.model_copy(update={
            "phase": Phase.PENDING, "reason": "Relocating", "message": f"{why}; moving it elsewhere",
            "relocating_from": node_id, "left_node": "", "updated_at": time.time(),
        })
        ok = await self.state.commit(
            [Compare(keys.workload(w.id), wrev)],
            [Delete(keys.assignment(node_id, inst)), Put(keys.status(inst), new.to_json())],
        )
        if ok:
            self.emit("Relocating", f"workload/{w.id}", f"{inst}: {why}", "Relocating")
        return ok

    def _still_on_old_node(self, inst: str) -> bool:
        """While a reachable node still runs an instance being moved off it, do not start a second
        copy elsewhere: a single-instance workload must never run twice."""
        st = self.state.statuses.get(inst)
        old = st.value.relocating_from if st else ""
        return bool(old) and self._runs_on(inst, old)

    async def _cleanup_orphans(self, instances: set[str]) -> None:
        ops: list[Put | Delete] = []
        for inst in instances:
            node_id = self.state.placement_of.get(inst)
            if node_id is not None:
                ops.append(Delete(keys.assignment(node_id, inst)))
            if inst in self.state.statuses:
                ops.append(Delete(keys.status(inst)))
        for chunk in _chunks(ops, TXN_MAX_OPS):
            await self.state.commit([], chunk)

    async def _reconcile_deletion(self, wid: str, wrev: int, instances: set[str]) -> None:
        withdraw: list[Put | Delete] = []
        waiting = False
        now = time.time()
        for inst in instances:
            st = self.state.statuses.get(inst)
            node_id = self.state.placement_of.get(inst)
            if node_id is not None:
                # Withdraw the assignment: the agent stops and removes what is no longer desired.
                status = (st.value if st else WorkloadStatus()).model_copy(
                    update={"phase": Phase.DELETING, "reason": "Deleting", "message": "", "left_node": "",
                            "updated_at": now}
                )
                withdraw += [Delete(keys.assignment(node_id, inst)), Put(keys.status(inst), status.to_json())]
                waiting = True
                continue
            on_node = st.value.node_id if st else ""
            if on_node and self._runs_on(inst, on_node):
                waiting = True  # the agent's next complete report without it re-enqueues us
        if withdraw:
            for chunk in _chunks(withdraw, TXN_MAX_OPS - 1):
                await self.state.commit([Compare(keys.workload(wid), wrev)], chunk)
            return
        if waiting:
            return
        ops: list[Put | Delete] = [Delete(keys.workload(wid))]
        ops += [Delete(keys.status(inst)) for inst in instances if inst in self.state.statuses]
        if await self.state.commit([Compare(keys.workload(wid), wrev)], ops[:TXN_MAX_OPS]):
            for inst in instances:
                self.usage.pop(inst, None)
            if len(ops) > TXN_MAX_OPS:
                await self._cleanup_orphans(instances)
            self.emit("WorkloadDeleted", f"workload/{wid}", "removed from the cluster")

    async def _place(self, needs: list[tuple[Workload, int, str]]) -> None:
        requests = []
        for w, _wrev, inst in needs:
            st = self.state.statuses.get(inst)
            pinned = st.value.volume_node if st and st.value.volume_node else None
            requests.append(to_request(w, inst, pinned))
        decisions: list[pl.Decision] = []
        for i in range(0, len(requests), PLACE_CHUNK):
            decisions += self.placement.place(requests[i : i + PLACE_CHUNK])
            await asyncio.sleep(0)  # let heartbeats and lease keep-alives run between engine passes
        placed: list[_Placed] = []
        for (w, wrev, inst), decision in zip(needs, decisions, strict=True):
            if decision.node_id is None:
                await self._mark_pending(w, wrev, inst, decision)
                continue
            placed.append(_Placed(w, wrev, inst, decision))
        # Many placements per transaction: one etcd revision (and one fsync) for up to
        # PLACEMENTS_PER_TXN of them instead of one each.
        for i in range(0, len(placed), PLACEMENTS_PER_TXN):
            await self._commit_slots.acquire()
            # In flight from here on (not before: if this pass fails part-way, _place_isolated
            # releases what it reserved for instances that never reached a commit).
            self._inflight.update(p.instance for p in placed[i : i + PLACEMENTS_PER_TXN])
            task = asyncio.create_task(self._commit_placements(placed[i : i + PLACEMENTS_PER_TXN]))
            self._commit_tasks.add(task)
            task.add_done_callback(self._commit_tasks.discard)

    async def _mark_pending(self, w: Workload, wrev: int, inst: str, decision: pl.Decision) -> None:
        reason = decision.explain()
        st = self.state.statuses.get(inst)
        prev = st.value if st else None
        if prev is not None and prev.phase == Phase.PENDING and prev.message == reason:
            return
        status = WorkloadStatus(
            phase=Phase.PENDING, reason="Unschedulable", message=reason, placement=_placement_doc(decision, reason),
            volume_node=prev.volume_node if prev else "", updated_at=time.time(),
        )
        await self.state.commit([Compare(keys.workload(w.id), wrev)], [Put(keys.status(inst), status.to_json())])
        self.emit("WorkloadPending", f"workload/{w.id}", f"{inst}: {reason}" if inst != w.id else reason,
                  "Unschedulable")

    def _placement_ops(self, p: _Placed) -> tuple[list[Compare], list[Put | Delete]]:
        """The compares and puts that make one decision durable: its assignment (created only if
        absent, only while the workload is at the revision decided on) and its status."""
        node_id = p.decision.node_id
        assert node_id is not None
        w, inst, now = p.workload, p.instance, time.time()
        st = self.state.statuses.get(inst)
        assignment = Assignment(
            workload_id=inst, node_id=node_id, revision=w.revision, generation=w.generation,
            desired_state=w.spec.desired_state, cpu_millicores=w.spec.resources.cpu_millicores,
            memory_mb=w.spec.resources.memory_mb, disk_mb=w.spec.resources.disk_mb, created_at=now,
        )
        volume_node = (st.value.volume_node if st else "") or (node_id if has_local_volumes(w) else "")
        p.moved_from = st.value.relocating_from if st else ""
        p.explanation = p.decision.explain()
        status = WorkloadStatus(
            phase=Phase.SCHEDULED, node_id=node_id, reason="Scheduled", message=p.explanation,
            placement=_placement_doc(p.decision, p.explanation), volume_node=volume_node,
            relocating_from=p.moved_from, updated_at=now,
        )
        akey = keys.assignment(node_id, inst)
        return ([Compare(keys.workload(w.id), p.wrev), Compare(akey, 0)],
                [put_doc(akey, assignment), put_doc(keys.status(inst), status)])

    async def _commit_placements(self, batch: list[_Placed]) -> None:
        """Commit a batch of decisions in one transaction (if a guard fails because a workload
        changed meanwhile, the others still land: see group_commit)."""
        landed: list[_Placed] = []
        broken: list[tuple[_Placed, Exception]] = []
        try:
            units, built = [], []
            for p in batch:
                try:  # one placement whose documents cannot be built must not hold back the rest
                    units.append(Unit(*self._placement_ops(p)))
                    built.append(p)
                except Exception as err:
                    broken.append((p, err))
            oks = await commit_units(self.state.commit, units)
            landed = [p for p, ok in zip(built, oks, strict=True) if ok]
        except Exception as err:
            log.warning("committing %d placements failed: %s", len(batch), err)
        finally:
            for p in batch:
                self._inflight.discard(p.instance)
            self._commit_slots.release()
        for p in landed:
            wid, inst = p.workload.id, p.instance
            self.emit("WorkloadScheduled", f"workload/{wid}", f"{inst}: {p.explanation}" if inst != wid
                      else p.explanation, "Scheduled")
            if p.moved_from:
                self.emit("Relocated", f"workload/{wid}", f"{inst}: {p.moved_from} -> {p.decision.node_id}",
                          "Relocated")
        done = {p.instance for p in landed}
        for p, failure in broken:
            done.add(p.instance)
            self.placement.release(p.instance)
            await self._mark_failed(p.workload.id, [p.instance], failures.INTERNAL_ERROR, failure)
        for p in batch:
            if p.instance not in done:
                self.placement.release(p.instance)
                self._enqueue(p.workload.id)  # lost a race with a concurrent change, or the store failed

    async def _sync_assignment(self, w: Workload, inst: str, node_id: str) -> None:
        cur = self.state.assignments.get(node_id, {}).get(inst)
        if cur is None:
            return
        a = cur.value
        if a.revision == w.revision and a.desired_state == w.spec.desired_state:
            return
        updated = a.model_copy(
            update={
                "revision": w.revision, "generation": w.generation, "desired_state": w.spec.desired_state,
                "cpu_millicores": w.spec.resources.cpu_millicores, "memory_mb": w.spec.resources.memory_mb,
                "disk_mb": w.spec.resources.disk_mb,
            }
        )
        akey = keys.assignment(node_id, inst)
        if not await self.state.commit([Compare(akey, cur.mod_revision)], [Put(akey, updated.to_json())]):
            self._enqueue(w.id)

    # ------------------------------------------------------------------ agent API

    async def register(self, node: Node) -> None:
        self.require_owner(node.id)
        self._require_normal()
        now = time.time()
        key = keys.node(node.id)
        for _ in range(10):
            cur = self.state.nodes.get(node.id)
            merged = node.model_copy(
                update={
                    "status": NodeStatus.READY,
                    "status_reason": "Registered",
                    "registered_at": cur.value.registered_at if cur else now,
                    "cordoned": cur.value.cordoned if cur else False,
                    "draining": cur.value.draining if cur else False,
                    "drain_deadline": cur.value.drain_deadline if cur else 0.0,
                    "admin_labels": cur.value.admin_labels if cur else {},
                    "admin_taints": cur.value.admin_taints if cur else [],
                    "last_heartbeat": 0.0,
                }
            )
            self.live[node.id] = self.live.get(node.id) or LiveNode(self.clock(), now)
            self.live[node.id].last_heartbeat = self.live[node.id].heard_at = self.clock()
            if cur is not None and _same_node(cur.value, merged):
                break
            if await self.state.commit([Compare(key, cur.mod_revision if cur else 0)], [Put(key, merged.to_json())],
                                       fenced="node"):
                self.emit("NodeJoined" if cur is None else "NodeRegistered", f"node/{node.id}",
                          f"runtimes: {', '.join(sorted(node.capabilities.runtimes)) or 'none'}")
                break
            await self._refresh(key)
        self._enqueue_pending()

    def heartbeat(self, node_id: str, usage: NodeUsage) -> bool:
        """Record liveness in memory. False when the node is unknown and must register."""
        self.require_owner(node_id)
        if node_id not in self.state.nodes:
            return False
        live = self.live.setdefault(node_id, LiveNode(self.clock(), time.time()))
        live.last_heartbeat = live.heard_at = self.clock()
        live.last_heartbeat_wall = time.time()
        live.usage = usage
        return True

    async def report(self, node_id: str, reports: list[WorkloadReport], complete: bool) -> None:
        self.require_owner(node_id)
        live = self.live.setdefault(node_id, LiveNode(self.clock(), time.time()))
        live.last_heartbeat = live.heard_at = self.clock()
        gone: set[str] = set()
        listed = {r.workload_id for r in reports}
        if complete:
            gone = live.present - listed
            live.present = listed
            live.reported = True
            for inst in gone:
                self._enqueue(workload_of(inst))
        else:
            # A partial report (what changed) lists instances the agent has: they count as
            # present, so that their absence from a later complete report is noticed.
            live.present |= listed
        if self.guard.mode != Mode.NORMAL:
            return  # frozen: statuses are not written; usage and presence above are still kept
        await self._confirm_left(node_id, gone)
        drifts = self._track_drift(node_id, reports, None if complete else listed)
        changes: list[tuple[str, int, WorkloadStatus, WorkloadStatus]] = []
        for r in reports:
            if self.state.placement_of.get(r.workload_id) != node_id:
                continue  # a copy we did not ask this node to run: the agent removes it
            if r.usage is not None and r.usage.measured:
                self.usage[r.workload_id] = r.usage
            else:
                self.usage.pop(r.workload_id, None)  # nothing measured: not worth a record per instance
            change = self._status_change(node_id, r, drifts.get(r.workload_id))
            if change is not None:
                changes.append(change)
        # Concurrent reports from many nodes share transactions; each change is still guarded by
        # the status revision it was computed from.
        oks = await self._status_writes.submit([
            ([Compare(keys.status(inst), rev)], [put_doc(keys.status(inst), new)])
            for inst, rev, _, new in changes])
        for (inst, _, prev, new), ok in zip(changes, oks, strict=True):
            if ok and new.phase != prev.phase:
                kind = {Phase.RUNNING: "WorkloadRunning", Phase.FAILED: "WorkloadFailed",
                        Phase.STOPPED: "WorkloadStopped"}.get(new.phase, "WorkloadStatus")
                wid = workload_of(inst)
                prefix = f"{inst}: " if inst != wid else ""
                self.emit(kind, f"workload/{wid}", prefix + (new.message or f"{new.phase} on {node_id}"),
                          new.reason)

    async def _confirm_left(self, node_id: str, gone: set[str]) -> None:
        """Record that a node's agent no longer runs instances withdrawn from it, so whichever
        replica places them (or finalises their deletion) knows without owning this node."""
        for inst in gone:
            st = self.state.statuses.get(inst)
            if st is None or self.state.placement_of.get(inst) == node_id or st.value.left_node == node_id:
                continue
            new = st.value.model_copy(update={"left_node": node_id})
            key = keys.status(inst)
            await self.state.commit([Compare(key, st.mod_revision)], [Put(key, new.to_json())], fenced="node")

    def _runs_on(self, inst: str, node_id: str) -> bool:
        """Whether `node_id`'s agent still runs `inst`, as far as this replica can tell."""
        node = self.state.nodes.get(node_id)
        if node is None or node.value.status != NodeStatus.READY:
            return False  # lost or gone: nothing to wait for
        live = self.live.get(node_id)
        if self.owns(node_id) and live is not None and live.reported:
            return inst in live.present
        st = self.state.statuses.get(inst)
        return st is not None and st.value.left_node != node_id

    def _track_drift(self, node_id: str, reports: list[WorkloadReport],
                     listed: set[str] | None) -> dict[str, dict[str, Any]]:
        """Find drift on one node; publish what is new or resolved. Returns instance -> record.
        `listed`: the instances a partial report names (None: the report is complete)."""
        workloads = self.state.workloads

        def policy(inst: str) -> RestartPolicy | None:
            w = workloads.get(workload_of(inst))
            return w.value.spec.restart_policy if w else None

        found = detect(
            node_id, {i: a.value for i, a in self.state.assignments.get(node_id, {}).items()},
            [Reported(r.workload_id, r.revision, r.phase, r.terminal) for r in reports], listed is None,
            self.state.placement_of.get, policy, time.time(),
        )
        known = self._drift.setdefault(node_id, {})
        now_keys = {d.key(): d for d in found}
        for k, d in now_keys.items():
            if k not in known:
                known[k] = (d, time.time())
                self.emit("DriftDetected", f"workload/{workload_of(d.instance)}",
                          f"{d.instance} on {node_id}: {d.kind}: {d.rule}; remediation: {d.action}", d.kind)
                if d.kind == "missing":
                    self._resync.add(node_id)  # remediation: send the whole desired state again
                    self._wake_node(node_id)
        # A partial report (only what changed) says nothing about the instances it does not
        # list, so only theirs can be resolved by it.
        for k in [k for k, (d, _) in known.items() if k not in now_keys
                  and (listed is None or d.instance in listed)]:
            d, _ = known.pop(k)
            self.emit("DriftResolved", f"workload/{workload_of(d.instance)}", f"{d.instance} on {node_id}: {d.kind}",
                      d.kind)
        return {d.instance: {"kind": d.kind, "rule": d.rule, "action": d.action, "since": since}
                for d, since in known.values()}

    def _status_change(
        self, node_id: str, r: WorkloadReport, drift: dict[str, Any] | None = None
    ) -> tuple[str, int, WorkloadStatus, WorkloadStatus] | None:
        st = self.state.statuses.get(r.workload_id)
        w = self.state.workloads.get(workload_of(r.workload_id))
        if st is None or w is None or w.value.deleting:
            return None
        prev = st.value
        if r.revision != w.value.revision and r.phase == Phase.RUNNING:
            phase, reason = Phase.SCHEDULED, "Updating"  # the old revision still runs
        else:
            phase, reason = r.phase, r.reason
        message = r.message
        if r.terminal and message:
            message += " (terminal: not retried until a new revision is applied)"
        drift = drift or {}
        if (prev.phase, prev.reason, prev.message, prev.observed_revision, prev.runtime_id, prev.restarts,
                prev.drift) == (phase, reason, message, r.revision, r.runtime_id, r.restarts, drift):
            return None
        new = prev.model_copy(
            update={
                "phase": phase, "reason": reason, "message": message, "node_id": node_id,
                "observed_revision": r.revision, "runtime_id": r.runtime_id, "restarts": r.restarts,
                "updated_at": time.time(),
                # A moved instance has arrived once it runs on its new node.
                "relocating_from": "" if phase == Phase.RUNNING else prev.relocating_from,
                "drift": drift,
            }
        )
        return r.workload_id, st.mod_revision, prev, new

    def spec_json(self, wid: str) -> bytes | None:
        """A workload's spec as sent to agents, serialised once per revision for its replicas and
        for full resends (an agent reconnecting, a resync). Kept for recent revisions only:
        desired state goes out as deltas, so most specs are sent once, and a cache of every
        workload's spec would be tens of megabytes at 50,000 workloads."""
        cur = self.state.workloads.get(wid)
        if cur is None:
            refused = self.state.refused.get(wid)  # agents keep running what they already run
            return refused.value.spec_json() if refused is not None else None
        key = (wid, cur.value.revision)
        cached = self._spec_cache.get(key)
        if cached is None:
            if len(self._spec_cache) >= SPEC_CACHE_ENTRIES:
                self._spec_cache.clear()
            cached = self._spec_cache[key] = cur.value.spec.to_json()
        return cached

    def take_resync(self, node_id: str) -> bool:
        """Whether the node's stream should send its full desired set next (asked once)."""
        if node_id in self._resync:
            self._resync.discard(node_id)
            return True
        return False

    async def desired_stream(self, node_id: str) -> AsyncIterator[list[Assignment]]:
        """Full desired state for `node_id`, again after every change to it."""
        ev = self._node_changed.setdefault(node_id, asyncio.Event())
        while True:
            self.require_owner(node_id)  # after a handoff the stream ends; the agent finds the new owner
            ev.clear()
            yield [a.value for a in self.state.assignments.get(node_id, {}).values()]
            await ev.wait()

    async def _check_nodes(self) -> None:
        """Judge the nodes this replica is responsible for (a pure decision, liveness.judge) and
        record the transitions: NotReady nodes' instances are relocated."""
        since, grace = self._started_at, self.config.node_grace_seconds
        nodes: dict[str, Versioned[Node]] = {}
        heard: dict[str, float] = {}
        grace_from: dict[str, float] = {}
        for k, (node_id, cur) in enumerate(list(self.state.nodes.items())):
            if k % 256 == 255:
                await asyncio.sleep(0)  # thousands of nodes: never hold up the loop for long
            if not self.owns(node_id):
                continue  # another replica judges this node
            nodes[node_id] = cur
            live = self.live.get(node_id)
            if live is None:
                continue
            if live.heard_at >= since:
                heard[node_id] = live.last_heartbeat  # includes time our event loop stalled
            elif live.last_heartbeat > since:
                grace_from[node_id] = live.last_heartbeat  # a fresh grace period (handoff, stall)
        now = self.clock()
        verdict = judge({n: c.value.status for n, c in nodes.items()}, heard, now, since, grace,
                        self.liveness_guard, self._guard_config(), grace_from)
        self.liveness_guard = verdict.guard
        for ev in verdict.events:
            self.emit(ev.kind, "cluster", ev.message, ev.reason)
        for t in verdict.transitions:
            cur = nodes[t.node_id]
            status = NodeStatus.READY if t.ready else NodeStatus.NOT_READY
            updated = cur.value.model_copy(update={"status": status, "status_reason": t.reason})
            ok = await self.state.commit([Compare(keys.node(t.node_id), cur.mod_revision)],
                                         [Put(keys.node(t.node_id), updated.to_json())], fenced="node")
            if ok:
                self.emit("NodeReady" if t.ready else "NodeNotReady", f"node/{t.node_id}", t.reason)
                if t.ready:
                    self._pending_dirty = True  # coalesced: one pass over workloads per monitor tick
                else:
                    self._enqueue_node_workloads(t.node_id)

    def _guard_config(self) -> GuardConfig:
        return GuardConfig(max_lost_fraction=self.config.max_lost_fraction,
                           min_nodes=self.config.liveness_guard_min_nodes,
                           max_seconds=self.config.liveness_suspension_seconds
                           if self.config.liveness_suspension_seconds is not None
                           else 6 * self.config.node_grace_seconds)

    def liveness_view(self) -> dict[str, Any]:
        """The mass-loss guard as health shows it (times as wall-clock seconds)."""
        g = self.liveness_guard
        to_wall = time.time() - self.clock()
        return {
            "suspended": g.suspended,
            "since": g.suspended_since + to_wall if g.suspended_since is not None else 0.0,
            "endsAt": g.ends_at + to_wall if g.suspended else 0.0,
            "reason": g.reason,
            "silentNodes": g.silent,
            "judgedNodes": g.judged,
        }

    def resume_liveness(self, via: str) -> dict[str, Any]:
        """An operator ends this replica's liveness suspension (idempotent): silent nodes are
        judged one by one from the next check."""
        was = self.liveness_guard.suspended
        self.liveness_guard, event = end_suspension(self.liveness_guard, via)
        if event is not None:
            self.emit(event.kind, "cluster", event.message, event.reason)
        return {"replicaId": self.election.replica_id, "resumed": was, **self.liveness_view()}

    # ------------------------------------------------------------------ node operations

    async def update_node(self, node_id: str, change: Callable[[Node], Node]) -> Node:
        """Apply an operator's change to a node document (compare-and-swap, any replica)."""
        node, _ = await self._cas_change(keys.node(node_id), f"node {node_id!r}",
                                         lambda: self.state.nodes.get(node_id), change)
        return node

    async def cordon(self, node_id: str, on: bool = True) -> Node:
        def change(n: Node) -> Node:
            n.cordoned = on
            if not on:
                n.draining, n.drain_deadline = False, 0.0
            return n

        node = await self.update_node(node_id, change)
        self.emit("NodeCordoned" if on else "NodeUncordoned", f"node/{node_id}", "by an operator")
        return node

    async def drain(self, node_id: str, deadline_seconds: float) -> Node:
        def change(n: Node) -> Node:
            n.cordoned, n.draining = True, True
            n.drain_deadline = time.time() + deadline_seconds if deadline_seconds > 0 else 0.0
            return n

        node = await self.update_node(node_id, change)
        self.emit("NodeDraining", f"node/{node_id}", f"{len(self.state.assignments.get(node_id, {}))} instances "
                  "to move")
        return node

    async def label(self, node_id: str, set_labels: dict[str, str], remove: list[str]) -> Node:
        def change(n: Node) -> Node:
            n.admin_labels = {k: v for k, v in {**n.admin_labels, **set_labels}.items() if k not in remove}
            return n

        return await self.update_node(node_id, change)

    async def taint(self, node_id: str, add: list[Taint], remove: list[str]) -> Node:
        """Add operator taints; `remove` holds keys or key:Effect to drop."""

        def dropped(t: Taint) -> bool:
            return t.key in remove or f"{t.key}:{t.effect}" in remove

        def change(n: Node) -> Node:
            kept = [t for t in n.admin_taints if not dropped(t) and (t.key, t.effect) not in
                    {(a.key, a.effect) for a in add}]
            n.admin_taints = kept + add
            return n

        return await self.update_node(node_id, change)

    async def delete_node(self, node_id: str, force: bool = False) -> dict[str, Any]:
        """Remove a node from the cluster (any replica; compare-and-swap). Refused while instances
        are assigned to it unless `force`, which first withdraws them (they are placed elsewhere,
        as off a lost node). An agent that registers again later joins as a new node."""
        self._require_normal()
        key = keys.node(node_id)
        withdrawn: set[str] = set()
        for _ in range(10):
            cur = self.state.nodes.get(node_id)
            if cur is None:
                raise NotFound(f"node {node_id!r}")
            assigned = dict(self.state.assignments.get(node_id, {}))
            if assigned and not force:
                names = ", ".join(sorted(assigned)[:5]) + (", ..." if len(assigned) > 5 else "")
                raise MutationRefused(
                    f"node {node_id} still has {len(assigned)} instance(s) assigned ({names}): drain it first "
                    f"(persysctl drain {node_id}), or delete it with --force to withdraw them and place them "
                    "elsewhere")
            units = [Unit(*self._withdraw_from_deleted(node_id, inst, a)) for inst, a in sorted(assigned.items())]
            oks = await commit_units(lambda c, o: self.state.commit(c, o, fenced=False), units)
            withdrawn |= {inst for inst, ok in zip(sorted(assigned), oks, strict=True) if ok}
            # The key goes once nothing is assigned any more, guarded by the revision judged.
            if all(oks) and await self.state.commit([Compare(key, cur.mod_revision)], [Delete(key)], fenced=False):
                self.live.pop(node_id, None)
                self._drift.pop(node_id, None)
                self._enqueue_pending()  # what waited for this node to stop it is placed now
                self.emit("NodeDeleted", f"node/{node_id}", "deleted by an operator" + (
                    f"; {len(withdrawn)} instance(s) withdrawn to be placed elsewhere" if withdrawn else ""),
                    "Forced" if withdrawn else "Deleted")
                return {"node": node_id, "deleted": True, "withdrawn": sorted(withdrawn)}
            await self._refresh(key)
        raise MutationRefused(f"node {node_id!r} is being changed concurrently; try again")

    def _withdraw_from_deleted(self, node_id: str, inst: str, a: Versioned[Assignment]
                               ) -> tuple[list[Compare], list[Put | Delete]]:
        """Withdraw one instance from a node being deleted: it is placed elsewhere once its
        status no longer points at a node that runs it (the node is gone: nothing to wait for)."""
        akey = keys.assignment(node_id, inst)
        st = self.state.statuses.get(inst)
        prev = st.value if st else WorkloadStatus()
        new = prev.model_copy(update={
            "phase": Phase.PENDING, "reason": "Relocating", "relocating_from": node_id, "left_node": "",
            "message": f"node {node_id} was deleted by an operator; moving it elsewhere", "updated_at": time.time(),
        })
        return [Compare(akey, a.mod_revision)], [Delete(akey), Put(keys.status(inst), new.to_json())]

    def drain_status(self, node_id: str) -> dict[str, Any]:
        cur = self.state.nodes.get(node_id)
        if cur is None:
            raise NotFound(f"node {node_id!r}")
        live = self.live.get(node_id)
        on_node = set(self.state.assignments.get(node_id, {})) | (live.present if live else set())
        on_node = {i for i in on_node if workload_of(i) in self.state.workloads}
        blocked, remaining = [], []
        for inst in sorted(on_node):
            w = self.state.workloads[workload_of(inst)].value
            st = self.state.statuses.get(inst)
            if has_local_volumes(w) and inst in self.state.assignments.get(node_id, {}):
                blocked.append({"instance": inst, "reason": f"its node-local volume lives on {node_id}"})
            else:
                remaining.append({"instance": inst, "phase": str(st.value.phase) if st else ""})
        moving = []
        for inst, st in self.state.statuses.items():
            if st.value.relocating_from == node_id and inst not in on_node:
                moving.append({"instance": inst, "phase": str(st.value.phase),
                               "node": self.state.placement_of.get(inst, ""), "message": st.value.message})
        n = cur.value
        done = n.draining and not remaining and not moving and not blocked
        return {
            "node": node_id, "draining": n.draining, "cordoned": n.cordoned, "deadline": n.drain_deadline,
            "remaining": remaining, "moving": sorted(moving, key=lambda m: m["instance"]), "blocked": blocked,
            "done": done,
        }

    # ------------------------------------------------------------------ backup, restore, recover

    async def backup(self) -> dict[str, Any]:
        """Every durable key, read at one store revision."""
        doc: dict[str, Any] = json.loads(await self.backup_json())
        return doc

    async def backup_json(self) -> bytes:
        """`backup()` as JSON."""
        return b"".join([chunk async for chunk in self._backup_chunks()])

    async def _backup_chunks(self) -> AsyncIterator[bytes]:
        """A persys-backup/v1 document in pieces, assembled from the stored bytes a page of keys
        at a time: nothing is decoded or re-encoded (every value is a JSON document already),
        a large cluster's backup never sits in memory whole, and no step holds the event loop
        for more than about a millisecond."""
        def assemble(kvs: list[KeyValue], first: bool) -> bytes:
            items = [b'{"key":%s,"value":%s}' % (json.dumps(kv.key).encode(), kv.value)
                     for kv in kvs if not keys.is_ephemeral(kv.key)]
            return (b"" if first or not items else b",") + b",".join(items)

        first = True
        async for kvs, revision in self.store.range_pages(keys.ROOT):
            if first:
                head = json.dumps({"format": BACKUP_FORMAT, "createdAt": time.time(), "revision": revision,
                                   "clusterId": self.guard.cluster_id})
                yield head[:-1].encode() + b',"items":['
            # A page takes about a millisecond to assemble: done here between other work rather
            # than in a thread, whose contention for the interpreter lock would delay the loop
            # by up to a switch interval (5 ms) at a time.
            chunk = assemble(kvs, first)
            first = first and not chunk
            yield chunk
            await asyncio.sleep(0)
        yield b"]}"

    async def _write_local_backup(self) -> None:
        assert self.config.data_dir is not None
        if self.state.cluster_marker is None:
            return  # never overwrite a good backup with a wiped store's
        target = self.config.data_dir / "backups" / "latest.json"
        tmp = target.with_suffix(".tmp")
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            async for chunk in self._backup_chunks():
                await asyncio.to_thread(f.write, chunk)
        await asyncio.to_thread(tmp.replace, target)  # atomic: a crash never leaves half a backup

    def local_backup(self) -> dict[str, Any]:
        path = self.config.data_dir / "backups" / "latest.json" if self.config.data_dir else None
        if path is None or not path.exists():
            raise NotFound("local backup (this scheduler has no data directory or has not written one yet)")
        return json.loads(path.read_text())

    async def restore(self, doc: dict[str, Any], force: bool = False) -> dict[str, Any]:
        """Write a backup back into the store and resume. Only in recovery unless forced."""
        if self.guard.mode == Mode.DEGRADED:
            raise Frozen("cannot restore while the state store is unreachable")
        if self.guard.mode != Mode.RECOVERY and not force:
            raise MutationRefused("the control plane is not in recovery; restoring would overwrite live state "
                                  "(use --force to do it anyway)")
        if doc.get("format") != BACKUP_FORMAT or not isinstance(doc.get("items"), list):
            raise ValueError(f"not a Persys backup (expected format {BACKUP_FORMAT!r})")
        items = [(str(i["key"]), json.dumps(i["value"]).encode()) for i in doc["items"]
                 if not keys.is_ephemeral(str(i["key"]))]
        if any(not k.startswith(keys.ROOT) for k, _ in items):
            raise ValueError(f"backup holds keys outside {keys.ROOT}")
        marker = next((v for k, v in items if k == keys.CLUSTER), None)
        if marker is None:
            raise ValueError("backup holds no cluster marker")
        # The marker goes last: a restore interrupted half-way is still recognised as incomplete.
        ops: list[Put | Delete] = [Put(k, v) for k, v in items if k != keys.CLUSTER]
        for chunk in _chunks(ops, TXN_MAX_OPS):
            await self.store.txn([], chunk)
        await self.store.put(keys.CLUSTER, marker)
        self.guard.remember(str(json.loads(marker)["id"]))
        await self.state.reset()
        self.guard.set(Mode.NORMAL)
        self.emit("Restored", "cluster", f"{len(items)} keys restored (backup of revision {doc.get('revision')})")
        return {"restored": len(items), "clusterId": self.guard.cluster_id}

    async def recover(self) -> dict[str, Any]:
        """The operator confirms that the state store's empty state is the truth."""
        if self.guard.mode != Mode.RECOVERY:
            raise MutationRefused("the control plane is not in recovery; nothing to confirm")
        marker = await self.guard.create_marker()
        await self.state.reset()
        self.guard.set(Mode.NORMAL)
        self.emit("Recovered", "cluster", "operator confirmed the current state store contents")
        return {"clusterId": marker["id"], "workloads": len(self.state.workloads)}

    # ------------------------------------------------------------------ views

    def _instance_view(self, inst: str) -> dict[str, Any]:
        st = self.state.statuses.get(inst)
        status = st.value if st else WorkloadStatus(reason="Scheduling")
        usage = self.usage.get(inst) if status.phase == Phase.RUNNING else None
        return {
            "instance": inst,
            "node": self.state.placement_of.get(inst) or status.node_id,
            "phase": str(status.phase),
            "reason": status.reason,
            "message": status.message,
            "observedRevision": status.observed_revision,
            "runtimeId": status.runtime_id,
            "restarts": status.restarts,
            "usage": (usage or WorkloadUsage()).to_doc(),
            "placement": placement_view(status.placement),
            "drift": status.drift,
            "updatedAt": status.updated_at,
        }

    def workload_view(self, wid: str, summary: bool = False) -> dict[str, Any]:
        cur = self.state.workloads.get(wid)
        if cur is None and wid in self.state.refused:
            known = sorted(set(self.state.instances.get(wid, ())) | {wid}, key=index_of)
            return quarantine.refused_view(self.state.refused[wid].value, [self._instance_view(i) for i in known])
        if cur is None:
            raise NotFound(f"workload {wid!r}")
        w = cur.value
        wanted = [instance_id(wid, i) for i in range(w.spec.replicas)]
        extra = sorted(set(self.state.instances.get(wid, ())) - set(wanted), key=index_of)
        instances = [self._instance_view(i) for i in wanted + extra]
        first = instances[0]
        # The workload shows its first replica that is not Running (the one worth looking at).
        focus = next((i for i in instances if i["phase"] != "Running"), first)
        running = sum(1 for i in instances[: len(wanted)] if i["phase"] == "Running")
        phase = "Running" if running == len(wanted) else focus["phase"]
        return {
            "id": w.id,
            "name": w.name,
            "type": w.spec.type,
            "labels": w.labels,
            "desiredState": "Deleted" if w.deleting else str(w.spec.desired_state),
            "revision": w.revision,
            "generation": w.generation,
            "replicas": w.spec.replicas,
            "ready": f"{running}/{len(wanted)}",
            "phase": phase,
            "node": first["node"],
            "nodes": sorted({i["node"] for i in instances if i["node"]}),
            "reason": focus["reason"],
            "message": focus["message"],
            "observedRevision": first["observedRevision"],
            "runtimeId": first["runtimeId"],
            "restarts": sum(i["restarts"] for i in instances),
            "usage": {
                "cpuPercent": round(sum(i["usage"]["cpuPercent"] for i in instances), 3),
                **{k: sum(i["usage"][k] for i in instances)
                   for k in ("memoryBytes", "diskReadBytes", "diskWriteBytes", "netRxBytes", "netTxBytes")},
            },
            "placement": focus["placement"],
            "drift": [{"instance": i["instance"], **i["drift"]} for i in instances if i["drift"]],
            "instances": instances,
            "createdAt": w.created_at,
            "updatedAt": max([w.updated_at] + [i["updatedAt"] for i in instances]),
            # Lists leave the spec out: specs may be large, and a page of them would be pages.
            **({} if summary else {"spec": w.spec.to_doc()}),
        }

    def workload_page(self, after: str, limit: int, node_id: str = "") -> Page:
        """Workload summaries (views without the spec: `workload_view` has it) after `after` in
        id order, as JSON; with `node_id`, only workloads with an instance there."""

        def render(wid: str) -> bytes | None:
            if wid not in self.state.workloads:
                return None
            view = self.workload_view(wid, summary=True)
            return None if node_id and node_id not in view["nodes"] else _page_json(view)

        return take_page(self.sorted_workloads.after(after), render, limit)

    def node_view(self, node_id: str) -> dict[str, Any]:
        cur = self.state.nodes.get(node_id)
        if cur is None:
            raise NotFound(f"node {node_id!r}")
        doc = cur.value.to_doc()
        doc["labels"] = cur.value.effective_labels()
        doc["taints"] = [t.to_doc() for t in cur.value.effective_taints()]
        live = self.live.get(node_id)
        if live is not None:
            doc["lastHeartbeat"] = live.last_heartbeat_wall
            doc["usage"] = live.usage.to_doc()
        assigned = [a.value for a in self.state.assignments.get(node_id, {}).values()]
        doc["allocated"] = {
            "cpuMillicores": sum(a.cpu_millicores for a in assigned),
            "memoryMb": sum(a.memory_mb for a in assigned),
            "diskMb": sum(a.disk_mb for a in assigned),
            "workloads": len(assigned),
        }
        doc["workloads"] = sorted(a.workload_id for a in assigned)  # instance ids
        return doc

    def node_page(self, after: str, limit: int) -> Page:
        """Node views after `after` in id order, as JSON."""
        return take_page(self.sorted_nodes.after(after),
                         lambda n: _page_json(self.node_view(n)) if n in self.state.nodes else None, limit)

    async def health(self) -> dict[str, Any]:
        store_ok, detail = True, ""
        try:
            st = await self.store.status()
            backend = str(st.get("backend", ""))
            revision = st.get("revision", 0)
            self.state.observe_store_revision(revision if isinstance(revision, int) else 0, self.clock())
        except Exception as err:
            store_ok, backend, detail = False, "", f"store: {err}"
        mirror = self.state.health(self.clock())
        if mirror.detail:
            detail = (detail + "; " if detail else "") + mirror.detail
        if self.catching_up:
            detail = (detail + "; " if detail else "") + (
                f"elected, catching up with the store (mirror at revision {self.state.revision}, needs "
                f"{self.election.fence_revision}): agents are asked to retry")
        events_ok = await self.events.healthy()
        if not events_ok:
            detail = (detail + "; " if detail else "") + "events: backend unreachable, events are being dropped"
        losses = self.outbox.ledger.health()
        if self.guard.mode != Mode.NORMAL:
            detail = (detail + "; " if detail else "") + self.guard.reason
        liveness = self.liveness_view()
        if liveness["suspended"]:
            detail = (detail + "; " if detail else "") + (
                f"liveness suspended: {liveness['silentNodes']} of {liveness['judgedNodes']} nodes silent "
                f"({liveness['reason']}), ends in {max(0.0, liveness['endsAt'] - time.time()):.0f}s at the latest "
                "(persysctl admin liveness resume ends it now)")
        mode = self.mode
        worker = self.worker_watch.problem(any(not t.done() for t in self._active_tasks), self.is_active,
                                           self.clock())
        if worker:
            # Scheduling is (or just was) stopped: not normal, whatever the store says.
            mode = str(Mode.DEGRADED) if mode == str(Mode.NORMAL) else mode
            detail = (detail + "; " if detail else "") + worker
        if self.state.refused:
            names = sorted(self.state.refused)
            detail = (detail + "; " if detail else "") + (
                f"{len(names)} stored workload(s) refused by the model and not scheduled: {', '.join(names[:5])}"
                + (", ..." if len(names) > 5 else ""))
        return {
            "replicaId": self.election.replica_id,
            "active": self.is_active,
            "role": "active" if self.is_active else "catching-up" if self.catching_up else "standby",
            "leader": self.leader_address(),
            "electedAt": self.elected_at_wall,
            "sharded": self.config.sharded,
            "ownedNodes": sum(1 for n in self.state.nodes if self.owns(n)),
            "mode": mode,
            "storeOk": store_ok,
            "eventsOk": events_ok,
            "storeBackend": backend,
            "nodesReady": sum(1 for n in self.state.nodes.values() if n.value.status == NodeStatus.READY),
            "workloads": len(self.state.workloads),
            "detail": detail,
            "decisionLatency": self.placement.decision_latency(),
            **losses,
            "mirror": {"revision": self.state.revision, "storeRevision": self.state.lag.store_revision,
                       "lag": mirror.lag, "watch": mirror.watch,
                       "compactionRecoveries": self.state.compaction_recoveries},
            "liveness": liveness,
        }


def _same_node(a: Node, b: Node) -> bool:
    ignore = {"last_heartbeat", "usage", "status_reason"}
    return a.model_dump(exclude=ignore) == b.model_dump(exclude=ignore)


__all__ = ["DesiredState", "MutationRefused", "NotFound", "Scheduler", "SchedulerConfig", "WorkloadReport"]
