"""The remediate decision: pure. From the failures the cluster reported and what this policy did
before, which nodes to cordon (after repeated runtime failures, once) and which failed instances
to restart, each under the policy's rate limit (actions per hour).

A node is cordoned once by a policy: if an operator uncordons it, this policy does not cordon it
again (the operator's word stands; the decision says so). An instance is restarted at most once
per failure window.

Disk filling (`relocateOnDiskFilling`, from Persys Intelligence's forecast): a node whose used
disk is forecast to reach `fullPercent` within `withinHours` is cordoned (once, as above) and its
instances moved elsewhere one per evaluation (never those with node-local data, never one twice),
all under the same hourly rate. An unpredictable forecast (its backtest) never acts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from persys.model.automation import DiskFilling, Remediate

HOUR = 3600


@dataclass(frozen=True)
class Failure:
    ts: float
    node: str
    instance: str
    event_id: str


@dataclass(frozen=True)
class NodeView:
    id: str
    cordoned: bool


@dataclass(frozen=True)
class FailedInstance:
    workload: str
    instance: str
    node: str
    reason: str


@dataclass(frozen=True)
class Placed:
    workload: str
    instance: str
    node: str
    local_data: bool = False


@dataclass(frozen=True)
class Filling:
    node: str
    eta: float  # when the forecast says full
    evidence: str
    reason: str


def filling(spec: DiskFilling, now: float, forecasts: Sequence[dict[str, Any]]) -> list[Filling]:
    """The nodes whose disk the forecasts call full within the horizon (pure; the forecast shape
    of intelligence.forecast.Forecast.to_dict)."""
    col = 2 if spec.bound == "lower" else 1
    out = []
    for f in forecasts:
        cap, fc = float(f.get("capacityBytes") or 0), f.get("forecast") or {}
        if cap <= 0 or fc.get("unpredictable", True):
            continue
        limit = cap * float(spec.full_percent) / 100
        horizon = now + float(spec.within_hours) * 3600
        eta = next((float(p[0]) for p in fc.get("points") or [] if now <= float(p[0]) <= horizon
                    and float(p[col]) >= limit), None)
        if eta is None:
            continue
        out.append(Filling(str(f["node"]), eta, str(f.get("evidence", ""))[:200],
                           f"disk of {f['node']} forecast at {spec.full_percent}% of {cap / 2**30:.1f} GiB "
                           f"in {(eta - now) / 3600:.1f} h ({spec.bound} bound of the 80 % interval, "
                           f"MASE {fc.get('mase')})"))
    return sorted(out, key=lambda x: (x.eta, x.node))


@dataclass(frozen=True)
class Done:
    ts: float
    type: str  # cordon | restart
    target: str  # node id or workload


@dataclass(frozen=True)
class Planned:
    type: str  # cordon | restart | none
    target: str
    held_by: str  # "" (do it) | hold | rate | ...
    reason: str
    evidence: tuple[str, ...] = ()  # event ids (or Intelligence's, see evidence_source)
    evidence_source: str = "events"


def plan(spec: Remediate, now: float, failures: Sequence[Failure], nodes: Sequence[NodeView],
         failed: Sequence[FailedInstance], done: Sequence[Done], full: Sequence[Filling] = (),
         placed: Sequence[Placed] = ()) -> list[Planned]:
    out: list[Planned] = []
    used = sum(1 for d in done if d.ts > now - HOUR)

    def budget(p: Planned) -> Planned:
        nonlocal used
        if p.held_by:
            return p
        if used >= spec.max_actions_per_hour:
            return Planned(p.type, p.target, "rate", f"{p.reason}; rate: {used} actions in the last hour of "
                           f"{spec.max_actions_per_hour} allowed", p.evidence, p.evidence_source)
        used += 1
        return p

    recent = [f for f in failures if f.ts > now - spec.failure_window_seconds]
    cordoned_by_us = {d.target for d in done if d.type == "cordon"}
    for n in sorted(nodes, key=lambda n: n.id):
        mine = [f for f in recent if f.node == n.id]
        if len(mine) < spec.cordon_after_failures:
            continue
        ids = tuple(f.event_id for f in mine[-8:])
        why = f"{len(mine)} runtime failures on {n.id} in {spec.failure_window_seconds}s " \
              f"(cordonAfterFailures {spec.cordon_after_failures})"
        if n.cordoned:
            continue  # already out of placement: nothing to decide
        if n.id in cordoned_by_us:
            out.append(Planned("cordon", n.id, "hold", f"{why}; this policy cordoned it once already and it was "
                               "uncordoned since: left to the operator", ids))
            continue
        out.append(budget(Planned("cordon", n.id, "", why, ids)))
    cordons = {p.target for p in out if p.type == "cordon"}
    out += _relocations(full, [n for n in nodes if n.id not in cordons], placed, done, cordoned_by_us, budget)
    if spec.restart_unhealthy:
        out += _restarts(spec, now, failed, done, budget)
    return out


def _restarts(spec: Remediate, now: float, failed: Sequence[FailedInstance], done: Sequence[Done],
              budget: Any) -> list[Planned]:
    """A restart per workload with a Failed instance, unless this policy restarted it within the
    failure window."""
    out: list[Planned] = []
    restarted = {d.target for d in done if d.type == "restart" and d.ts > now - spec.failure_window_seconds}
    seen: set[str] = set()
    for f in sorted(failed, key=lambda f: f.instance):
        target = f.workload  # a restart is the workload's (persysctl restart): once for all its instances
        if target in seen:
            continue
        seen.add(target)
        why = f"instance {f.instance} Failed on {f.node or '?'}: {f.reason}"
        if target in restarted:
            out.append(Planned("restart", target, "hold", f"{why}; restarted within the last "
                               f"{spec.failure_window_seconds}s already"))
            continue
        out.append(budget(Planned("restart", target, "", why)))
    return out


def _relocations(full: Sequence[Filling], nodes: Sequence[NodeView], placed: Sequence[Placed],
                 done: Sequence[Done], cordoned_by_us: set[str], budget: Any) -> list[Planned]:
    """Per filling node: cordon it (once), then move one of its instances per evaluation."""
    out: list[Planned] = []
    known = {n.id: n for n in nodes}
    moved = {d.target for d in done if d.type == "relocate"}
    for f in full:
        n = known.get(f.node)
        if n is None:
            continue
        ev = (f.evidence,) if f.evidence else ()
        if not n.cordoned:
            if n.id in cordoned_by_us:
                out.append(Planned("cordon", n.id, "hold", f"{f.reason}; this policy cordoned it once already and "
                                   "it was uncordoned since: left to the operator", ev, "intelligence"))
            else:
                out.append(budget(Planned("cordon", n.id, "", f.reason, ev, "intelligence")))
        movable = sorted((p for p in placed if p.node == f.node and not p.local_data
                          and f"{p.workload}/{p.instance}" not in moved), key=lambda p: p.instance)
        if movable:
            p = movable[0]
            out.append(budget(Planned("relocate", f"{p.workload}/{p.instance}", "",
                                      f"{f.reason}; moving {p.instance} off {f.node}", ev, "intelligence")))
    return out
