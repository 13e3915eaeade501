"""What-if plans for operations: what would happen if I drained n3, lost zone a, added a node?

`plan_operation(cluster, operation, config) -> WhatIfPlan` changes the snapshot as the operation
would (a drain or cordon makes nodes unschedulable; a lost node is not ready; a new node joins),
takes the instances the operation puts off their node out of it, and places them, then the
Pending ones, with the real engine (`place_many`, one decision after another, each reserving
room), on that changed snapshot. Pure: nothing is written, nothing is reserved outside it.

What the real operation then does matches the plan when its placements are decided in the same
order (instance ids in order, movers before the Pending ones): when several of them compete for
the same room, the scheduler places them as they come, which may differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine import DEFAULT_CONFIG, Decision, PlacementConfig, place_many
from .snapshot import NodeInfo, Reservations, Snapshot, WorkloadRequest

KINDS = ("drain", "cordon", "lose-node", "lose-label", "add-node")
MAX_STILL_PENDING = 100  # listed in a plan's answer (all are counted)


@dataclass(frozen=True, slots=True)
class Operation:
    kind: str  # one of KINDS
    nodes: tuple[str, ...] = ()  # drain, cordon, lose-node
    label: tuple[str, str] | None = None  # lose-label: (key, value)
    add: tuple[NodeInfo, ...] = ()  # add-node

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"operation must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind in ("drain", "cordon", "lose-node") and not self.nodes:
            raise ValueError(f"{self.kind} needs a node")
        if self.kind == "lose-label" and (self.label is None or not self.label[0]):
            raise ValueError("lose-label needs key=value")
        if self.kind == "add-node" and not self.add:
            raise ValueError("add-node needs a node description")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.nodes:
            d["nodes"] = list(self.nodes)
        if self.label is not None:
            d["label"] = f"{self.label[0]}={self.label[1]}"
        if self.add:
            d["add"] = [n.id for n in self.add]
        return d


@dataclass(frozen=True, slots=True)
class Running:
    """An instance assigned to a node. `stays`: why it cannot leave that node ("" if it can), e.g.
    a node-local volume that lives there."""

    request: WorkloadRequest
    node_id: str
    stays: str = ""


@dataclass(frozen=True, slots=True)
class Cluster:
    """What a plan starts from: the snapshot the engine would decide on now, the assigned
    instances, and the Pending ones (in the order they would be placed). A caller with many
    instances may give `lookup` instead of `running`: the instances of one node, asked only for
    the nodes a question is about."""

    snapshot: Snapshot
    running: tuple[Running, ...] = ()
    pending: tuple[WorkloadRequest, ...] = ()
    lookup: Callable[[str], Sequence[Running]] | None = None

    def on_node(self, node_id: str) -> list[Running]:
        if self.lookup is not None:
            return list(self.lookup(node_id))
        return [r for r in self.running if r.node_id == node_id]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One instance in the plan: where it is (`from_node`, "" when Pending now) and where it would be
    (`to_node`, None: Pending), with the decision that says why."""

    instance: str
    from_node: str
    to_node: str | None
    decision: Decision

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "from": self.from_node, "to": self.to_node,
                "explanation": self.decision.explain_detailed(), "decision": compact(self.decision)}


def compact(d: Decision) -> dict[str, Any]:
    """A decision without its per-node rejections (at thousands of nodes, per instance, they
    would be most of the answer): the counts, the top candidates, every reason of the detailed
    nodes, the explanation."""
    full = d.to_dict()
    full.pop("rejections")
    return full


@dataclass(frozen=True, slots=True)
class Stay:
    instance: str
    node_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "node": self.node_id, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class WhatIfPlan:
    operation: Operation
    affected_nodes: tuple[str, ...]
    moves: tuple[Outcome, ...]  # off an affected node, to another
    stranded: tuple[Outcome, ...]  # off an affected node, to nowhere: would stay Pending
    stays: tuple[Stay, ...]  # on an affected node and not moving (cordon; a node-local volume)
    newly_placed: tuple[Outcome, ...]  # Pending now, placed after the operation
    still_pending: tuple[Outcome, ...] = field(default=())  # Pending now and after

    @property
    def summary(self) -> str:
        op = self.operation.to_dict()
        what = op.get("label") or ", ".join(op.get("nodes", op.get("add", [])))
        parts = [f"{self.operation.kind} {what}: {len(self.affected_nodes)} node(s) affected",
                 f"{len(self.moves)} would move", f"{len(self.stranded)} would stay Pending",
                 f"{len(self.stays)} stay where they are"]
        if self.newly_placed or self.operation.kind == "add-node":
            parts.append(f"{len(self.newly_placed)} Pending would be placed")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation.to_dict(),
            "affectedNodes": list(self.affected_nodes),
            "summary": self.summary,
            "moves": [o.to_dict() for o in self.moves],
            "pending": [o.to_dict() for o in self.stranded],
            "stays": [s.to_dict() for s in self.stays],
            "placed": [o.to_dict() for o in self.newly_placed],
            # Pending before and after: the first ones, and how many (a cluster may hold thousands).
            "stillPending": [{"instance": o.instance, "explanation": o.decision.explain()}
                             for o in self.still_pending[:MAX_STILL_PENDING]],
            "stillPendingCount": len(self.still_pending),
        }


def affected_nodes(snapshot: Snapshot, operation: Operation) -> tuple[str, ...]:
    """The nodes an operation changes (ValueError naming an unknown or duplicate node)."""
    if operation.kind == "add-node":
        taken = [n.id for n in operation.add if snapshot.node(n.id) is not None]
        if taken or len({n.id for n in operation.add}) < len(operation.add):
            raise ValueError(f"add-node: node {(taken or [n.id for n in operation.add])[0]!r} already exists")
        return tuple(sorted(n.id for n in operation.add))
    if operation.kind == "lose-label":
        assert operation.label is not None
        key, value = operation.label
        return tuple(n.id for n in snapshot.effective if n.labels.get(key) == value)
    unknown = [n for n in operation.nodes if snapshot.node(n) is None]
    if unknown:
        raise ValueError(f"no node {unknown[0]!r}")
    return tuple(sorted(set(operation.nodes)))


def changed_snapshot(snapshot: Snapshot, operation: Operation, affected: Iterable[str],
                     leaving: Sequence[Running]) -> Snapshot:
    """The snapshot after the operation: affected nodes cordoned or lost, the instances leaving
    them taken out of their figures (so spreading counts them where they go), new nodes added."""
    touched = set(affected)
    out: dict[str, NodeInfo] = {}
    by_node: dict[str, list[WorkloadRequest]] = {}
    for r in leaving:
        by_node.setdefault(r.node_id, []).append(r.request)
    for node in snapshot.effective:
        if node.id not in touched:
            out[node.id] = node
            continue
        gone = by_node.get(node.id, [])
        services = dict(node.service_counts)
        for req in gone:
            left = services.get(req.group, 0) - 1
            if left > 0:
                services[req.group] = left
            else:
                services.pop(req.group, None)
        out[node.id] = dataclasses.replace(
            node,
            ready=node.ready and operation.kind not in ("lose-node", "lose-label"),
            schedulable=node.schedulable and operation.kind not in ("drain", "cordon"),
            committed_cpu=node.committed_cpu - sum(r.cpu_millicores for r in gone),
            committed_memory_mb=node.committed_memory_mb - sum(r.memory_mb for r in gone),
            committed_disk_mb=node.committed_disk_mb - sum(r.disk_mb for r in gone),
            workload_count=max(0, node.workload_count - len(gone)),
            service_counts=services,
        )
    for node in operation.add:
        out[node.id] = node
    return Snapshot(tuple(out.values()))


def plan_operation(cluster: Cluster, operation: Operation, config: PlacementConfig = DEFAULT_CONFIG) -> WhatIfPlan:
    """Where every instance the operation affects would go, what would stay Pending and why,
    and which Pending instances it would place. Pure: decides on a changed copy of the snapshot."""
    snapshot = cluster.snapshot
    affected = affected_nodes(snapshot, operation)
    on_affected = sorted((r for node_id in affected for r in cluster.on_node(node_id)),
                         key=lambda r: _order(r.request.id))
    moving = operation.kind not in ("cordon", "add-node")
    stays = [Stay(r.request.id, r.node_id, r.stays) for r in on_affected if moving and r.stays]
    if not moving:
        why = "cordoned: new placements avoid the node, running instances stay"
        stays = [Stay(r.request.id, r.node_id, why) for r in on_affected]
    leaving = [r for r in on_affected if moving and not r.stays]
    after = changed_snapshot(snapshot, operation, affected, leaving)
    # Only an added node brings room: after the other operations the Pending instances stay
    # Pending (deciding each of them again costs a pass over every node, for nothing).
    requests = [r.request for r in leaving] + (list(cluster.pending) if operation.kind == "add-node" else [])
    decisions = place_many(after, requests, Reservations(), config)
    origin: Mapping[str, str] = {r.request.id: r.node_id for r in leaving}
    outcomes = [Outcome(req.id, origin.get(req.id, ""), d.node_id, d) for req, d in zip(requests, decisions,
                                                                                          strict=True)]
    movers, waiting = outcomes[:len(leaving)], outcomes[len(leaving):]
    return WhatIfPlan(
        operation=operation,
        affected_nodes=affected,
        moves=tuple(o for o in movers if o.to_node is not None),
        stranded=tuple(o for o in movers if o.to_node is None),
        stays=tuple(stays),
        newly_placed=tuple(o for o in waiting if o.to_node is not None),
        still_pending=tuple(o for o in waiting if o.to_node is None),
    )


def _order(instance: str) -> tuple[str, int]:
    """Instances of a workload in replica order (`web`, `web.1`, ..., `web.10`), workloads by name."""
    head, sep, tail = instance.partition(".")
    return (head, int(tail)) if sep and tail.isdigit() else (instance, 0)
