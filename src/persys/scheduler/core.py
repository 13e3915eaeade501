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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from persys.events.base import ClusterEvent, EventBus
from persys.model import (
    Assignment,
    DesiredState,
    Node,
    NodeStatus,
    NodeUsage,
    Phase,
    Workload,
    WorkloadManifest,
    WorkloadStatus,
    WorkloadUsage,
)
from persys.scheduler import keys
from persys.scheduler.placement_adapter import PlacementService
from persys.scheduler.state import ClusterState
from persys.store.base import Compare, Delete, Put, StateStore, StoreUnavailable

log = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    node_grace_seconds: float = 15.0  # without heartbeats before a node is NotReady
    heartbeat_interval_seconds: float = 3.0
    report_interval_seconds: float = 2.0
    pending_retry_seconds: float = 5.0
    monitor_interval_seconds: float = 1.0


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
    cpu_percent: float = 0.0
    memory_bytes: int = 0


@dataclass
class LiveNode:
    """Per-node facts kept only in memory: heartbeats never touch the store."""

    last_heartbeat: float  # monotonic
    last_heartbeat_wall: float
    usage: NodeUsage = field(default_factory=NodeUsage)
    present: set[str] = field(default_factory=set)  # workloads in the last complete report
    reported: bool = False


class MutationRefused(Exception):
    """The control plane cannot accept a change right now (store unreachable, ...)."""


class NotFound(KeyError):
    pass


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        events: EventBus,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.events = events
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.state = ClusterState(store)
        self.placement = PlacementService(self.state)
        self.live: dict[str, LiveNode] = {}
        self.usage: dict[str, WorkloadUsage] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._node_changed: dict[str, asyncio.Event] = {}
        self._event_q: asyncio.Queue[ClusterEvent] = asyncio.Queue(maxsize=10_000)
        self._tasks: list[asyncio.Task[Any]] = []
        self._started_at = clock()
        self.mode = "normal"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.state.load()
        if self.state.cluster_marker is None:
            marker = json.dumps({"created_at": time.time()}).encode()
            await self.state.commit([Compare(keys.CLUSTER, 0)], [Put(keys.CLUSTER, marker)])
        self.state.subscribe(self._on_change)
        self.state.start_following()
        self._started_at = self.clock()
        for wid in list(self.state.workloads):
            self._enqueue(wid)
        self._tasks = [
            asyncio.create_task(self._worker(), name="reconcile-worker"),
            asyncio.create_task(self._monitor(), name="node-monitor"),
            asyncio.create_task(self._publisher(), name="event-publisher"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.state.stop()

    # ------------------------------------------------------------------ events

    def emit(self, kind: str, subject: str, message: str, reason: str = "") -> None:
        try:
            self._event_q.put_nowait(ClusterEvent(kind=kind, subject=subject, message=message, reason=reason))
        except asyncio.QueueFull:  # events are observability: dropping beats blocking scheduling
            pass

    async def _publisher(self) -> None:
        while True:
            ev = await self._event_q.get()
            try:
                await self.events.publish(ev)
            except Exception as err:
                log.debug("event dropped: %s", err)

    # ------------------------------------------------------------------ change routing

    def _on_change(self, kind: str, ident: str) -> None:
        if kind == "assignment":
            node_id, _, wid = ident.partition("/")
            self._wake_node(node_id)
            self._enqueue(wid)
        elif kind in ("workload", "status"):
            self._enqueue(ident)
        elif kind == "node":
            self._wake_node(ident)

    def _wake_node(self, node_id: str) -> None:
        ev = self._node_changed.get(node_id)
        if ev is not None:
            ev.set()

    def _enqueue(self, wid: str) -> None:
        if wid not in self._queued:
            self._queued.add(wid)
            self._queue.put_nowait(wid)

    def _enqueue_pending(self) -> None:
        for wid, st in self.state.statuses.items():
            if st.value.phase == Phase.PENDING:
                self._enqueue(wid)

    async def _worker(self) -> None:
        while True:
            wid = await self._queue.get()
            self._queued.discard(wid)
            try:
                await self._reconcile(wid)
            except StoreUnavailable as err:
                log.warning("store unavailable while reconciling %s: %s", wid, err)
                await asyncio.sleep(1.0)
                self._enqueue(wid)
            except Exception:
                log.exception("reconcile of %s failed", wid)

    async def _monitor(self) -> None:
        last_retry = self.clock()
        while True:
            await asyncio.sleep(self.config.monitor_interval_seconds)
            try:
                await self._check_nodes()
                if self.clock() - last_retry >= self.config.pending_retry_seconds:
                    last_retry = self.clock()
                    self._enqueue_pending()
            except StoreUnavailable as err:
                log.warning("node monitor: store unavailable: %s", err)
            except Exception:
                log.exception("node monitor failed")

    # ------------------------------------------------------------------ client API

    async def apply(self, manifest: WorkloadManifest, dry_run: bool = False) -> tuple[Workload, bool, bool]:
        """Create or update a workload. Returns (workload, created, changed); idempotent."""
        now = time.time()
        incoming = Workload.from_manifest(manifest, now)
        key = keys.workload(incoming.id)
        for _ in range(10):
            current = self.state.workloads.get(incoming.id)
            if current is None:
                if dry_run:
                    return incoming, True, True
                status = WorkloadStatus(phase=Phase.PENDING, reason="Scheduling", updated_at=now)
                ok = await self.state.commit(
                    [Compare(key, 0)],
                    [Put(key, incoming.to_json()), Put(keys.status(incoming.id), status.to_json())],
                )
                if ok:
                    self.emit("WorkloadCreated", f"workload/{incoming.id}", f"revision {incoming.revision}")
                    return incoming, True, True
                await self._refresh(key)
                continue
            old = current.value
            if (old.revision == incoming.revision and old.labels == incoming.labels) and not old.deleting:
                return old, False, False
            updated = old.model_copy(
                update={
                    "spec": incoming.spec,
                    "labels": incoming.labels,
                    "revision": incoming.revision,
                    "generation": old.generation + (1 if old.revision != incoming.revision else 0),
                    "updated_at": now,
                    "deleting": False,
                }
            )
            if dry_run:
                return updated, False, True
            if await self.state.commit([Compare(key, current.mod_revision)], [Put(key, updated.to_json())]):
                self.emit("WorkloadUpdated", f"workload/{old.id}", f"revision {updated.revision}")
                return updated, False, True
            await self._refresh(key)
        raise MutationRefused(f"workload {incoming.id} is being changed concurrently; try again")

    async def delete(self, wid: str) -> tuple[bool, bool]:
        """Ask for a workload's removal. Returns (deleted, already_gone); idempotent."""
        key = keys.workload(wid)
        for _ in range(10):
            current = self.state.workloads.get(wid)
            if current is None:
                return False, True
            if current.value.deleting:
                return True, False
            marked = current.value.model_copy(update={"deleting": True, "updated_at": time.time()})
            if await self.state.commit([Compare(key, current.mod_revision)], [Put(key, marked.to_json())]):
                self.emit("WorkloadDeleting", f"workload/{wid}", "deletion requested")
                return True, False
            await self._refresh(key)
        raise MutationRefused(f"workload {wid} is being changed concurrently; try again")

    async def _refresh(self, key: str) -> None:
        """After a lost compare-and-swap, fold the winner's write into the mirror."""
        kv = await self.store.get(key)
        if kv is not None:
            self.state._apply_put(kv.key, kv.value, kv.mod_revision)

    # ------------------------------------------------------------------ reconcile one workload

    async def _reconcile(self, wid: str) -> None:
        w = self.state.workloads.get(wid)
        node_id = self.state.placement_of.get(wid)
        if w is None:
            await self._cleanup_orphans(wid, node_id)
            return
        if w.value.deleting:
            await self._reconcile_deletion(w.value, w.mod_revision, node_id)
            return
        if node_id is None:
            await self._place(w.value, w.mod_revision)
            return
        await self._sync_assignment(w.value, node_id)

    async def _cleanup_orphans(self, wid: str, node_id: str | None) -> None:
        ops: list[Put | Delete] = []
        if node_id is not None:
            ops.append(Delete(keys.assignment(node_id, wid)))
        if wid in self.state.statuses:
            ops.append(Delete(keys.status(wid)))
        if ops:
            await self.state.commit([], ops)

    async def _reconcile_deletion(self, w: Workload, wrev: int, node_id: str | None) -> None:
        st = self.state.statuses.get(w.id)
        if node_id is not None:
            # Withdraw the assignment: the agent stops and removes what is no longer desired.
            status = (st.value if st else WorkloadStatus()).model_copy(
                update={"phase": Phase.DELETING, "reason": "Deleting", "message": "", "updated_at": time.time()}
            )
            await self.state.commit(
                [Compare(keys.workload(w.id), wrev)],
                [Delete(keys.assignment(node_id, w.id)), Put(keys.status(w.id), status.to_json())],
            )
            return
        on_node = st.value.node_id if st else ""
        live = self.live.get(on_node)
        node = self.state.nodes.get(on_node)
        still_there = (
            live is not None and node is not None and node.value.status == NodeStatus.READY and w.id in live.present
        )
        if still_there:
            return  # the agent's next complete report without it re-enqueues us
        ops: list[Put | Delete] = [Delete(keys.workload(w.id))]
        if st is not None:
            ops.append(Delete(keys.status(w.id)))
        if await self.state.commit([Compare(keys.workload(w.id), wrev)], ops):
            self.usage.pop(w.id, None)
            self.emit("WorkloadDeleted", f"workload/{w.id}", "removed from the cluster")

    async def _place(self, w: Workload, wrev: int) -> None:
        decision = self.placement.decide(w)
        st = self.state.statuses.get(w.id)
        now = time.time()
        if decision.node_id is None:
            reason = decision.explain()
            prev = st.value if st else None
            if prev is None or prev.phase != Phase.PENDING or prev.message != reason:
                status = WorkloadStatus(
                    phase=Phase.PENDING, reason="Unschedulable", message=reason,
                    placement=decision.to_dict(), updated_at=now,
                )
                await self.state.commit(
                    [Compare(keys.workload(w.id), wrev)], [Put(keys.status(w.id), status.to_json())]
                )
                self.emit("WorkloadPending", f"workload/{w.id}", reason, "Unschedulable")
            return
        node_id = decision.node_id
        gen = w.generation
        assignment = Assignment(
            workload_id=w.id, node_id=node_id, revision=w.revision, generation=gen,
            desired_state=w.spec.desired_state, cpu_millicores=w.spec.resources.cpu_millicores,
            memory_mb=w.spec.resources.memory_mb, disk_mb=w.spec.resources.disk_mb, created_at=now,
        )
        status = WorkloadStatus(
            phase=Phase.SCHEDULED, node_id=node_id, reason="Scheduled", message=decision.explain(),
            placement=decision.to_dict(), updated_at=now,
        )
        akey = keys.assignment(node_id, w.id)
        ok = await self.state.commit(
            [Compare(keys.workload(w.id), wrev), Compare(akey, 0)],
            [Put(akey, assignment.to_json()), Put(keys.status(w.id), status.to_json())],
        )
        if ok:
            self.emit("WorkloadScheduled", f"workload/{w.id}", decision.explain(), "Scheduled")
        else:
            self._enqueue(w.id)  # lost a race with a concurrent change: look again

    async def _sync_assignment(self, w: Workload, node_id: str) -> None:
        cur = self.state.assignments.get(node_id, {}).get(w.id)
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
        akey = keys.assignment(node_id, w.id)
        if not await self.state.commit([Compare(akey, cur.mod_revision)], [Put(akey, updated.to_json())]):
            self._enqueue(w.id)

    # ------------------------------------------------------------------ agent API

    async def register(self, node: Node) -> None:
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
                    "last_heartbeat": 0.0,
                }
            )
            self.live[node.id] = self.live.get(node.id) or LiveNode(self.clock(), now)
            self.live[node.id].last_heartbeat = self.clock()
            if cur is not None and _same_node(cur.value, merged):
                break
            if await self.state.commit([Compare(key, cur.mod_revision if cur else 0)], [Put(key, merged.to_json())]):
                self.emit("NodeJoined" if cur is None else "NodeRegistered", f"node/{node.id}",
                          f"runtimes: {', '.join(sorted(node.capabilities.runtimes)) or 'none'}")
                break
            await self._refresh(key)
        self._enqueue_pending()

    def heartbeat(self, node_id: str, usage: NodeUsage) -> bool:
        """Record liveness in memory. False when the node is unknown and must register."""
        if node_id not in self.state.nodes:
            return False
        live = self.live.setdefault(node_id, LiveNode(self.clock(), time.time()))
        live.last_heartbeat = self.clock()
        live.last_heartbeat_wall = time.time()
        live.usage = usage
        return True

    async def report(self, node_id: str, reports: list[WorkloadReport], complete: bool) -> None:
        live = self.live.setdefault(node_id, LiveNode(self.clock(), time.time()))
        live.last_heartbeat = self.clock()
        if complete:
            gone = live.present - {r.workload_id for r in reports}
            live.present = {r.workload_id for r in reports}
            live.reported = True
            for wid in gone:
                self._enqueue(wid)
        for r in reports:
            if self.state.placement_of.get(r.workload_id) != node_id:
                continue  # a copy we did not ask this node to run: the agent removes it
            self.usage[r.workload_id] = WorkloadUsage(cpu_percent=r.cpu_percent, memory_bytes=r.memory_bytes)
            await self._record_report(node_id, r)

    async def _record_report(self, node_id: str, r: WorkloadReport) -> None:
        st = self.state.statuses.get(r.workload_id)
        w = self.state.workloads.get(r.workload_id)
        if st is None or w is None or w.value.deleting:
            return
        prev = st.value
        if r.revision != w.value.revision and r.phase == Phase.RUNNING:
            phase, reason = Phase.SCHEDULED, "Updating"  # the old revision still runs
        else:
            phase, reason = r.phase, r.reason
        message = r.message
        if (prev.phase, prev.reason, prev.message, prev.observed_revision, prev.runtime_id, prev.restarts) == (
            phase, reason, message, r.revision, r.runtime_id, r.restarts
        ):
            return
        new = prev.model_copy(
            update={
                "phase": phase, "reason": reason, "message": message, "node_id": node_id,
                "observed_revision": r.revision, "runtime_id": r.runtime_id, "restarts": r.restarts,
                "updated_at": time.time(),
            }
        )
        ok = await self.state.commit([Compare(keys.status(r.workload_id), st.mod_revision)],
                                     [Put(keys.status(r.workload_id), new.to_json())])
        if ok and phase != prev.phase:
            kind = {Phase.RUNNING: "WorkloadRunning", Phase.FAILED: "WorkloadFailed",
                    Phase.STOPPED: "WorkloadStopped"}.get(phase, "WorkloadStatus")
            self.emit(kind, f"workload/{r.workload_id}", message or f"{phase} on {node_id}", reason)

    async def desired_stream(self, node_id: str) -> AsyncIterator[list[Assignment]]:
        """Full desired state for `node_id`, again after every change to it."""
        ev = self._node_changed.setdefault(node_id, asyncio.Event())
        while True:
            ev.clear()
            yield [a.value for a in self.state.assignments.get(node_id, {}).values()]
            await ev.wait()

    async def _check_nodes(self) -> None:
        now = self.clock()
        grace = self.config.node_grace_seconds
        for node_id, cur in list(self.state.nodes.items()):
            live = self.live.get(node_id)
            # After our own restart every node gets a full grace period to reach us.
            last = live.last_heartbeat if live else self._started_at
            alive = now - last <= grace
            node = cur.value
            if alive == (node.status == NodeStatus.READY):
                continue
            status, why = (NodeStatus.READY, "Heartbeating") if alive else (
                NodeStatus.NOT_READY, f"no heartbeat for {now - last:.0f}s (grace {grace:.0f}s)")
            updated = node.model_copy(update={"status": status, "status_reason": why})
            ok = await self.state.commit([Compare(keys.node(node_id), cur.mod_revision)],
                                         [Put(keys.node(node_id), updated.to_json())])
            if ok:
                self.emit("NodeReady" if alive else "NodeNotReady", f"node/{node_id}", why)
                if alive:
                    self._enqueue_pending()

    # ------------------------------------------------------------------ views

    def workload_view(self, wid: str) -> dict[str, Any]:
        cur = self.state.workloads.get(wid)
        if cur is None:
            raise NotFound(wid)
        w = cur.value
        st = self.state.statuses.get(wid)
        status = st.value if st else WorkloadStatus()
        usage = self.usage.get(wid) if status.phase == Phase.RUNNING else None
        return {
            "id": w.id,
            "name": w.name,
            "type": w.spec.type,
            "labels": w.labels,
            "desiredState": "Deleted" if w.deleting else str(w.spec.desired_state),
            "revision": w.revision,
            "generation": w.generation,
            "phase": str(status.phase),
            "node": self.state.placement_of.get(wid) or status.node_id,
            "reason": status.reason,
            "message": status.message,
            "observedRevision": status.observed_revision,
            "runtimeId": status.runtime_id,
            "restarts": status.restarts,
            "usage": (usage or WorkloadUsage()).to_doc(),
            "placement": status.placement,
            "createdAt": w.created_at,
            "updatedAt": max(w.updated_at, status.updated_at),
            "spec": w.spec.to_doc(),
        }

    def list_workload_views(self, node_id: str = "") -> list[dict[str, Any]]:
        views = [self.workload_view(wid) for wid in sorted(self.state.workloads)]
        return [v for v in views if not node_id or v["node"] == node_id]

    def node_view(self, node_id: str) -> dict[str, Any]:
        cur = self.state.nodes.get(node_id)
        if cur is None:
            raise NotFound(node_id)
        doc = cur.value.to_doc()
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
        doc["workloads"] = sorted(a.workload_id for a in assigned)
        return doc

    def list_node_views(self) -> list[dict[str, Any]]:
        return [self.node_view(n) for n in sorted(self.state.nodes)]

    async def health(self) -> dict[str, Any]:
        store_ok, detail = True, ""
        try:
            st = await self.store.status()
            backend = str(st.get("backend", ""))
        except Exception as err:
            store_ok, backend, detail = False, "", f"store: {err}"
        events_ok = await self.events.healthy()
        if not events_ok:
            detail = (detail + "; " if detail else "") + "events: backend unreachable, events are being dropped"
        return {
            "mode": self.mode,
            "storeOk": store_ok,
            "eventsOk": events_ok,
            "storeBackend": backend,
            "nodesReady": sum(1 for n in self.state.nodes.values() if n.value.status == NodeStatus.READY),
            "workloads": len(self.state.workloads),
            "detail": detail,
        }


def _same_node(a: Node, b: Node) -> bool:
    ignore = {"last_heartbeat", "usage", "status_reason"}
    return a.model_dump(exclude=ignore) == b.model_dump(exclude=ignore)


__all__ = ["DesiredState", "MutationRefused", "NotFound", "Scheduler", "SchedulerConfig", "WorkloadReport"]
