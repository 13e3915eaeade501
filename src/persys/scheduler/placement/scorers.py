"""Default scorers. Each returns [0, 100]; the engine applies the configured weights."""

from __future__ import annotations

from .framework import PlacementContext, Scorer
from .snapshot import NodeInfo, WorkloadRequest


class CpuHeadroom:
    """Fraction of CPU left free after placement: spreads load instead of packing."""

    name = "cpu_headroom"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        cap = node.cpu_millicores
        if cap <= 0:
            return 0.0
        left = cap - node.committed_cpu - request.cpu_millicores
        return 100.0 * left / cap if left > 0 else 0.0


class MemoryHeadroom:
    name = "memory_headroom"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        cap = node.memory_mb
        if cap <= 0:
            return 0.0
        left = cap - node.committed_memory_mb - request.memory_mb
        return 100.0 * left / cap if left > 0 else 0.0


class Spread:
    """Fewer replicas of the same service on the node, and in its topology domain, is better.

    Without ``spread_label`` only the node counts; with it, node and domain weigh half each.
    A node missing the spread label forms its own domain.
    """

    name = "spread"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        snap = ctx.snapshot
        static = snap._static
        group = request.group
        # Nodes holding replicas: from the base index plus any reservation overlay.
        positions = set(static.service_nodes.get(group, ()))
        for node_id, reserved in snap.reservations.by_node.items():
            if reserved.services.get(group) and node_id in static.by_id:
                positions.add(static.by_id[node_id])
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
        here = node.service_counts.get(request.group, 0)
        node_score = 100.0 / (1 + here)
        label = request.spread_label
        if not label:
            return node_score
        value = node.labels.get(label)
        if value is None:
            return 0.5 * node_score + 50.0 / (1 + here)
        if "spread.domains" not in ctx.scratch:  # called directly, not via the engine
            self.constant(request, ctx)
        in_domain = ctx.scratch.get("spread.domains", {}).get(value, 0)
        return 0.5 * node_score + 50.0 / (1 + in_domain)


class Commitments:
    """Fewer workloads already on the node is better (smaller blast radius, less churn)."""

    name = "commitments"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return 100.0 / (1 + node.workload_count)


class TaintPenalty:
    """Each untolerated PreferNoSchedule taint halves the score."""

    name = "taint_penalty"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None if ctx.snapshot._static.has_soft_taints else 100.0

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        untolerated = 0
        for taint in node.taints:
            if taint.effect == "PreferNoSchedule" and not any(
                t.tolerates(taint) for t in request.tolerations
            ):
                untolerated += 1
        return 100.0 / (2**untolerated)


DEFAULT_SCORERS: tuple[Scorer, ...] = (
    CpuHeadroom(),
    MemoryHeadroom(),
    Spread(),
    Commitments(),
    TaintPenalty(),
)

DEFAULT_WEIGHTS: dict[str, float] = {
    "cpu_headroom": 1.0,
    "memory_headroom": 1.0,
    "spread": 2.0,  # availability beats bin-packing for replicated services
    "commitments": 0.5,
    "taint_penalty": 1.0,
}
