"""Plugin interfaces: one small class per filter or score step (kube-scheduler framework style)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .snapshot import NodeInfo, Snapshot, WorkloadRequest
from .status import Status


@dataclass(slots=True)
class PlacementContext:
    """Per-decision state shared by plugins.

    ``scratch`` lets a plugin precompute request-wide data once (in ``applies``/``constant``)
    instead of once per node.
    """

    snapshot: Snapshot
    request: WorkloadRequest
    scratch: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Filter(Protocol):
    name: str
    # True when the verdict depends only on the node's static facts and on the part of the
    # request the filter's optional `static_key(request)` returns (default: request.type): the
    # engine then evaluates it once per node set and key instead of once per decision. A static
    # filter may also answer for every node at once with an optional
    # `static_groups(request, nodes: verdicts.NodeBits) -> {Status: node bit set}`.
    static: bool

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        """False when this filter cannot reject any node for this request (skipped entirely)."""
        ...

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        """None if the node passes, else the rejection."""
        ...


@runtime_checkable
class Scorer(Protocol):
    name: str

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        """A score shared by every node for this request, or None to score node by node."""
        ...

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        """Score in [0, 100]; higher is better."""
        ...
