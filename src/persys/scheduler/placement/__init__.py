"""Pure placement engine: snapshot + request -> decision + explanation.

No I/O, no asyncio, no imports from other persys packages; the scheduler converts its model
into :mod:`.snapshot` types and owns the :class:`Reservations` ledger.
"""

from .counterfactual import Change, Counterfactuals, apply_change, counterfactuals
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
from .preemption import Preemption, preemption
from .reasons import every_reason
from .scorers import DEFAULT_SCORERS, DEFAULT_WEIGHTS
from .snapshot import (
    DeviceNeed,
    DeviceSlot,
    LabelConstraint,
    NodeInfo,
    Reservation,
    Reservations,
    ReservationView,
    ReservedOnNode,
    Snapshot,
    SpreadConstraint,
    Taint,
    Toleration,
    WorkloadRequest,
)
from .status import Status
from .whatif import KINDS as WHATIF_KINDS
from .whatif import Cluster, Operation, Running, WhatIfPlan, affected_nodes, plan_operation

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_FILTERS",
    "DEFAULT_SCORERS",
    "DEFAULT_WEIGHTS",
    "WHATIF_KINDS",
    "Change",
    "Cluster",
    "Counterfactuals",
    "Decision",
    "DeviceNeed",
    "DeviceSlot",
    "Filter",
    "LabelConstraint",
    "NodeEvaluation",
    "NodeInfo",
    "NodeScore",
    "Operation",
    "PlacementBatch",
    "PlacementConfig",
    "PlacementContext",
    "Preemption",
    "Reservation",
    "ReservationView",
    "Reservations",
    "ReservedOnNode",
    "Running",
    "Scorer",
    "Snapshot",
    "SpreadConstraint",
    "Status",
    "Taint",
    "Toleration",
    "WhatIfPlan",
    "WorkloadRequest",
    "affected_nodes",
    "aggregate_rejections",
    "apply_change",
    "counterfactuals",
    "decide",
    "evaluate_node",
    "every_reason",
    "place_many",
    "place_many_from",
    "plan_operation",
    "preemption",
    "refresh_static_verdicts",
]
