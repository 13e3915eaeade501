"""Every failing filter of a node, not only the first (the one `decide` reports and counts).

A node rejected for cpu may be short of memory too; an operator asking what would make a
workload fit needs both. `decide` asks this only for a pending decision and only for a bounded
sample of nodes (`PlacementConfig.detail_nodes`), so placed decisions cost nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .framework import Filter, PlacementContext
from .snapshot import Snapshot, WorkloadRequest
from .status import Status


def every_reason(snapshot: Snapshot, request: WorkloadRequest, filters: Sequence[Filter], node_ids: Iterable[str],
                 ctx: PlacementContext | None = None) -> dict[str, tuple[Status, ...]]:
    """Node id -> every applicable filter's rejection there, in filter order (empty: it fits)."""
    ctx = ctx or PlacementContext(snapshot, request)
    active = [f for f in filters if f.applies(request, ctx)]
    out: dict[str, tuple[Status, ...]] = {}
    for node_id in node_ids:
        node = snapshot.node(node_id)
        if node is None:
            continue
        out[node_id] = tuple(s for s in (f.check(node, request, ctx) for f in active) if s is not None)
    return out


def describe_node(statuses: Sequence[Status]) -> str:
    """`insufficient cpu (needs ..., short by ...); insufficient memory (...)`."""
    return "; ".join(s.message for s in statuses) if statuses else "fits"
