"""The step (raft's `RawNode`): what happened goes in with the mirror, one `Effects` comes out.

`on_changes` (workloads to converge), `on_report` (an agent's report), `on_tick` (liveness) and
`on_placed` (placement decisions to make durable) are pure: they read the mirror and what this
replica saw, never write, and return every write with its guards, the events, the deliveries to
wake and the work that follows. The components call a step and hand its effects to the
interpreter (`scheduler.interpret`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from persys.model import Node, NodeStatus
from persys.scheduler.decide.effects import Effects, Event, Guard, Write, put
from persys.scheduler.decide.liveness import GuardConfig, GuardState, Heard, Transition, check
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.decide.placed import on_placed
from persys.scheduler.decide.reconcile import RunsOn, plan
from persys.scheduler.decide.report import (
    DriftKnown,
    Report,
    confirm_left,
    drift_events,
    findings,
    status_write,
    usage_of,
)

__all__ = ["Context", "ReportStep", "Tick", "TickStep", "on_changes", "on_placed", "on_report", "on_tick"]


@dataclass(frozen=True)
class Context:
    """What a reconcile step reads besides the mirror: the wall clock's value, whether a node's
    agent still runs an instance, the instances being committed, and how long an
    `onDisconnect: Stop` instance of a lost node waits for its node guard."""

    now: float
    runs_on: RunsOn
    inflight: set[str] = field(default_factory=set)
    stop_delay: float = 0.0


def on_changes(m: Mirror, wids: list[str], ctx: Context) -> Effects:
    """Converge these workloads: their plans' writes, in order, and the instances to place."""
    fx = Effects()
    for wid in wids:
        p = plan(m, wid, ctx.inflight, ctx.runs_on, ctx.now, ctx.stop_delay)
        fx.writes += p.writes
        fx.needs += p.needs
    return fx


@dataclass
class ReportStep:
    effects: Effects
    drift: DriftKnown  # the node's open findings after this report: the caller keeps them


def on_report(m: Mirror, r: Report, known: DriftKnown) -> ReportStep:
    """An agent's report: record that withdrawn instances left, track drift (events; a resync
    when something assigned is missing), keep the usage measured, and write the status changes
    (guarded by the status each was computed from; many nodes' share transactions)."""
    fx = Effects(writes=confirm_left(m, r.node_id, r.gone), grouped=True)
    tracked = findings(m, r, known)
    fx.events += drift_events(r.node_id, tracked)
    if tracked.resync:
        fx.resync.append(r.node_id)  # remediation: send the whole desired state again
    for x in r.reports:
        if m.placement_of.get(x.workload_id) != r.node_id:
            continue  # a copy we did not ask this node to run: the agent removes it
        if (measured := usage_of(x)) is not None:
            fx.usage[x.workload_id] = measured
        else:
            fx.forget_usage.append(x.workload_id)
        w = status_write(m, r, x, tracked.records.get(x.workload_id))
        if w is not None:
            fx.writes.append(w)
    return ReportStep(fx, tracked.known)


@dataclass(frozen=True)
class Tick:
    """One liveness tick: the nodes this replica judges, what it saw of their agents (clock
    values), since when it judges, the grace periods, the mass-loss guard, and the wall-clock
    time each node was last heard (what a NotReady node's document records)."""

    nodes: Mapping[str, Versioned[Node]]
    seen: Mapping[str, Heard]
    now: float
    since: float
    grace: float
    guard: GuardState
    config: GuardConfig
    restart_grace: float
    last_heard_wall: Callable[[str], float]


@dataclass
class TickStep:
    effects: Effects  # the guard's events; one node write per transition, in order
    guard: GuardState  # the mass-loss guard's new state: the caller keeps it
    transitions: list[Transition]


def on_tick(t: Tick) -> TickStep:
    """Judge liveness (liveness.check) and write each transition under the node's revision."""
    verdict = check({n: c.value.status for n, c in t.nodes.items()}, t.seen, t.now, t.since, t.grace, t.guard,
                    t.config, t.restart_grace)
    fx = Effects(events=[Event(ev.kind, "cluster", ev.message, ev.reason) for ev in verdict.events])
    for tr in verdict.transitions:
        cur = t.nodes[tr.node_id]
        change: dict[str, Any] = {"status": NodeStatus.READY if tr.ready else NodeStatus.NOT_READY,
                                  "status_reason": tr.reason}
        if not tr.ready:  # when it was last heard (wall clock): Stop instances wait from there
            change["last_heartbeat"] = t.last_heard_wall(tr.node_id)
        updated = cur.value.model_copy(update=change)
        fx.writes.append(Write([Guard("node", tr.node_id, cur.mod_revision)], [put("node", tr.node_id, updated)],
                               [Event("NodeReady" if tr.ready else "NodeNotReady", f"node/{tr.node_id}", tr.reason)],
                               fence="node"))
    return TickStep(fx, verdict.guard, verdict.transitions)
