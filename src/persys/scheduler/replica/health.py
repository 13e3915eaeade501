"""A replica's health document (what /healthz, /readyz and `persysctl status` show): the store,
the mirror, events, the operating mode, the reconcile worker, the liveness guard, leadership.
Reads the replica through the narrow `HealthSource` protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from persys.events.base import EventBus
from persys.events.outbox import EventOutbox
from persys.model import NodeStatus
from persys.observability.health_checks import DependencyState, NamedCheck
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.decide.shards import SpreadCache
from persys.scheduler.ha.election import LeaderElection
from persys.scheduler.ha.mode_guard import Mode, ModeGuard
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.placing.engine_adapter import PlacementService
from persys.scheduler.replica.dependency_probe import DependencyProbe
from persys.scheduler.work.worker_watch import WorkerWatch
from persys.store.base import StateStore


class HealthSource(Protocol):
    store: StateStore
    events: EventBus
    state: ClusterState
    config: SchedulerConfig
    clock: Callable[[], float]
    guard: ModeGuard
    election: LeaderElection
    outbox: EventOutbox
    worker_watch: WorkerWatch
    placement: PlacementService
    elected_at_wall: float
    health_checks: list[NamedCheck]  # registered at start: the secret store, Persys Meter, ...
    health_probe: DependencyProbe  # their latest probes: health answers from memory

    @property
    def is_active(self) -> bool: ...
    @property
    def catching_up(self) -> bool: ...
    @property
    def mode(self) -> str: ...
    @property
    def active_tasks(self) -> list[asyncio.Task[Any]]: ...
    def leader_address(self) -> str: ...
    def owns(self, node_id: str) -> bool: ...
    def liveness_view(self) -> dict[str, Any]: ...
    def meter_view(self) -> dict[str, Any]: ...


_SPREAD = SpreadCache()


def shard_rows(s: HealthSource) -> list[dict[str, Any]]:
    """Sharded mode: every member of the shard map, its address and how many nodes it owns (the
    dashboard's overview); empty otherwise (the active replica serves every node)."""
    if not s.config.sharded:
        return []
    members, rev = s.state.shards
    counts = _SPREAD.get(s.state.nodes, len(s.state.nodes), members, rev, time.monotonic())
    return [{"replica": m, "address": s.state.replicas.get(m, ""), "nodes": counts.get(m, 0)} for m in members]


def _problems(s: HealthSource, liveness: dict[str, Any]) -> list[str]:
    notes = []
    if s.guard.mode != Mode.NORMAL:
        notes.append(s.guard.reason)
    if liveness["suspended"]:
        notes.append(
            f"liveness suspended: {liveness['silentNodes']} of {liveness['judgedNodes']} nodes silent "
            f"({liveness['reason']}), ends in {max(0.0, liveness['endsAt'] - time.time()):.0f}s at the latest "
            "(persysctl admin liveness resume ends it now)")
    return notes


def _refused(s: HealthSource) -> list[str]:
    if not s.state.refused:
        return []
    names = sorted(s.state.refused)
    return [f"{len(names)} stored workload(s) refused by the model and not scheduled: {', '.join(names[:5])}"
            + (", ..." if len(names) > 5 else "")]


MAX_RUNTIME_NOTES = 5


def runtimes_state(s: HealthSource) -> DependencyState:
    """Node runtimes the agents found not working, with their reasons (a few named, all counted)."""
    broken = [f"{nid}: {rt}: {why}" for nid, n in sorted(s.state.nodes.items())
              for rt, why in sorted(n.value.capabilities.unavailable.items())]
    if not broken:
        return DependencyState("node-runtimes", True, f"every runtime the {len(s.state.nodes)} node(s) probed works")
    extra = len(broken) - MAX_RUNTIME_NOTES
    more = f" (+{extra} more: persysctl describe node)" if extra > 0 else ""
    return DependencyState("node-runtimes", False, "; ".join(broken[:MAX_RUNTIME_NOTES]) + more)


async def health(s: HealthSource) -> dict[str, Any]:
    """From memory: the dependencies' latest probes (replica/dependency_probe.py), never a call to them."""
    notes: list[str] = []
    probed = await s.health_probe.current()
    store_ok, backend, store_reason = probed.store.ok, probed.backend, probed.store.reason
    if not store_ok:
        notes.append(f"store: {store_reason}")
    events_state, checked = probed.events, probed.checks
    if stale := s.health_probe.staleness_note(s.config.health_interval_seconds):
        notes.append(stale)
    dependencies = [probed.store, events_state, *checked, runtimes_state(s)]
    # Registered dependencies that fail are problems; a node without some runtime may be so by
    # design, so node runtimes stay in their entry only.
    notes += [f"{d.name}: {d.reason}" for d in checked if not d.ok]
    mirror = s.state.health(s.clock())
    notes += [mirror.detail] if mirror.detail else []
    if s.catching_up:
        notes.append(f"elected, catching up with the store (mirror at revision {s.state.revision}, needs "
                     f"{s.election.fence_revision}): agents are asked to retry")
    events_ok = events_state.ok
    notes += [] if events_ok else ["events: backend unreachable, events are being dropped"]
    losses = s.outbox.ledger.health()
    liveness = s.liveness_view()
    notes += _problems(s, liveness)
    mode = s.mode
    worker = s.worker_watch.problem(any(not t.done() for t in s.active_tasks), s.is_active, s.clock())
    if worker:
        # Scheduling is (or just was) stopped: not normal, whatever the store says.
        mode = str(Mode.DEGRADED) if mode == str(Mode.NORMAL) else mode
        notes.append(worker)
    notes += _refused(s)
    return {
        "replicaId": s.election.replica_id,
        "active": s.is_active,
        "role": "active" if s.is_active else "catching-up" if s.catching_up else "standby",
        "leader": s.leader_address(),
        "electedAt": s.elected_at_wall,
        "sharded": s.config.sharded,
        "ownedNodes": sum(1 for n in s.state.nodes if s.owns(n)),
        "shards": shard_rows(s),
        "mode": mode,
        "storeOk": store_ok,
        "eventsOk": events_ok,
        "storeBackend": backend,
        "nodesReady": sum(1 for n in s.state.nodes.values() if n.value.status == NodeStatus.READY),
        "workloads": len(s.state.workloads),
        "detail": "; ".join(notes),
        "decisionLatency": s.placement.decision_latency(),
        **losses,
        "mirror": {"revision": s.state.revision, "storeRevision": s.state.lag.store_revision,
                   "lag": mirror.lag, "watch": mirror.watch, "compactionRecoveries": s.state.compaction_recoveries},
        "liveness": liveness,
        "dependencies": [d.to_doc() for d in dependencies],
        "meter": s.meter_view(),
    }
