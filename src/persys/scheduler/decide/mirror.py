"""The mirror as data: the cluster's documents as this replica knows them, with their indexes.

Every decision reads a `Mirror`; nothing here reads the store, watches or commits (the
follower, `scheduler.state.ClusterState`, does, and folds what it reads in through
`scheduler.mirror.fold`). The methods below keep the indexes right as documents come and go;
each returns the change it makes as `(kind, id)`, what listeners are told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel

from persys.model import Assignment, Node, Phase, Workload, WorkloadStatus
from persys.model.volume import Volume, VolumeAttachment
from persys.model.workload import workload_of
from persys.scheduler.decide.refused import RefusedWorkload

T = TypeVar("T", bound=BaseModel)
Change = tuple[str, str]  # (kind, id); kind in workload|status|node|assignment|volume|attachment|...
NO_CHANGE: Change = ("", "")


@dataclass(slots=True)
class Versioned(Generic[T]):
    value: T
    mod_revision: int


@dataclass(eq=False)  # identity, as the follower that extends it: a mirror is one replica's
class Mirror:
    """Documents by kind, indexes over them, and the store revision they are current as of."""

    workloads: dict[str, Versioned[Workload]] = field(default_factory=dict)
    # Stored workloads the model refuses: kept apart, never placed, never deleted unasked.
    refused: dict[str, Versioned[RefusedWorkload]] = field(default_factory=dict)
    statuses: dict[str, Versioned[WorkloadStatus]] = field(default_factory=dict)
    nodes: dict[str, Versioned[Node]] = field(default_factory=dict)
    volumes: dict[str, Versioned[Volume]] = field(default_factory=dict)
    assignments: dict[str, dict[str, Versioned[Assignment]]] = field(default_factory=dict)  # node -> inst -> a
    attachments: dict[str, dict[str, Versioned[VolumeAttachment]]] = field(default_factory=dict)  # node -> vol
    attached_on: dict[str, set[str]] = field(default_factory=dict)  # volume -> nodes with an attachment record
    placement_of: dict[str, str] = field(default_factory=dict)  # instance -> node
    instances: dict[str, set[str]] = field(default_factory=dict)  # workload -> instances with a status or assignment
    pending: set[str] = field(default_factory=set)  # instances whose status is Pending (retried as nodes change)
    # workload -> generations of its revision records (keys only: the specs stay in the store).
    revision_generations: dict[str, set[int]] = field(default_factory=dict)
    cluster_marker: dict[str, object] | None = None
    leader: bytes | None = None  # value of the leader key
    replicas: dict[str, str] = field(default_factory=dict)  # live replica -> address
    shards: tuple[tuple[str, ...], int] = ((), 0)  # (members, mod revision of the epoch key)
    revision: int = 0
    # Per stored key: the revision folded in, and when it was deleted (so an older put never
    # resurrects it). Opaque to decisions; the fold and compare-and-swap guards use them.
    key_revs: dict[str, int] = field(default_factory=dict)
    tombstones: dict[str, int] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget every document (a restore replaced the store)."""
        for d in (self.workloads, self.refused, self.statuses, self.nodes, self.volumes, self.assignments,
                  self.attachments, self.attached_on, self.placement_of, self.instances, self.revision_generations,
                  self.replicas, self.key_revs, self.tombstones):
            d.clear()
        self.pending.clear()
        self.cluster_marker = None
        self.leader = None
        self.shards = ((), 0)

    def rev_of(self, key: str) -> int:
        """The mod revision the mirror holds for `key` (0 = absent), for compare-and-swap."""
        return self.key_revs.get(key, 0)

    # --- workloads ---

    def set_workload(self, wid: str, w: Workload | RefusedWorkload, rev: int) -> Change:
        if isinstance(w, RefusedWorkload):
            self.workloads.pop(wid, None)
            self.refused[wid] = Versioned(w, rev)
            return "workload", wid
        self.refused.pop(w.id, None)
        self.workloads[w.id] = Versioned(w, rev)
        return "workload", w.id

    def drop_workload(self, wid: str) -> Change:
        self.workloads.pop(wid, None)
        self.refused.pop(wid, None)
        return "workload", wid

    # --- statuses and assignments: the instance index follows both ---

    def set_status(self, inst: str, st: WorkloadStatus, rev: int) -> Change:
        self.statuses[inst] = Versioned(st, rev)
        if st.phase == Phase.PENDING:
            self.pending.add(inst)
        else:
            self.pending.discard(inst)
        self.instances.setdefault(workload_of(inst), set()).add(inst)
        return "status", inst

    def drop_status(self, inst: str) -> Change:
        self.statuses.pop(inst, None)
        self.pending.discard(inst)
        self._unindex(inst)
        return "status", inst

    def set_assignment(self, a: Assignment, rev: int) -> Change:
        self.assignments.setdefault(a.node_id, {})[a.instance_id] = Versioned(a, rev)
        self.placement_of[a.instance_id] = a.node_id
        self.instances.setdefault(workload_of(a.instance_id), set()).add(a.instance_id)
        return "assignment", f"{a.node_id}/{a.instance_id}"

    def drop_assignment(self, node_id: str, inst: str) -> Change:
        per_node = self.assignments.get(node_id, {})
        per_node.pop(inst, None)
        if not per_node:
            self.assignments.pop(node_id, None)
        if self.placement_of.get(inst) == node_id:
            del self.placement_of[inst]
        self._unindex(inst)
        return "assignment", f"{node_id}/{inst}"

    def _unindex(self, inst: str) -> None:
        if inst in self.statuses or inst in self.placement_of:
            return
        wid = workload_of(inst)
        known = self.instances.get(wid)
        if known is not None:
            known.discard(inst)
            if not known:
                del self.instances[wid]

    # --- nodes, volumes, attachments ---

    def set_node(self, n: Node, rev: int) -> Change:
        self.nodes[n.id] = Versioned(n, rev)
        return "node", n.id

    def drop_node(self, node_id: str) -> Change:
        self.nodes.pop(node_id, None)
        return "node", node_id

    def set_volume(self, v: Volume, rev: int) -> Change:
        self.volumes[v.id] = Versioned(v, rev)
        return "volume", v.id

    def drop_volume(self, vid: str) -> Change:
        self.volumes.pop(vid, None)
        return "volume", vid

    def set_attachment(self, node_id: str, vid: str, att: VolumeAttachment, rev: int) -> Change:
        self.attachments.setdefault(node_id, {})[vid] = Versioned(att, rev)
        self.attached_on.setdefault(vid, set()).add(node_id)
        return "attachment", f"{node_id}/{vid}"

    def drop_attachment(self, node_id: str, vid: str) -> Change:
        on_node = self.attachments.get(node_id, {})
        on_node.pop(vid, None)
        if not on_node:
            self.attachments.pop(node_id, None)
        nodes = self.attached_on.get(vid, set())
        nodes.discard(node_id)
        if not nodes:
            self.attached_on.pop(vid, None)
        return "attachment", f"{node_id}/{vid}"

    def index_revision(self, wid: str, generation: int, present: bool) -> None:
        """A revision record's key came or went (nothing acts on it: no change is returned)."""
        if present:
            self.revision_generations.setdefault(wid, set()).add(generation)
            return
        known = self.revision_generations.get(wid)
        if known is not None:
            known.discard(generation)
            if not known:
                del self.revision_generations[wid]
