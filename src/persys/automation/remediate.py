"""The remediate decision: pure. From the failures the cluster reported and what this policy did
before, which nodes to cordon (after repeated runtime failures, once) and which failed instances
to restart, each under the policy's rate limit (actions per hour).

A node is cordoned once by a policy: if an operator uncordons it, this policy does not cordon it
again (the operator's word stands; the decision says so). An instance is restarted at most once
per failure window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from persys.model.automation import Remediate

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
    evidence: tuple[str, ...] = ()  # event ids


def plan(spec: Remediate, now: float, failures: Sequence[Failure], nodes: Sequence[NodeView],
         failed: Sequence[FailedInstance], done: Sequence[Done]) -> list[Planned]:
    out: list[Planned] = []
    used = sum(1 for d in done if d.ts > now - HOUR)

    def budget(p: Planned) -> Planned:
        nonlocal used
        if p.held_by:
            return p
        if used >= spec.max_actions_per_hour:
            return Planned(p.type, p.target, "rate", f"{p.reason}; rate: {used} actions in the last hour of "
                           f"{spec.max_actions_per_hour} allowed", p.evidence)
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
    if spec.restart_unhealthy:
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
