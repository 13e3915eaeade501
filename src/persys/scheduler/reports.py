"""What agents tell a replica, and the pure decisions over it: the in-memory facts per node
(heartbeats never touch the store), a report decoupled from protobuf, and the status change a
report calls for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from persys.model import NodeStatus, NodeUsage, Phase, Workload, WorkloadStatus, WorkloadUsage
from persys.model.base import Model
from persys.model.status import PROGRESS_REASONS
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.load_window import UsageWindow


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
    recent: UsageWindow = field(default_factory=UsageWindow)  # for load-aware scoring (load_window.py)


def usage_of(r: WorkloadReport) -> WorkloadUsage | None:
    """The usage a report measured (None: nothing measured, not worth a record per instance)."""
    return r.usage if r.usage is not None and r.usage.measured else None


def status_change(
    st: Versioned[WorkloadStatus] | None, w: Versioned[Workload] | None, node_id: str, r: WorkloadReport,
    now: float, drift: dict[str, Any] | None = None,
) -> tuple[str, int, WorkloadStatus, WorkloadStatus] | None:
    """The status a report calls for: (instance, status revision, old, new), None if unchanged."""
    if st is None or w is None or w.value.deleting:
        return None
    prev = st.value
    if r.revision != w.value.revision and r.phase == Phase.RUNNING:
        # The old revision still runs (while the new one's image is pulled, that says how far).
        phase, reason = Phase.SCHEDULED, r.reason if r.reason in PROGRESS_REASONS else "Updating"
    else:
        phase, reason = r.phase, r.reason
    message = r.message
    if r.terminal and message:
        # Re-applying the same manifest changes nothing: say what does retry it.
        message += (" (terminal: not retried until the spec changes or "
                    f"`persysctl restart {w.value.name}`)")
    drift = drift or {}
    if (prev.phase, prev.reason, prev.message, prev.observed_revision, prev.runtime_id, prev.restarts,
            prev.drift) == (phase, reason, message, r.revision, r.runtime_id, r.restarts, drift):
        return None
    new = prev.model_copy(
        update={
            "phase": phase, "reason": reason, "message": message, "node_id": node_id,
            "observed_revision": r.revision, "runtime_id": r.runtime_id, "restarts": r.restarts,
            "updated_at": now,
            # A moved instance has arrived once it runs on its new node.
            "relocating_from": "" if phase == Phase.RUNNING else prev.relocating_from,
            "drift": drift,
        }
    )
    return r.workload_id, st.mod_revision, prev, new


def status_event(prev: WorkloadStatus, new: WorkloadStatus) -> str | None:
    """The event kind a status change of an instance is published as (None: not an event): a
    phase change, or a start's progress on its node (ImagePulling, ImagePulled) as its own kind."""
    if new.reason in PROGRESS_REASONS and new.reason != prev.reason:
        return new.reason
    if new.phase == prev.phase:
        return None
    return {Phase.RUNNING: "WorkloadRunning", Phase.FAILED: "WorkloadFailed",
            Phase.STOPPED: "WorkloadStopped"}.get(new.phase, "WorkloadStatus")


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
