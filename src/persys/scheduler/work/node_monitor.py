"""The node monitor: the loop that judges liveness (decide/liveness.py decides; this records the
transitions: NotReady nodes' instances are relocated) and retries Pending workloads, and the
mass-loss guard's state. Reads the replica through the narrow `MonitorShell` protocol."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from persys.model import Node, NodeStatus
from persys.scheduler.decide import liveness, step
from persys.scheduler.decide.liveness import GuardState, end_suspension
from persys.scheduler.ha.election import LeaderElection
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.mirror.follower import Versioned
from persys.scheduler.views import documents as views
from persys.scheduler.work.shell import Shell, interpreter_for
from persys.store.base import StoreUnavailable

log = logging.getLogger(__name__)
YIELD_EVERY_NODES = 256  # liveness over thousands of nodes never holds up the loop for long


class MonitorShell(Shell, Protocol):
    election: LeaderElection

    @property
    def is_active(self) -> bool: ...
    def owns(self, node_id: str) -> bool: ...
    def enqueue_node_workloads(self, node_id: str) -> None: ...


class NodeMonitor:
    def __init__(self, shell: MonitorShell) -> None:
        self.s = shell
        self.guard = GuardState()  # the mass-loss guard (decide/liveness.py)
        self.started_at = shell.clock()  # since when this replica judges (started, elected, unfrozen)
        # Since when this replica is active (started, elected; not moved by an unfreeze): placement
        # uses only nodes heard from since then (liveness.heard_since).
        self.active_since = self.started_at
        self.pending_dirty = False  # a node changed: Pending workloads may fit now
        # Lost nodes whose Stop instances wait for the node guard (reconcile.relocation): node ->
        # wall-clock time at which their workloads are looked at again.
        self.held: dict[str, float] = {}
        self.load_taken = float("-inf")  # when observed utilisation last went into the snapshot
        self.interpreter = interpreter_for(shell)

    def fresh_grace(self, keep_later: bool) -> None:
        """Every node gets a fresh grace period (this replica was elected, or unfrozen);
        `keep_later`: a grace period already running past now is kept."""
        now = self.started_at = self.s.clock()
        if not keep_later:
            self.active_since = now
            self.s.placement.refresh_nodes()  # nodes not heard from since are not placed on
        for live in self.s.live.values():
            live.last_heartbeat = max(live.last_heartbeat, now) if keep_later else now

    async def run(self) -> None:
        last_retry = self.s.clock()
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.s.config.monitor_interval_seconds)
            # Time this process could not listen (an overloaded event loop, a pause) is not
            # the nodes' fault: it does not count against their grace period.
            lag = time.monotonic() - before - self.s.config.monitor_interval_seconds
            if lag > 0.5:
                for live in self.s.live.values():
                    live.last_heartbeat += lag
            if self.s.guard.mode != Mode.NORMAL:
                continue  # liveness cannot be judged or recorded while frozen
            try:
                self.release_held()
                await self.check_nodes()
                if not self.s.is_active:
                    continue
                # A quiet moment: bring the placement snapshot up to date now, in small steps,
                # rather than in one piece inside the next decision (after a start or failover
                # that is every node).
                if (self.s.config.load_aware_weight > 0
                        and self.s.clock() - self.load_taken >= self.s.config.load_refresh_seconds):
                    self.load_taken = self.s.clock()
                    self.s.placement.observations_changed()  # load-aware scoring: fresh p95s
                await self.s.placement.prepare()
                last_retry = self._retry_pending(last_retry)
            except StoreUnavailable as err:
                log.warning("node monitor: store unavailable: %s", err)
            except Exception:
                log.exception("node monitor failed")

    def _retry_pending(self, last_retry: float) -> float:
        """Pending instances queued again: all of them now and then, else those the node changes
        since the last pass could help; when all were last queued."""
        if self.s.clock() - last_retry >= self.s.config.pending_retry_seconds:
            # Now and then every Pending instance, whatever changed (the safety net).
            self.pending_dirty = False
            last_retry = self.s.clock()
            self.s.hints.take()
            self.s.enqueue_pending()
        elif self.pending_dirty:
            # Coalesced: a burst of node changes costs one pass, over the Pending instances
            # those changes could help only (queueing hints).
            self.pending_dirty = False
            self.s.enqueue_pending(self.s.hints.take())
        return last_retry

    async def check_nodes(self) -> None:
        """Judge the nodes this replica is responsible for (a pure decision, liveness.check) and
        record the transitions: NotReady nodes' instances are relocated."""
        nodes: dict[str, Versioned[Node]] = {}
        seen: dict[str, liveness.Heard] = {}
        wall, delay = time.time(), self.s.config.stop_relocation_delay()
        for k, (node_id, cur) in enumerate(list(self.s.state.nodes.items())):
            if k % YIELD_EVERY_NODES == YIELD_EVERY_NODES - 1:
                await asyncio.sleep(0)
            if not self.s.owns(node_id):
                continue  # another replica judges this node
            nodes[node_id] = cur
            due = cur.value.last_heartbeat + delay
            if cur.value.status == NodeStatus.NOT_READY and due > wall and node_id not in self.held:
                # Lost before this replica was active (a failover, a restart): its Stop instances
                # still wait for the node guard, then they are looked at again from here.
                self.held[node_id] = due
            if (live := self.s.live.get(node_id)) is not None:
                seen[node_id] = liveness.Heard(live.last_heartbeat, live.heard_at)
        c = self.s.config
        done = step.on_tick(step.Tick(nodes, seen, self.s.clock(), self.started_at, c.node_grace_seconds, self.guard,
                                      c.liveness_guard(), c.restart_grace(), self.last_heard_wall))
        self.guard = done.guard
        self.interpreter.publish(done.effects.events)
        for t, w in zip(done.transitions, done.effects.writes, strict=True):
            if not await self.interpreter.write(w):
                continue
            if t.ready:
                self.pending_dirty = True  # coalesced: one pass over workloads per monitor tick
            else:
                self.s.enqueue_node_workloads(t.node_id)
                node = w.intents[0].doc
                assert isinstance(node, Node)
                self.held[t.node_id] = node.last_heartbeat + c.stop_relocation_delay()

    def last_heard_wall(self, node_id: str) -> float:
        """Wall-clock time this replica last heard the node (its start as active, if never)."""
        wall_now, now = time.time(), self.s.clock()
        live = self.s.live.get(node_id)
        if live is not None and live.heard_at >= self.started_at:
            return wall_now - (now - live.heard_at)
        return wall_now - (now - self.started_at)

    def release_held(self) -> None:
        """Look again at lost nodes' workloads whose Stop instances waited for the node guard."""
        now = time.time()
        for node_id, at in list(self.held.items()):
            if now >= at:
                del self.held[node_id]
                self.s.enqueue_node_workloads(node_id)

    def heard(self, node_id: str) -> bool:
        """Whether placement may use this node (liveness.heard_since). In sharded mode the
        placing leader does not receive other replicas' heartbeats: the stored status decides."""
        if self.s.config.sharded:
            return True
        live = self.s.live.get(node_id)
        return liveness.heard_since(liveness.Heard(live.last_heartbeat, live.heard_at) if live else None,
                                    self.active_since)

    def liveness_view(self) -> dict[str, Any]:
        """The mass-loss guard as health shows it (times as wall-clock seconds)."""
        return views.liveness_view(self.guard, time.time() - self.s.clock())

    def resume_liveness(self, via: str) -> dict[str, Any]:
        """An operator ends this replica's liveness suspension (idempotent): silent nodes are
        judged one by one from the next check."""
        was = self.guard.suspended
        self.guard, event = end_suspension(self.guard, via)
        if event is not None:
            self.s.emit(event.kind, "cluster", event.message, event.reason)
        return {"replicaId": self.s.election.replica_id, "resumed": was, **self.liveness_view()}


