"""One node under the microscope: every filter's verdict and the score breakdown.

`decide()` stops at a node's first rejection (that is the reason it reports); an operator
asking "why not node X?" wants every verdict for X, which is what this gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine import DEFAULT_CONFIG, PlacementConfig
from .framework import PlacementContext
from .snapshot import Snapshot, WorkloadRequest
from .status import Status


@dataclass(frozen=True, slots=True)
class NodeEvaluation:
    node_id: str
    verdicts: tuple[tuple[str, Status | None], ...]  # applicable filters in order; None = passed
    breakdown: dict[str, float]  # weighted scorer contributions (only when feasible)

    @property
    def feasible(self) -> bool:
        return all(status is None for _, status in self.verdicts)

    @property
    def total(self) -> float:
        return sum(self.breakdown.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "feasible": self.feasible,
            "filters": [
                {"filter": name, "passed": status is None, **({} if status is None else status.to_dict())}
                for name, status in self.verdicts
            ],
            "total": round(self.total, 3) if self.feasible else None,
            "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
        }


def evaluate_node(
    snapshot: Snapshot, request: WorkloadRequest, node_id: str, config: PlacementConfig = DEFAULT_CONFIG
) -> NodeEvaluation | None:
    """All filter verdicts and, if the node is feasible, its weighted scores (None: no such node)."""
    node = snapshot.node(node_id)
    if node is None:
        return None
    ctx = PlacementContext(snapshot, request)
    verdicts = tuple(
        (f.name, f.check(node, request, ctx)) for f in config.filters if f.applies(request, ctx)
    )
    breakdown: dict[str, float] = {}
    if all(s is None for _, s in verdicts):
        weighted = [(s, config.weight(s.name)) for s in config.scorers if config.weight(s.name) > 0]
        weight_sum = sum(w for _, w in weighted) or 1.0
        for scorer, w in weighted:
            constant = scorer.constant(request, ctx)
            value = constant if constant is not None else scorer.score(node, request, ctx)
            breakdown[scorer.name] = w / weight_sum * value
    return NodeEvaluation(node_id, verdicts, breakdown)
