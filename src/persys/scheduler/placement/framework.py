"""Plugin interfaces: one small class per filter or score step (kube-scheduler framework style).

Every method the engine calls is declared here. The optional ones carry a default body: a plugin
that subclasses the protocol inherits it, one written from scratch must spell it out (mypy says
which is missing), and the engine never probes a plugin with `hasattr`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .nodebits import NodeBits
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
    # request `static_key` returns: the engine then evaluates it once per node set and key
    # instead of once per decision.
    static: bool

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        """False when this filter cannot reject any node for this request (skipped entirely)."""
        ...

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        """None if the node passes, else the rejection."""
        ...

    def static_key(self, request: WorkloadRequest) -> object:
        """The part of the request a static verdict depends on (default: the workload type)."""
        return request.type

    def static_groups(self, request: WorkloadRequest, nodes: NodeBits) -> dict[Status, int] | None:
        """A static filter's verdict on every node at once, {Status: node bit set}, or None
        (the default) to be asked node by node with `check`; both must agree."""
        return None


@runtime_checkable
class Scorer(Protocol):
    name: str

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        """A score shared by every node for this request, or None to score node by node."""
        ...

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        """Score in [0, 100]; higher is better."""
        ...

    def score_many(self, nodes: Sequence[NodeInfo], request: WorkloadRequest, ctx: PlacementContext) -> list[float]:
        """`score` of each node, in order; a scorer overrides it to batch its hottest loop."""
        return [self.score(node, request, ctx) for node in nodes]
