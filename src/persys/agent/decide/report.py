"""What the agent tells the scheduler about its instances. Pure: state in, messages out.

`build` turns the desired set, what the runtimes show and the agent's failures into one
WorkloadReport per instance. `select` keeps only what changed since the last report, except
for a complete one (which lets the scheduler act on absences) after (re)connecting, when
something disappeared, and every FULL_REPORT_SECONDS (which also refreshes usage figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.decide import disconnect
from persys.agent.decide.plan import RESTARTED, Desired, Failure
from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.model import DesiredState

FULL_REPORT_SECONDS = 10.0  # a complete report at least this often; changes go out at once

STATE_TO_PB = {
    RuntimeState.RUNNING: pb.WORKLOAD_STATE_RUNNING,
    RuntimeState.STOPPED: pb.WORKLOAD_STATE_STOPPED,
    RuntimeState.FAILED: pb.WORKLOAD_STATE_FAILED,
    RuntimeState.MISSING: pb.WORKLOAD_STATE_MISSING,
}

Fingerprint = tuple[object, ...]


@dataclass(frozen=True)
class Local:
    """The agent's own view next to what the runtimes show."""

    now: float
    desired: Mapping[str, Desired]
    observed: Mapping[str, ObservedWorkload]
    failures: Mapping[str, Failure]
    restarts: Mapping[str, int]
    usage: Mapping[str, ObservedWorkload]  # latest usage samples (the observation's own otherwise)
    fenced: Mapping[str, float]
    failure_grace: float  # a retryable failure is reported Failed only once it lasts this long
    last_exits: Mapping[str, str] = field(default_factory=dict)  # why a restarted instance last exited


def build(s: Local) -> list[pb.WorkloadReport]:
    reports = [_desired_report(s, wid, d) for wid, d in s.desired.items()]
    # Anything still running but no longer desired is listed too, so "complete" is honest.
    for wid, o in s.observed.items():
        if wid not in s.desired:
            reports.append(pb.WorkloadReport(instance_id=wid, revision=o.revision, generation=o.generation,
                                             state=STATE_TO_PB[o.state], runtime_id=o.runtime_id))
    return reports


def _desired_report(s: Local, wid: str, d: Desired) -> pb.WorkloadReport:
    o = s.observed.get(wid)
    r = pb.WorkloadReport(instance_id=wid, generation=d.generation, restarts=s.restarts.get(wid, 0))
    if o is None:
        r.revision = d.revision
        r.state = pb.WORKLOAD_STATE_PENDING
    else:
        _observation(r, o, s.usage.get(wid, o))
        if o.state == RuntimeState.STOPPED and d.desired_state == DesiredState.STOPPED:
            r.reason = "Stopped"
        if o.state == RuntimeState.RUNNING and s.restarts.get(wid) and s.last_exits.get(wid) and not r.message:
            r.message = f"last exit before restart {s.restarts[wid]}: {s.last_exits[wid]}"
        if wid in s.fenced and o.state != RuntimeState.RUNNING:
            r.reason = disconnect.REASON
            r.message = "stopped while no scheduler replica answered (onDisconnect: Stop)"
    f = s.failures.get(wid)
    if f is not None and f.pending and f.revision == d.revision:
        running = o is not None and o.state == RuntimeState.RUNNING
        if not (running and o is not None and o.revision == d.revision):
            # Its image is being pulled: the reason and message say how far (an older revision
            # may still run meanwhile, and is reported as such).
            if not running:
                r.state = pb.WORKLOAD_STATE_PENDING
            r.reason, r.message = f.code, f.message
        return r
    if f is not None and f.revision == d.revision and f.code != RESTARTED and (
            o is None or o.state != RuntimeState.RUNNING):
        if f.terminal or s.now - f.since >= s.failure_grace:
            r.state = pb.WORKLOAD_STATE_FAILED
            r.reason, r.message, r.terminal = f.code, f.message, f.terminal
        else:
            # Within the failure grace period a retryable failure is reported as still
            # starting: one hiccup of a daemon does not make a workload Failed.
            r.state = pb.WORKLOAD_STATE_PENDING
            r.reason = "Retrying"
            r.message = f"attempt {f.attempts} failed ({f.code}: {f.message}); retrying"
    return r


def _observation(r: pb.WorkloadReport, o: ObservedWorkload, u: ObservedWorkload) -> None:
    r.revision = o.revision
    r.state = STATE_TO_PB[o.state]
    r.runtime_id = o.runtime_id
    r.message = o.message
    u.usage.copy_into(r)
    if o.exit_code is not None:
        r.exit_code, r.has_exit_code = o.exit_code, True


def fingerprint(r: pb.WorkloadReport) -> Fingerprint:
    """What makes a report worth sending again (usage figures alone do not)."""
    return (r.revision, r.state, r.reason, r.message, r.terminal, r.runtime_id, r.restarts, r.has_exit_code,
            r.exit_code)


@dataclass(frozen=True)
class Outgoing:
    reports: list[pb.WorkloadReport]
    complete: bool
    seen: dict[str, Fingerprint]  # what the scheduler knows once this is out


def select(reports: list[pb.WorkloadReport], last: Mapping[str, Fingerprint] | None, now: float,
           last_full: float) -> Outgoing | None:
    """What to send (None: nothing changed). `last` is what the scheduler was last told (None:
    nothing yet on this stream); `last_full` when the latest complete report went out."""
    seen = {r.instance_id: fingerprint(r) for r in reports}
    complete = last is None or now - last_full >= FULL_REPORT_SECONDS or not last.keys() <= seen.keys()
    if not complete:
        assert last is not None
        reports = [r for r in reports if last.get(r.instance_id) != seen[r.instance_id]]
        if not reports:
            return None
    return Outgoing(reports, complete, seen)
