"""The shapes of the documents a replica shows (views/documents.py builds them as plain dicts, which go
over gRPC as JSON unchanged), declared as pydantic models so that the gateway's OpenAPI
document has real response schemas. tests/scheduler/test_view_models.py checks that every
view validates against its model with no undeclared field, so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class View(BaseModel):
    """camelCase on the wire (Python names stay snake_case); no undeclared fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Score(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str
    total: float
    breakdown: dict[str, float]


class PlacementView(BaseModel):
    """A placement decision as stored on a status, scores spelled out (empty: not placed yet)."""

    model_config = ConfigDict(extra="forbid")
    node_id: str | None = None
    feasible: int = 0
    total: int = 0
    evaluated: int = 0
    scores: list[Score] = []
    explanation: str = ""
    # Pending: every failing filter of each detailed node ({code, message} and, for a fit
    # failure, needed, available, shortBy, unit).
    reasons: dict[str, list[dict[str, Any]]] = {}
    codes: list[str] = []  # Pending: the codes nodes were rejected with
    # What the decision saw beyond the store (placement.record: rev, engine, inflight, unheard,
    # observed, omitted): `explain --at rev` replays it.
    seen: dict[str, Any] = {}
    devices: list[str] = []  # the node's devices (GPUs) the placement was given


class UsageView(View):
    cpu_percent: float
    memory_bytes: int
    disk_read_bytes: int
    disk_write_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


class InstanceView(View):
    instance: str
    node: str
    phase: str
    reason: str
    message: str
    observed_revision: str
    runtime_id: str
    restarts: int
    usage: UsageView
    placement: PlacementView
    drift: dict[str, Any]
    updated_at: float
    moved_at: float = 0.0  # the last move (persysctl move, rebalance): 0 never


class DriftView(View):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    instance: str
    kind: str
    rule: str
    action: str
    since: float


class WorkloadView(View):
    """A workload and its instances (`spec` only when one workload is asked for)."""

    id: str
    name: str
    type: str
    labels: dict[str, str]
    desired_state: str
    revision: str
    generation: int
    replicas: int
    ready: str
    phase: str
    node: str
    nodes: list[str]
    reason: str
    message: str
    observed_revision: str
    runtime_id: str
    restarts: int
    usage: UsageView
    placement: PlacementView
    drift: list[DriftView]
    instances: list[InstanceView]
    created_at: float
    updated_at: float
    spec: dict[str, Any] | None = None


class RefusedWorkloadView(View):
    """A stored workload the model refuses (mirror/quarantine.py): shown, never placed."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    id: str
    phase: str
    reason: str
    message: str


class Allocated(View):
    cpu_millicores: int
    memory_mb: int
    disk_mb: int
    workloads: int


class NodeView(View):
    """A node as stored (what its agent registered and operators set) with what is allocated
    on it, its effective labels and taints, and the last heartbeat and usage this replica saw."""

    id: str
    address: str
    agent_version: str
    capabilities: dict[str, Any]
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    status: str
    status_reason: str
    cordoned: bool
    draining: bool
    drain_deadline: float
    admin_labels: dict[str, str]
    admin_taints: list[dict[str, Any]]
    registered_at: float
    last_heartbeat: float
    usage: dict[str, Any]
    allocated: Allocated
    workloads: list[str]  # instance ids


class DrainInstance(View):
    instance: str
    phase: str = ""
    node: str = ""
    message: str = ""
    reason: str = ""


class DrainStatus(View):
    node: str
    draining: bool
    cordoned: bool
    deadline: float
    remaining: list[DrainInstance]
    moving: list[DrainInstance]
    blocked: list[DrainInstance]
    done: bool


class ReplicaExplanation(View):
    instance: str
    phase: str
    node: str
    explanation: str
    decision: PlacementView


class Explanation(View):
    """Why a workload's replicas are where they are; `node`: every filter's verdict there."""

    workload: str
    replicas: list[ReplicaExplanation]
    node: dict[str, Any] | None = None


class ReplayAnswer(View):
    node: str  # "" when Pending
    explanation: str
    decision: dict[str, Any] | None = None  # the replayed Decision.to_dict()


class ReplayedReplica(View):
    instance: str
    recorded: ReplayAnswer
    replayed: ReplayAnswer
    seen: dict[str, Any]  # what the decision saw beyond the store (engine, inflight, unheard, ...)
    agrees: bool


class ReplayView(View):
    """`explain --at REV`: the replicas decided at that revision, decided again (scheduler/api/replay.py)."""

    workload: str
    at: int
    agrees: bool
    replicas: list[ReplayedReplica]


class RevisionView(View):
    """One kept revision of a workload's spec (revisions.history)."""

    workload: str
    generation: int
    revision: str
    created_at: float
    change: str  # what it changed from the revision before it
    rollback_of: int | None = None  # the generation a rollback applied again
    current: bool  # the newest: the spec in force
    spec: dict[str, Any]


class RevisionList(View):
    workload: str
    items: list[RevisionView]


class RollbackView(View):
    """What a rollback did: applied `toGeneration`'s spec, as `generation` (unchanged if it ran already)."""

    workload: str
    from_generation: int
    to_generation: int
    generation: int
    revision: str
    changed: bool


class LivenessView(View):
    suspended: bool
    since: float
    ends_at: float
    reason: str
    silent_nodes: int
    judged_nodes: int


class MirrorView(View):
    revision: int
    store_revision: int
    lag: int
    watch: str
    compaction_recoveries: int


class DependencyView(View):
    """One dependency of the scheduler: ok or not, and why."""

    name: str
    ok: bool
    reason: str = ""
    configured: bool = True


class ShardMemberView(View):
    """Sharded mode: a member of the shard map, its address, how many nodes it owns."""

    replica: str
    address: str
    nodes: int


class Health(View):
    """A replica's health: leadership, mode, store, events, mirror, liveness guard."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")  # event losses
    replica_id: str
    active: bool
    role: str
    leader: str
    elected_at: float
    sharded: bool
    owned_nodes: int
    mode: str
    store_ok: bool
    events_ok: bool
    store_backend: str
    nodes_ready: int
    workloads: int
    detail: str
    decision_latency: dict[str, Any]
    mirror: MirrorView
    liveness: LivenessView
    dependencies: list[DependencyView] = []
    shards: list[ShardMemberView] = []


class WhatIfOutcome(BaseModel):
    """One instance in a what-if plan: where it is (`from`, "" when Pending now), where it would
    be (`to`, null: it would stay Pending), why (the engine's decision on the changed snapshot)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    instance: str
    from_: str = Field(alias="from")
    to: str | None
    explanation: str
    decision: dict[str, Any]


class WhatIfStay(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instance: str
    node: str
    reason: str


class WhatIfPlanView(View):
    """POST /v1/plan/operation: what an operation would do, decided on the current snapshot."""

    operation: dict[str, Any]
    affected_nodes: list[str]
    summary: str
    moves: list[WhatIfOutcome]
    pending: list[WhatIfOutcome]  # off an affected node, to nowhere
    stays: list[WhatIfStay]
    placed: list[WhatIfOutcome]  # Pending now, placed after the operation
    still_pending: list[dict[str, Any]]  # the first 100 Pending before and after
    still_pending_count: int


class WhatIfChange(View):
    """A counterfactual: kind (resources | tolerate | label-node | uncordon | free-node), what it
    changes, its cost (ranked ascending), how many nodes fit once changed and where it would land."""

    kind: str
    summary: str
    cost: float
    fits: int
    lands_on: str
    node: str | None = None
    resources: dict[str, int] | None = None
    tolerations: list[dict[str, str]] | None = None
    labels: dict[str, str | None] | None = None
    moves: list[dict[str, str | None]] | None = None


class WhatIfReplica(View):
    instance: str
    node: str
    pending: bool
    changes: list[WhatIfChange]
    explanation: str | None = None
    placed_now: str | None = None


class WhatIfView(View):
    """GET /v1/workloads/{id}/whatif: each Pending replica's smallest verified changes."""

    workload: str
    replicas: list[WhatIfReplica]
