"""Default scorers. Each returns [0, 100]; the engine applies the configured weights.

Each also scores a whole candidate list at once (`score_many`, one comprehension instead of a
method call per node): the engine scores about a hundred candidates per decision, and this is
its hottest loop. `score` is `score_many` of one node, so breakdowns and totals always agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from .framework import PlacementContext, Scorer
from .snapshot import NodeInfo, WorkloadRequest


class CpuHeadroom(Scorer):
    """Fraction of CPU left free after placement: spreads load instead of packing."""

    name = "cpu_headroom"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        need = request.cpu_millicores
        return [100.0 * (n.cpu_millicores - n.committed_cpu - need) / n.cpu_millicores
                if n.cpu_millicores > 0 and n.cpu_millicores - n.committed_cpu - need > 0 else 0.0 for n in nodes]


class MemoryHeadroom(Scorer):
    name = "memory_headroom"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        need = request.memory_mb
        return [100.0 * (n.memory_mb - n.committed_memory_mb - need) / n.memory_mb
                if n.memory_mb > 0 and n.memory_mb - n.committed_memory_mb - need > 0 else 0.0 for n in nodes]


class Spread(Scorer):
    """Fewer replicas of the same service on the node, and in its topology domain, is better.

    Without ``spread_label`` only the node counts; with it, node and domain weigh half each.
    A node missing the spread label forms its own domain.
    """

    name = "spread"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        snap = ctx.snapshot
        static = snap.static
        group = request.group
        # Nodes holding replicas: from the base index plus any reservation overlay.
        positions = set(static.service_nodes.get(group, ()))
        positions.update(snap.reserved_groups.get(group, ()))
        if not positions:
            ctx.scratch["spread.domains"] = {}
            return 100.0  # no replica anywhere: every node is equally good, skip per-node work
        label = request.spread_label
        domains: dict[str, int] = {}
        if label:
            effective = snap.effective
            for i in positions:
                node = effective[i]
                value = node.labels.get(label)
                if value is not None:
                    domains[value] = domains.get(value, 0) + node.service_counts.get(group, 0)
        ctx.scratch["spread.domains"] = domains
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        group, label = request.group, request.spread_label
        if not label:
            return [100.0 / (1 + n.service_counts.get(group, 0)) for n in nodes]
        if "spread.domains" not in ctx.scratch:  # called directly, not via the engine
            self.constant(request, ctx)
        domains: dict[str, int] = ctx.scratch.get("spread.domains", {})
        out = []
        for n in nodes:
            here = n.service_counts.get(group, 0)
            value = n.labels.get(label)
            # A node without the label is its own domain.
            in_domain = here if value is None else domains.get(value, 0)
            out.append(50.0 / (1 + here) + 50.0 / (1 + in_domain))
        return out


class Commitments(Scorer):
    """Fewer workloads already on the node is better (smaller blast radius, less churn)."""

    name = "commitments"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        return [100.0 / (1 + n.workload_count) for n in nodes]


class TaintPenalty(Scorer):
    """Each untolerated PreferNoSchedule taint halves the score."""

    name = "taint_penalty"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None if ctx.snapshot.static.has_soft_taints else 100.0

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        tolerations = request.tolerations
        out = []
        for n in nodes:
            untolerated = 0
            for taint in n.taints:
                if taint.effect == "PreferNoSchedule" and not any(t.tolerates(taint) for t in tolerations):
                    untolerated += 1
            out.append(100.0 / (2**untolerated))
        return out


class ObservedLoad(Scorer):
    """Load-aware scoring (optional, weight 0 by default): a node whose observed utilisation
    (recent p95 cpu and memory, from its heartbeats) is lower scores higher, beside the
    request-based headroom: `100 * (1 - (cpu% / 100 + used memory / capacity) / 2)`; a node not
    measured scores 50. Requests stay the fit rule: observation only orders feasible nodes."""

    name = "observed_load"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return self.score_many((node,), request, ctx)[0]

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        out = []
        for n in nodes:
            if n.observed_cpu_percent is None or n.observed_memory_mb is None:
                out.append(50.0)
                continue
            cpu = min(max(n.observed_cpu_percent, 0.0), 100.0) / 100.0
            mem = min(max(n.observed_memory_mb / n.memory_mb, 0.0), 1.0) if n.memory_mb > 0 else 1.0
            out.append(100.0 * (1.0 - (cpu + mem) / 2.0))
        return out


DEFAULT_SCORERS: tuple[Scorer, ...] = (
    CpuHeadroom(),
    MemoryHeadroom(),
    Spread(),
    Commitments(),
    TaintPenalty(),
    ObservedLoad(),
)

DEFAULT_WEIGHTS: dict[str, float] = {
    "cpu_headroom": 1.0,
    "memory_headroom": 1.0,
    "spread": 2.0,  # availability beats bin-packing for replicated services
    "commitments": 0.5,
    "taint_penalty": 1.0,
    "observed_load": 0.0,  # optional: `persys scheduler --load-aware-weight`
}
