"""Observed state: workload status, assignments and cluster events."""

from __future__ import annotations

import operator
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, Field

from persys.model.base import Model
from persys.model.workload import DesiredState


class Phase(StrEnum):
    PENDING = "Pending"  # not placed: the reason says why
    SCHEDULED = "Scheduled"  # placed, waiting for the agent to report
    RUNNING = "Running"
    STOPPED = "Stopped"
    FAILED = "Failed"
    DELETING = "Deleting"


# Reasons of a start under way on its node (its image pull), each published as an event of
# that kind when an instance's status turns to it (with the message: image, bytes, seconds).
IMAGE_PULLING = "ImagePulling"
IMAGE_PULLED = "ImagePulled"
PROGRESS_REASONS = frozenset({IMAGE_PULLING, IMAGE_PULLED})


class WorkloadUsage(Model):
    """What one workload instance uses, the one type for it from the runtime that measures it to
    the API that shows it. The byte counters are cumulative since the instance started; 0 where the
    runtime cannot tell. The protobuf `WorkloadReport` spells the same fields (`of`, `copy_into`)."""

    cpu_percent: float = 0.0  # 100 = one full host core, as `docker stats` counts
    memory_bytes: int = 0
    disk_read_bytes: int = 0
    disk_write_bytes: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0

    @classmethod
    def of(cls, source: object) -> WorkloadUsage | None:
        """The figures of anything that has them as attributes of the same names (a protobuf
        report), or None when all are 0: nothing measured, not worth a record per instance."""
        values = _read_usage(source)
        return cls(**dict(zip(_USAGE_FIELDS, values, strict=True))) if any(values) else None

    def copy_into(self, target: object) -> None:
        """Sets the same-named attributes of `target` (a protobuf report) to these figures."""
        for name in _USAGE_FIELDS:
            setattr(target, name, getattr(self, name))

    @property
    def measured(self) -> bool:
        return any(getattr(self, name) for name in _USAGE_FIELDS)


# Read once: pydantic's `model_fields` costs microseconds per access, and reports come in bulk.
_USAGE_FIELDS: tuple[str, ...] = tuple(WorkloadUsage.model_fields)
_read_usage = operator.attrgetter(*_USAGE_FIELDS)


class WorkloadStatus(Model):
    """Stored at `/persys/status/<instance id>` (one per replica; replica 0's id is the workload's);
    written on transitions, not on every report."""

    phase: Phase = Phase.PENDING
    node_id: str = ""
    reason: str = ""
    message: str = ""
    observed_revision: str = ""
    runtime_id: str = ""
    restarts: int = 0
    updated_at: float = 0.0
    placement: dict[str, Any] = Field(default_factory=dict)  # the placement decision's explanation
    # Node holding this instance's node-local volumes: later placements must return there.
    volume_node: str = ""
    # The node this instance is being moved off (drain, node loss); it is placed again once
    # that node no longer runs it (or is lost).
    relocating_from: str = ""
    # The node whose agent last confirmed this instance gone (after its assignment there was
    # withdrawn): how the placing replica learns it without owning that node's agent.
    left_node: str = ""
    # A move (`persysctl move`, the rebalance policy; scheduler.instance_move): the node it is
    # being moved off (never placed back there) and the node the engine verified for it (tried
    # first; any other node if that no longer fits); both cleared once placed. `moved_at` stays:
    # the rebalance policy holds back what moved recently.
    moving_off: str = ""
    move_to: str = ""
    moved_at: float = 0.0
    # Drift found between this instance's assignment and its agent's report: kind, the rule that
    # matched, the remediation, and since when (empty when in sync).
    drift: dict[str, Any] = Field(default_factory=dict)
    # Not written by the scheduler, which keeps live usage in memory (from agents' reports); the
    # field stays so documents that carry it still load. None: no model per status in memory.
    usage: WorkloadUsage | None = None


class Assignment(Model):
    """Stored at `/persys/assignments/<node>/<instance>`: the desired state one agent must apply.

    `generation` fences stale copies: an agent only acts on the newest generation it has seen
    for an instance.
    """

    # An instance id (`web.0`). Stored and shown as `workloadId`, its name before the rename: the
    # documents already in a store, and replicas of the previous version, read that key.
    instance_id: str = Field(validation_alias=AliasChoices("workloadId", "instanceId"),
                             serialization_alias="workloadId")
    node_id: str
    revision: str
    generation: int
    desired_state: DesiredState
    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    # Ids of the node's devices (GPUs) given to the instance; None (left out of the document) when none.
    devices: list[str] | None = None
    created_at: float = 0.0
