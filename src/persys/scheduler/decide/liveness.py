"""Node liveness as a pure decision: stored statuses and the heartbeats this replica saw in,
readiness transitions and the mass-loss guard's new state out. No I/O; the scheduler writes
the transitions and publishes the events (`node_monitor.NodeMonitor.check_nodes`).

Rules:

* A node is Ready only on a heartbeat this replica saw since it started or was elected
  (`since`). A node it has not heard from keeps its stored status: NotReady stays NotReady
  (a restart must not revive dead nodes), and a Ready one is marked NotReady once the restart
  grace (`restart_grace`, at least the node grace), counted from `since`, has passed without a
  heartbeat. Until then the node is neither relocated from nor placed on (placement asks
  `heard_since`): after a whole-cluster restart agents come back at their own pace, and one
  returning within the restart grace keeps every workload it runs.
* The mass-loss guard: when at least `min_nodes` are judged and more than `max_lost_fraction`
  of them would go NotReady at once, the silence is far likelier ours (our network, our load)
  than theirs, so nobody is marked NotReady and nothing is relocated. The suspension is
  bounded: it ends when heartbeats flow again, when an operator ends it, or after
  `max_seconds`. After an expiry or an operator's end, nodes are judged one by one and the
  guard does not trip again until the silence has cleared (it re-arms on a tick that would
  not trip it), so a real mass failure is never hidden for longer than `max_seconds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from persys.model import NodeStatus

# Why the guard is off again (the reason of a LivenessResumed event).
HEARTBEATS_FLOW = "HeartbeatsFlow"
EXPIRED = "Expired"
OPERATOR = "Operator"
NOT_JUDGING = "NotJudging"
TOO_MANY_LOST = "TooManyLost"  # why it trips (the reason of a LivenessSuspended event)


@dataclass(frozen=True)
class GuardConfig:
    max_lost_fraction: float = 0.5
    min_nodes: int = 10  # fewer nodes than this: every silence is judged node by node
    max_seconds: float = 60.0  # longest suspension; <= 0 turns the guard off


@dataclass(frozen=True)
class GuardState:
    suspended_since: float | None = None  # clock value when it tripped; None: liveness is on
    ends_at: float = 0.0  # clock value when the suspension expires at the latest
    silent: int = 0  # nodes silent past their grace period at the last judgement
    judged: int = 0  # nodes this replica judged at the last judgement
    reason: str = ""
    armed: bool = True  # False after an expiry or an operator's end, until the silence clears

    @property
    def suspended(self) -> bool:
        return self.suspended_since is not None


@dataclass(frozen=True)
class Transition:
    node_id: str
    ready: bool
    reason: str  # stored as the node's status_reason and the event's message


@dataclass(frozen=True)
class GuardEvent:
    kind: str  # LivenessSuspended | LivenessResumed
    reason: str
    message: str


@dataclass(frozen=True)
class Verdict:
    transitions: list[Transition] = field(default_factory=list)
    guard: GuardState = field(default_factory=GuardState)
    events: list[GuardEvent] = field(default_factory=list)


def judge(
    nodes: Mapping[str, NodeStatus],
    heard: Mapping[str, float],
    now: float,
    since: float,
    grace: float,
    guard: GuardState,
    config: GuardConfig,
    grace_from: Mapping[str, float] | None = None,
    restart_grace: float = 0.0,
) -> Verdict:
    """Judge the nodes this replica is responsible for.

    nodes: node id -> stored status. heard: node id -> time of its last heartbeat seen by this
    replica since `since` (absent: none). since: when this replica started or was elected.
    grace_from: a later start of the grace period for a node not heard from (its shard was
    handed to us, or our event loop stalled): it never makes a node Ready. restart_grace: how
    long a node never heard since `since` keeps its stored status (at least `grace`)."""
    grace_from = grace_from or {}
    unheard_for = max(grace, restart_grace)
    transitions = [t for node_id, status in nodes.items()
                   if (t := _transition(node_id, status, heard.get(node_id), now, since, grace, unheard_for,
                                        grace_from.get(node_id, since))) is not None]
    lost = sum(1 for t in transitions if not t.ready)
    judged = len(nodes)
    trips = (config.max_seconds > 0 and judged >= config.min_nodes
             and lost > judged * config.max_lost_fraction)
    events: list[GuardEvent] = []
    if guard.suspended_since is not None:
        started = guard.suspended_since
        if judged == 0:
            guard = GuardState(armed=True)
            events.append(GuardEvent("LivenessResumed", NOT_JUDGING,
                                     "liveness suspension ended: this replica judges no nodes any more"))
        elif not trips:
            guard = GuardState(judged=judged, silent=lost, armed=True)
            events.append(GuardEvent("LivenessResumed", HEARTBEATS_FLOW,
                                     f"heartbeats flow again ({lost} of {judged} nodes silent)"))
        elif now >= guard.ends_at:
            lasted = now - started
            guard = GuardState(judged=judged, silent=lost, armed=False)
            events.append(GuardEvent(
                "LivenessResumed", EXPIRED,
                f"liveness suspension expired after {lasted:.0f}s (at most {config.max_seconds:.0f}s); judging "
                f"nodes one by one: {lost} of {judged} nodes are silent and marked NotReady"))
        else:
            guard = replace(guard, silent=lost, judged=judged)
            transitions = [t for t in transitions if t.ready]
    elif trips and guard.armed:
        guard = GuardState(suspended_since=now, ends_at=now + config.max_seconds, silent=lost, judged=judged,
                           reason=TOO_MANY_LOST, armed=True)
        events.append(GuardEvent(
            "LivenessSuspended", TOO_MANY_LOST,
            f"{lost} of {judged} nodes silent at once (more than {config.max_lost_fraction:.0%}); not marking "
            f"them NotReady for up to {config.max_seconds:.0f}s, or until heartbeats flow or an operator "
            "ends it (persysctl admin liveness resume)"))
        transitions = [t for t in transitions if t.ready]
    else:
        guard = GuardState(judged=judged, silent=lost, armed=guard.armed or not trips)
    return Verdict(transitions, guard, events)


def _transition(node_id: str, status: NodeStatus, last: float | None, now: float, since: float, grace: float,
                unheard_for: float, grace_start: float) -> Transition | None:
    """One node's change of readiness, if any: heard within the grace period is Ready; silent
    past it is NotReady; never heard since `since`, it keeps its stored status for `unheard_for`
    (and `grace` past a later start of its grace period, `grace_start`)."""
    if last is not None:
        alive = now - last <= grace
        if alive and status != NodeStatus.READY:
            return Transition(node_id, True, "Heartbeating")
        if not alive and status == NodeStatus.READY:
            return Transition(node_id, False, f"no heartbeat for {now - last:.0f}s (grace {grace:.0f}s)")
        return None
    if status == NodeStatus.READY and now > max(since + unheard_for, grace_start + grace):
        return Transition(node_id, False, f"no heartbeat since this scheduler became active {now - since:.0f}s ago "
                          f"(restart grace {unheard_for:.0f}s)")
    return None


def end_suspension(guard: GuardState, via: str) -> tuple[GuardState, GuardEvent | None]:
    """An operator ends the suspension (`via`: the caller's identity): nodes are judged one by one
    from the next judgement. Idempotent: ending a guard that is not suspended changes nothing."""
    if not guard.suspended:
        return guard, None
    ended = GuardState(judged=guard.judged, silent=guard.silent, armed=False)
    return ended, GuardEvent("LivenessResumed", OPERATOR,
                             f"liveness suspension ended by an operator (through {via}); judging nodes one by one "
                             f"({guard.silent} of {guard.judged} nodes were silent)")


@dataclass(frozen=True)
class Heard:
    """What this replica saw of one node's agent (clock values; see reports.LiveNode)."""

    last_heartbeat: float  # moved forward by fresh grace periods (a handoff, our own stall)
    heard_at: float  # when the agent itself last spoke


@dataclass(frozen=True)
class Observation:
    heard: dict[str, float] = field(default_factory=dict)  # judge's `heard`
    grace_from: dict[str, float] = field(default_factory=dict)  # judge's `grace_from`


def observe(seen: Mapping[str, Heard], since: float) -> Observation:
    """judge's inputs from what this replica saw: a node counts as heard from only if its agent
    spoke since `since`; a later grace-period start alone never makes it Ready."""
    out = Observation()
    for node_id, h in seen.items():
        if h.heard_at >= since:
            out.heard[node_id] = h.last_heartbeat  # includes time our event loop stalled
        elif h.last_heartbeat > since:
            out.grace_from[node_id] = h.last_heartbeat  # a fresh grace period (handoff, stall)
    return out


def check(nodes: Mapping[str, NodeStatus], seen: Mapping[str, Heard], now: float, since: float, grace: float,
          guard: GuardState, config: GuardConfig, restart_grace: float = 0.0) -> Verdict:
    """One liveness step (the node monitor's decision): the owned nodes' stored
    statuses and what this replica saw of them in, transitions and the guard's new state out."""
    o = observe(seen, since)
    return judge(nodes, o.heard, now, since, grace, guard, config, o.grace_from, restart_grace)


def heard_since(seen: Heard | None, active_since: float) -> bool:
    """Whether placement may use a node: its agent spoke to this replica since it became active
    (its stored Ready may be a dead node's, written before a restart or a failover)."""
    return seen is not None and seen.heard_at >= active_since
