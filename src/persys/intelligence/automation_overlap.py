"""Rightsizing beside automation: a warning when an automation policy acts on the same
workload's same metric. Pure: the policies as `ListAutomationPolicies` answers them in.

Why it matters (VPA and HPA on one metric, docs/intelligence.md): an autoscale policy on CPU
adds replicas when the per-replica CPU is over its target. Rightsizing reads the same per-replica
samples; while the policy acts, they are the policy's doing as much as the workload's (more
replicas, less each), so a request fitted to them fights the policy: a smaller request after a
scale-out, a scale-in after it, and so on. The recommendation stands, with the warning beside
it; nothing is changed. Paused and dry-run policies still count (they can be resumed at any time),
and say so."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class Overlap:
    policy: str
    version: int
    metric: str  # cpu | memory: the resource of the recommendation it concerns
    target: float
    paused: bool
    dry_run: bool

    @property
    def evidence(self) -> str:
        return f"policy/{self.policy}@v{self.version}"

    @property
    def message(self) -> str:
        unit = "% of a core per replica" if self.metric == "cpu" else " MiB per replica"
        state = " (paused)" if self.paused else " (dry run)" if self.dry_run else ""
        return (f"automation policy {self.policy}{state} scales this workload on {self.metric} (target "
                f"{self.target:g}{unit}): its samples are shaped by that policy's scaling, and a new "
                f"{self.metric} request would change when it scales; change one, then watch the other")

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "metric": self.metric, "target": self.target, "paused": self.paused,
                "dryRun": self.dry_run, "evidence": self.evidence, "message": self.message}


def overlaps(policies: Iterable[Mapping[str, Any]], workload: str) -> list[Overlap]:
    """The autoscale policies acting on `workload`'s CPU or memory, by name. Malformed entries are
    skipped (the scheduler validated them; this reads what it is given)."""
    out = []
    for p in policies:
        spec = p.get("spec") if isinstance(p, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        auto = spec.get("autoscale")
        if not isinstance(auto, Mapping) or auto.get("workload") != workload:
            continue
        metric = auto.get("metric", "cpu")
        if metric not in RESOURCES:
            continue
        try:
            target = float(auto.get("target", 0))
            version = int(p.get("version", 1))
        except (TypeError, ValueError):
            continue
        out.append(Overlap(str(p.get("name", "")), version, str(metric), target, bool(spec.get("paused")),
                           bool(spec.get("dryRun"))))
    return sorted(out, key=lambda o: (o.metric, o.policy))


def annotate(answer: dict[str, Any], found: list[Overlap]) -> dict[str, Any]:
    """A rightsize answer with `warnings` (all) and each resource's own `warnings`; the policies
    cited as evidence."""
    out = {**answer, "warnings": [o.to_dict() for o in found]}
    for res in RESOURCES:
        if isinstance(out.get(res), dict):
            out[res] = {**out[res], "warnings": [o.message for o in found if o.metric == res]}
    out["evidence"] = [*answer.get("evidence", []), *(o.evidence for o in found)]
    return out
