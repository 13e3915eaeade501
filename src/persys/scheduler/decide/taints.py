"""NoExecute taints evict (pure; `scheduler.taint_eviction` times the wake-ups): an instance on a
node with a NoExecute taint it does not tolerate leaves at once; one tolerating it with
`tolerationSeconds` leaves that long after the taint was added; one tolerating it without
seconds stays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from persys.model import Node, Taint
from persys.model.workload import Toleration
from persys.scheduler import placement as pl


@dataclass(frozen=True, slots=True)
class Eviction:
    taint: Taint
    due: float  # wall clock: evict once now >= due

    def why(self, node_id: str) -> str:
        return f"node {node_id} has taint {self.taint} (NoExecute)"


def _tolerates(t: Toleration, taint: Taint) -> bool:
    return pl.Toleration(t.key, t.operator, t.value, t.effect).tolerates(pl.Taint(taint.key, taint.value, taint.effect))


def eviction(node: Node, tolerations: Sequence[Toleration]) -> Eviction | None:
    """When the instance must leave `node` because of its NoExecute taints (the earliest), or
    None: it may stay."""
    first: Eviction | None = None
    for taint in node.effective_taints():
        if taint.effect != "NoExecute":
            continue
        added = taint.added_at if taint.added_at is not None else node.registered_at
        matching = [t for t in tolerations if _tolerates(t, taint)]
        if matching and any(t.toleration_seconds is None for t in matching):
            continue  # tolerated for as long as the taint stays
        seconds = min((t.toleration_seconds or 0 for t in matching), default=0)
        due = added + seconds if matching else added
        if first is None or due < first.due:
            first = Eviction(taint, due)
    return first
