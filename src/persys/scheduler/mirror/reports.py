"""What agents tell a replica, and the pure decisions over it: the in-memory facts per node
(heartbeats never touch the store), a report decoupled from protobuf, and the status change a
report calls for."""

from __future__ import annotations

from dataclasses import dataclass, field

from persys.model import NodeStatus, NodeUsage
from persys.model.base import Model
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.report import WorkloadReport, status_change, status_event, usage_of
from persys.scheduler.mirror.load_window import UsageWindow

__all__ = ["LiveNode", "WorkloadReport", "runs_on", "same_node", "status_change", "status_event", "usage_of"]


@dataclass
class LiveNode:
    """Per-node facts kept only in memory: heartbeats never touch the store."""

    last_heartbeat: float  # monotonic
    last_heartbeat_wall: float
    usage: NodeUsage = field(default_factory=NodeUsage)
    present: set[str] = field(default_factory=set)  # workloads in the last complete report
    reported: bool = False
    # When the agent itself last spoke (heartbeat, report, registration). Unlike last_heartbeat,
    # which fresh grace periods move forward, only this can make a node Ready (decide/liveness.py).
    heard_at: float = float("-inf")
    recent: UsageWindow = field(default_factory=UsageWindow)  # for load-aware scoring (mirror/load_window.py)


def runs_on(state: Mirror, live: dict[str, LiveNode], owns: bool, inst: str, node_id: str) -> bool:
    """Whether `node_id`'s agent still runs `inst`, as far as this replica can tell (`owns`: it
    serves that node's agent, so its own record of the agent's last complete report counts)."""
    node = state.nodes.get(node_id)
    if node is None or node.value.status != NodeStatus.READY:
        return False  # lost or gone: nothing to wait for
    entry = live.get(node_id)
    if owns and entry is not None and entry.reported:
        return inst in entry.present
    st = state.statuses.get(inst)
    return st is not None and st.value.left_node != node_id


def same_node(a: Model, b: Model) -> bool:
    """Two node documents that differ only in what registration does not set."""
    ignore = {"last_heartbeat", "usage", "status_reason"}
    return a.model_dump(exclude=ignore) == b.model_dump(exclude=ignore)
