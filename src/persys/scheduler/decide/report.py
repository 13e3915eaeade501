"""What an agent's report calls for (pure): the report decoupled from protobuf, the usage it
measured, the status change of an instance and the event it is published as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from persys.model import Phase, RestartPolicy, Workload, WorkloadStatus, WorkloadUsage
from persys.model.status import PROGRESS_REASONS
from persys.model.workload import workload_of
from persys.scheduler.decide.drift import Drift, Reported, Tracked, detect, track
from persys.scheduler.decide.effects import Event, Guard, Write, put
from persys.scheduler.decide.mirror import Mirror, Versioned


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


DriftKnown = dict[tuple[str, str], tuple[Drift, float]]  # a node's open findings, with since when


@dataclass(frozen=True)
class Report:
    """One report as the step reads it. `gone`: instances this replica saw the node run that a
    complete report no longer lists."""

    node_id: str
    reports: list[WorkloadReport]
    complete: bool
    gone: set[str]
    now: float


def confirm_left(m: Mirror, node_id: str, gone: set[str]) -> list[Write]:
    """Record that a node's agent no longer runs instances withdrawn from it, so whichever
    replica places them (or finalises their deletion) knows without owning this node."""
    out = []
    for inst in sorted(gone):
        st = m.statuses.get(inst)
        if st is None or m.placement_of.get(inst) == node_id or st.value.left_node == node_id:
            continue
        new = st.value.model_copy(update={"left_node": node_id})
        out.append(Write([Guard("status", inst, st.mod_revision)], [put("status", inst, new)], fence="node"))
    return out


def findings(m: Mirror, r: Report, known: DriftKnown) -> Tracked:
    """The node's drift after this report (`track`: what is new, resolved, still open)."""
    def policy(inst: str) -> RestartPolicy | None:
        w = m.workloads.get(workload_of(inst))
        return w.value.spec.restart_policy if w else None

    listed = None if r.complete else {x.workload_id for x in r.reports}
    found = detect(r.node_id, {i: a.value for i, a in m.assignments.get(r.node_id, {}).items()},
                   [Reported(x.workload_id, x.revision, x.phase, x.terminal) for x in r.reports], r.complete,
                   m.placement_of.get, policy, r.now)
    return track(known, found, listed, r.now)


def drift_events(node_id: str, tracked: Tracked) -> list[Event]:
    out = [Event("DriftDetected", f"workload/{workload_of(d.instance)}",
                 f"{d.instance} on {node_id}: {d.kind}: {d.rule}; remediation: {d.action}", d.kind, node=node_id)
           for d in tracked.detected]
    return out + [Event("DriftResolved", f"workload/{workload_of(d.instance)}", f"{d.instance} on {node_id}: {d.kind}",
                        d.kind, node=node_id) for d in tracked.resolved]


def status_write(m: Mirror, r: Report, x: WorkloadReport, drift: dict[str, Any] | None) -> Write | None:
    """The guarded write of the status change a report of one instance calls for, and its event."""
    change = status_change(m.statuses.get(x.workload_id), m.workloads.get(workload_of(x.workload_id)),
                           r.node_id, x, r.now, drift)
    if change is None:
        return None
    inst, rev, prev, new = change
    w = Write([Guard("status", inst, rev)], [put("status", inst, new)], fence="node")
    kind = status_event(prev, new)
    if kind is not None:
        wid = workload_of(inst)
        prefix = f"{inst}: " if inst != wid else ""
        # A failure names its node too: the automation counts them per node.
        node = r.node_id if kind in PROGRESS_REASONS or kind == "WorkloadFailed" else ""
        w.events.append(Event(kind, f"workload/{wid}", prefix + (new.message or f"{new.phase} on {r.node_id}"),
                              new.reason, node=node))
    return w
