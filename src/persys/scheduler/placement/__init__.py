"""Pure placement engine: snapshot + request -> decision + explanation.

No I/O, no asyncio, no imports from other persys packages; the scheduler converts its model
into :mod:`.snapshot` types and owns the :class:`Reservations` ledger.
"""

from .engine import (
    DEFAULT_CONFIG,
    Decision,
    NodeScore,
    PlacementBatch,
    PlacementConfig,
    aggregate_rejections,
    decide,
    place_many,
    place_many_from,
    refresh_static_verdicts,
)
from .evaluate import NodeEvaluation, evaluate_node
from .filters import DEFAULT_FILTERS
from .framework import Filter, PlacementContext, Scorer
from .scorers import DEFAULT_SCORERS, DEFAULT_WEIGHTS
from .snapshot import (
    LabelConstraint,
    NodeInfo,
    Reservation,
    Reservations,
    ReservationView,
    ReservedOnNode,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRequest,
)
from .status import Status

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_FILTERS",
    "DEFAULT_SCORERS",
    "DEFAULT_WEIGHTS",
    "Decision",
    "Filter",
    "LabelConstraint",
    "NodeEvaluation",
    "NodeInfo",
    "NodeScore",
    "PlacementBatch",
    "PlacementConfig",
    "PlacementContext",
    "Reservation",
    "ReservationView",
    "Reservations",
    "ReservedOnNode",
    "Scorer",
    "Snapshot",
    "Status",
    "Taint",
    "Toleration",
    "WorkloadRequest",
    "aggregate_rejections",
    "decide",
    "evaluate_node",
    "place_many",
    "place_many_from",
    "refresh_static_verdicts",
]
