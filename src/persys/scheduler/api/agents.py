"""What a replica does with its agents' calls: registration (the node document), heartbeats
(memory only) and reports (presence, usage, drift findings, status changes, written together
with other nodes' in shared transactions). The decisions are pure (mirror/reports.py, decide/drift.py);
this does the I/O."""

from __future__ import annotations

import time
from collections.abc import Callable

from persys.model import Node, NodeStatus, NodeUsage
from persys.model.workload import workload_of
from persys.scheduler.api.node_volumes import NodeVolumes, VolumeReport
from persys.scheduler.decide import step
from persys.scheduler.decide.report import DriftKnown, Report
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.reports import LiveNode, WorkloadReport, same_node, usage_of
from persys.scheduler.work.delivery import Delivery
from persys.scheduler.work.shell import Shell, interpreter_for
from persys.store.base import Compare, Put

REGISTER_ATTEMPTS = 10


def registered(node: Node, cur: Node | None, now: float) -> Node:
    """The node document a registration stores: what the agent says, with what operators set kept."""
    return node.model_copy(update={
        "status": NodeStatus.READY,
        "status_reason": "Registered",
        "registered_at": cur.registered_at if cur else now,
        "cordoned": cur.cordoned if cur else False,
        "draining": cur.draining if cur else False,
        "drain_deadline": cur.drain_deadline if cur else 0.0,
        "admin_labels": cur.admin_labels if cur else {},
        "admin_taints": cur.admin_taints if cur else [],
        "last_heartbeat": 0.0,
    })


class AgentApi:
    def __init__(self, shell: Shell, require_owner: Callable[[str], None], delivery: Delivery,
                 volumes: NodeVolumes) -> None:
        self.s = shell
        self.require_owner = require_owner
        self.delivery = delivery
        self.volumes = volumes
        self.drift: dict[str, DriftKnown] = {}  # node -> open findings
        # Concurrent reports from many nodes share transactions (the planner's group commit).
        self.interpreter = interpreter_for(shell)

    def _heard(self, node_id: str) -> LiveNode:
        usable = self.s.placement.heard(node_id)
        now = self.s.clock()
        live = self.s.live.get(node_id)
        if live is None:  # (not setdefault: its default, a LiveNode and its models, was built on every beat)
            live = self.s.live[node_id] = LiveNode(now, time.time())
        live.last_heartbeat = live.heard_at = now
        if not usable and self.s.placement.heard(node_id):
            # First word since this replica became active: placement may use the node now.
            self.s.placement.node_heard(node_id)
            self.s.enqueue_pending()
        return live

    async def register(self, node: Node) -> None:
        self.require_owner(node.id)
        self.s.require_normal()
        state, now, key = self.s.state, time.time(), keys.node(node.id)
        for _ in range(REGISTER_ATTEMPTS):
            cur = state.nodes.get(node.id)
            merged = registered(node, cur.value if cur else None, now)
            self._heard(node.id)
            if cur is not None and same_node(cur.value, merged):
                break
            if await state.commit([Compare(key, cur.mod_revision if cur else 0)], [Put(key, merged.to_json())],
                                  fenced="node"):
                self.s.emit("NodeJoined" if cur is None else "NodeRegistered", f"node/{node.id}",
                            f"runtimes: {', '.join(sorted(node.capabilities.runtimes)) or 'none'}")
                break
            await self.s.refresh(key)
        # What waited for this agent (instances being moved, whose status has no rejection codes);
        # Unschedulable ones are looked at again if the node's change could help them (the node
        # event's queueing hints: placing/queueing_hints.py).
        self.s.enqueue_pending(frozenset())

    def heartbeat(self, node_id: str, usage: NodeUsage) -> bool:
        """Record liveness in memory. False when the node is unknown and must register."""
        self.require_owner(node_id)
        if node_id not in self.s.state.nodes:
            return False
        live = self._heard(node_id)
        live.last_heartbeat_wall = time.time()
        live.usage = usage
        live.recent.add(usage.cpu_percent, usage.memory_used_mb)
        self.s.telemetry.node(node_id, usage)
        return True

    async def report(self, node_id: str, reports: list[WorkloadReport], complete: bool,
                     volumes: VolumeReport | None = None) -> None:
        """`volumes`: what the node has attached and how its volume tasks ended (node_volumes)."""
        self.require_owner(node_id)
        live = self._heard(node_id)
        gone: set[str] = set()
        listed = {r.workload_id for r in reports}
        if complete:
            gone = live.present - listed
            live.present = listed
            live.reported = True
            for inst in gone:
                self.s.enqueue(workload_of(inst))
        else:
            # A partial report (what changed) lists instances the agent has: they count as
            # present, so that their absence from a later complete report is noticed.
            live.present |= listed
        self._sample(node_id, reports)
        if self.s.guard.mode != Mode.NORMAL:
            return  # frozen: statuses are not written; usage and presence above are still kept
        if volumes is not None:
            await self.volumes.on_report(node_id, volumes)
        done = step.on_report(self.s.state, Report(node_id, reports, complete, gone, time.time()),
                              self.drift.get(node_id, {}))
        self.drift[node_id] = done.drift
        await self.interpreter.run(done.effects)

    def _sample(self, node_id: str, reports: list[WorkloadReport]) -> None:
        """Samples for Persys Meter of the instances this node was asked to run."""
        state = self.s.state
        measured = [(r.workload_id, u) for r in reports
                    if (u := usage_of(r)) is not None and state.placement_of.get(r.workload_id) == node_id]
        if measured:
            self.s.telemetry.instances(node_id, measured,
                                       lambda wid: (w.value if (w := state.workloads.get(wid)) else None))
