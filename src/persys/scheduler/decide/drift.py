"""Drift: where what an agent reports differs from what the scheduler assigned to it.

Pure: one node's assignments and its agent's report in, a list of findings out. Each finding
names the rule that matched and the remediation that applies, which the scheduler records on
the workload (shown by `persysctl describe`) and publishes as a DriftDetected event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from persys.model import Assignment, DesiredState, Phase, RestartPolicy

# A just-made assignment is not "missing" before the agent had a chance to act on it.
MISSING_AFTER_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Drift:
    kind: str  # orphan | stale-copy | missing | unexpected-stop | revision
    instance: str
    rule: str  # why this counts as drift
    action: str  # what remediates it (or why nothing does)

    def key(self) -> tuple[str, str]:
        return self.instance, self.kind


@dataclass(frozen=True, slots=True)
class Reported:
    instance: str
    revision: str
    phase: Phase
    terminal: bool = False


def detect(
    node_id: str,
    assigned: Mapping[str, Assignment],
    reports: Sequence[Reported],
    complete: bool,
    placement_of: Callable[[str], str | None],
    restart_policy: Callable[[str], RestartPolicy | None],
    now: float,
) -> list[Drift]:
    found = _unassigned(node_id, assigned, reports, placement_of, restart_policy)
    by_instance = {r.instance: r for r in reports}
    for inst, a in assigned.items():
        rep = by_instance.get(inst)
        if rep is None:
            if complete and now - a.created_at > MISSING_AFTER_SECONDS:
                found.append(Drift("missing", inst, f"assigned to {node_id} but its agent does not report it",
                                   "the desired state is sent to the agent again"))
            continue
        if a.desired_state == DesiredState.RUNNING and rep.phase in (Phase.STOPPED, Phase.FAILED):
            found.append(Drift("unexpected-stop", inst, "desired Running but the agent reports it "
                                                       f"{rep.phase.value.lower()}",
                               _stop_action(rep, restart_policy(inst))))
        elif rep.phase == Phase.RUNNING and rep.revision and rep.revision != a.revision:
            found.append(Drift("revision", inst, f"the agent runs revision {rep.revision}, desired {a.revision}",
                               "the agent replaces it with the desired revision"))
    return found


def _unassigned(
    node_id: str,
    assigned: Mapping[str, Assignment],
    reports: Sequence[Reported],
    placement_of: Callable[[str], str | None],
    restart_policy: Callable[[str], RestartPolicy | None],
) -> list[Drift]:
    """What the node runs without it being assigned there: an orphan, or a stale copy of an
    instance assigned elsewhere."""
    found: list[Drift] = []
    for r in reports:
        if r.instance in assigned:
            continue
        elsewhere = placement_of(r.instance)
        if restart_policy(r.instance) is None:
            found.append(Drift("orphan", r.instance, f"node {node_id} runs it but the cluster has no such workload",
                               "the agent stops and removes it after its orphan grace period"))
        elif elsewhere and elsewhere != node_id:
            found.append(Drift("stale-copy", r.instance, f"it is assigned to {elsewhere}, not {node_id}",
                               f"the agent on {node_id} stops it: it is not in that node's desired state"))
        # Not assigned anywhere: being deleted or rescheduled; the agent removes it in the normal flow.
    return found


def _stop_action(rep: Reported, policy: RestartPolicy | None) -> str:
    """What follows an unexpected stop: nothing (terminal, or restartPolicy Never) or a restart."""
    if rep.terminal:
        return "none: the failure is terminal; apply a corrected spec"
    if policy == RestartPolicy.NEVER:
        return "none: restartPolicy is Never"
    return f"the agent restarts it with backoff (restartPolicy {policy})"


@dataclass(frozen=True, slots=True)
class Tracked:
    """What one report changes in a node's open findings (see `track`)."""

    known: dict[tuple[str, str], tuple[Drift, float]]  # the node's open findings, with since when
    detected: list[Drift]  # new since the last report: published as DriftDetected
    resolved: list[Drift]  # gone since: published as DriftResolved
    records: dict[str, dict[str, Any]]  # instance -> the record its status shows

    @property
    def resync(self) -> bool:
        """A new "missing" finding: the remediation is sending the whole desired state again."""
        return any(d.kind == "missing" for d in self.detected)


def track(known: Mapping[tuple[str, str], tuple[Drift, float]], found: Sequence[Drift],
          listed: set[str] | None, now: float) -> Tracked:
    """Fold one report's findings into a node's open ones. `listed`: the instances a partial
    report names (None: the report is complete). A partial report (only what changed) says
    nothing about the instances it does not list, so only theirs can be resolved by it."""
    out = dict(known)
    now_keys = {d.key(): d for d in found}
    detected = [d for k, d in now_keys.items() if k not in out]
    for d in detected:
        out[d.key()] = (d, now)
    resolved = []
    for k in [k for k, (d, _) in out.items() if k not in now_keys and (listed is None or d.instance in listed)]:
        resolved.append(out.pop(k)[0])
    records: dict[str, dict[str, Any]] = {
        d.instance: {"kind": d.kind, "rule": d.rule, "action": d.action, "since": since}
        for d, since in out.values()}
    return Tracked(out, detected, resolved, records)
