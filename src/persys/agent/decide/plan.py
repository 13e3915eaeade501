"""The agent's local decision: what to start, stop and remove now. Pure.

`plan` takes the desired set, what the runtimes show, the agent's local bookkeeping (failures
and their backoff, instances stopped for disconnection, orphans first seen) and a clock value,
and returns the actions plus the bookkeeping that follows from the decision alone. The agent
loop observes (I/O), plans (here), executes the actions (I/O) and records their outcome with
`after_restart` / `after_failure`, which are pure too (the jitter comes in as an argument).

Rules, in order, for each desired instance: no working runtime for its type is a terminal
failure; an instance stopped for disconnection (`persys.agent.decide.disconnect`) is kept stopped;
desired Stopped is stopped; running at the desired revision is left alone (and clears a
retryable failure); one that exited by itself is started again as its restartPolicy says
(Never: not; OnFailure: unless exit code 0); nothing is started during a failure's backoff or
after a terminal one, unless that one came with the node's registry credentials and they have
changed since. A start under way in the background (an image pull) is asked again at once.
Undesired instances are removed only once a full desired set arrived in normal mode; one never
desired here since the agent started (an orphan) only after the orphan grace, and one listed
with a spec this agent cannot read never.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from persys.agent.decide import disconnect
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.model import DesiredState, RestartPolicy, WorkloadSpec

BACKOFF_CAP = 30.0
RESTARTED = "Restarted"  # failure code of a crash-loop restart: backs off, is not reported as a failure


@dataclass
class Desired:
    revision: str
    generation: int
    desired_state: DesiredState
    spec: WorkloadSpec
    fence_node: str = ""  # a lost node its single-writer volumes may be fenced off (AssignedWorkload)
    devices: tuple[str, ...] = ()  # the node's devices (GPUs) the placement gave the instance


@dataclass
class Failure:
    revision: str
    code: str
    message: str
    terminal: bool
    attempts: int = 1
    next_try: float = 0.0
    since: float = 0.0  # first failure of this streak
    # Not a failure: the start goes on in the background (StartPending: its image pull), reported
    # with its code and message as the reason; tried again without backoff.
    pending: bool = False
    # The registry credentials' fingerprint a pull failed with: a terminal failure is retried once
    # the node's credentials file changes. None: unrelated to credentials.
    credentials: str | None = None


def backoff(attempts: int, jitter: float) -> float:
    """Exponential and capped; `jitter` (0.8-1.2 in the agent) keeps a fleet of crash loops
    from pulsing in step."""
    return min(2.0**attempts, BACKOFF_CAP) * jitter


def after_restart(prev: Failure | None, revision: str, now: float, jitter: float) -> Failure:
    """An instance that exited by itself was started again: a crash loop backs off like any failure."""
    attempts = prev.attempts + 1 if prev is not None and prev.revision == revision else 1
    return Failure(revision, RESTARTED, "", False, attempts, now + backoff(attempts, jitter), now)


def after_failure(prev: Failure | None, revision: str, code: str, message: str, terminal: bool,
                  now: float, jitter: float, credentials: str | None = None) -> Failure:
    """A start failed: the streak (and its first time) goes on for the same revision, also
    across the image pulls between its attempts."""
    streak = prev is not None and prev.revision == revision
    attempts = prev.attempts + 1 if prev is not None and streak else 1
    since = prev.since if prev is not None and streak else now
    return Failure(revision, code, message, terminal, attempts, now + backoff(attempts, jitter), since,
                   credentials=credentials)


def while_pending(prev: Failure | None, revision: str, code: str, message: str, now: float) -> Failure:
    """A start goes on in the background (an image pull): report it, ask again at the next pass.
    No attempt of its own, but a streak of failures goes on (a pull failing again backs off more)."""
    streak = prev is not None and prev.revision == revision
    attempts = prev.attempts if prev is not None and streak else 0
    since = prev.since if prev is not None and streak else now
    return Failure(revision, code, message, False, attempts, next_try=now, since=since, pending=True)


@dataclass(frozen=True)
class Action:
    kind: Literal["start", "stop", "remove"]
    workload_id: str
    runtime: str
    restart: bool = False  # start: it exited by itself (counted as a restart, backs off)
    orphan_for: float | None = None  # remove: seconds an unknown instance was left alone; None = undesired


@dataclass(frozen=True)
class Contact:
    """What `persys.agent.decide.disconnect` needs besides the desired set."""

    started_at: float
    last_ack: float | None
    last_full_set: float | None
    grace: float
    heartbeat_interval: float  # as told by the scheduler (adjusted to the grace here)


@dataclass(frozen=True)
class Snapshot:
    now: float
    desired: Mapping[str, Desired]
    observed: Mapping[str, tuple[str, ObservedWorkload]]  # workload -> (runtime name, what it shows)
    runtimes: frozenset[str]  # names of the runtimes that work here
    contact: Contact
    failures: Mapping[str, Failure] = field(default_factory=dict)
    fenced: Mapping[str, float] = field(default_factory=dict)  # stopped for disconnection -> when
    resume: frozenset[str] = frozenset()  # released from a disconnection stop: start regardless of policy
    synced: bool = False  # a full desired set arrived in normal mode since the agent started
    mode: str = "normal"
    known: frozenset[str] = frozenset()  # desired here since the agent started (or in local state)
    unreadable: frozenset[str] = frozenset()  # listed here with a spec this agent cannot read
    orphans: Mapping[str, float] = field(default_factory=dict)  # unknown instance -> first seen
    orphan_grace: float = 30.0
    credentials: str | None = None  # the node's registry credentials now (registry_auth.fingerprint)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    verdict: disconnect.Verdict
    fenced: dict[str, float]  # after this step's fencing and releases
    resume: frozenset[str]
    failures: dict[str, Failure]  # before the actions' outcomes are recorded
    orphans: dict[str, float]
    kept: tuple[str, ...]  # unreadable instances left as they are


def disconnect_snapshot(s: Snapshot) -> disconnect.Snapshot:
    c = s.contact
    policies = {wid: d.spec.disconnect_policy() for wid, d in s.desired.items()
                if d.desired_state == DesiredState.RUNNING}
    return disconnect.Snapshot(
        now=s.now, started_at=c.started_at, last_ack=c.last_ack, last_full_set=c.last_full_set, grace=c.grace,
        heartbeat_interval=disconnect.heartbeat_interval(c.heartbeat_interval, c.grace),
        policies=policies, fenced=s.fenced)


def plan(s: Snapshot) -> Plan:
    verdict = disconnect.decide(disconnect_snapshot(s))
    fenced = {w: at for w, at in s.fenced.items() if w not in verdict.release}
    fenced.update(dict.fromkeys(verdict.fence, s.now))
    resume = set(s.resume) | set(verdict.release)
    failures = dict(s.failures)
    actions: list[Action] = []
    for wid, d in s.desired.items():
        act = _desired_action(s, wid, d, fenced, resume, failures)
        if act is not None:
            actions.append(act)
    orphans = dict(s.orphans)
    kept: list[str] = []
    if s.synced and s.mode == "normal":
        for wid, (runtime, _o) in s.observed.items():
            act = _undesired_action(s, wid, runtime, orphans, kept)
            if act is not None:
                actions.append(act)
    return Plan(tuple(actions), verdict, fenced, frozenset(resume), failures, orphans, tuple(kept))


def _desired_action(s: Snapshot, wid: str, d: Desired, fenced: Mapping[str, float], resume: set[str],
                    failures: dict[str, Failure]) -> Action | None:
    if d.spec.type not in s.runtimes:
        failures[wid] = Failure(d.revision, "RuntimeUnavailable", f"no working {d.spec.type} runtime on this node",
                                True, since=s.now)
        return None
    o = s.observed[wid][1] if wid in s.observed else None
    running = o is not None and o.state == RuntimeState.RUNNING
    if wid in fenced or d.desired_state == DesiredState.STOPPED:
        # Stopped for disconnection (only the scheduler may start it again), or desired Stopped.
        return Action("stop", wid, d.spec.type) if running else None
    if running and o is not None and o.revision == d.revision:
        f = failures.get(wid)
        if f is not None and f.revision == d.revision and not f.terminal:
            del failures[wid]
        return None
    exited = o is not None and not running and o.revision == d.revision and o.state != RuntimeState.MISSING
    if wid in resume:  # the agent stopped it for disconnection: it did not exit by itself
        resume.discard(wid)
        exited = False
    if exited and o is not None:
        policy = d.spec.restart_policy
        if policy == RestartPolicy.NEVER or (policy == RestartPolicy.ON_FAILURE and o.exit_code == 0):
            return None
    f = failures.get(wid)
    if f is not None and f.terminal and f.credentials is not None and f.credentials != s.credentials:
        del failures[wid]  # new registry credentials: a refused pull may succeed now
        f = None
    if f is not None and f.revision == d.revision and (f.terminal or s.now < f.next_try):
        return None
    return Action("start", wid, d.spec.type, restart=exited)


def _undesired_action(s: Snapshot, wid: str, runtime: str, orphans: dict[str, float],
                      kept: list[str]) -> Action | None:
    if wid in s.desired:
        orphans.pop(wid, None)
        return None
    if wid in s.unreadable:
        # Listed for this node, but in a form this agent cannot read: neither start nor remove
        # it (the scheduler keeps such a workload as it is, too).
        kept.append(wid)
        orphans.pop(wid, None)
        return None
    if wid in s.known:
        return Action("remove", wid, runtime)
    # Never desired here since the agent started: an orphan. The scheduler has a grace period
    # to claim it (a restore in progress, a slow replica) before it is removed.
    first = orphans.setdefault(wid, s.now)
    if s.now - first < s.orphan_grace:
        return None
    return Action("remove", wid, runtime, orphan_for=s.now - first)
