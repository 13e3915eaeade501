"""Moving one instance to another node (`persysctl move W/I [--to NODE]`, REST POST
/v1/workloads/{id}/instances/{instance}/move, gRPC MoveInstance; the rebalance policy acts
through it). Operators and admins; audited as every mutation.

A move is a drain of one instance: one guarded transaction withdraws its assignment and marks
its status Pending, `relocating_from` and `moving_off` its node, `move_to` the node the placement
engine verified for it, `moved_at` now. Reconciliation then places it as any relocated instance,
so the rules of a drain hold: it is placed again only once its old node no longer runs it (a
single-writer volume is never attached twice: stop before start elsewhere), never back on the
node it left, on the verified node first (any other if that one filled up meanwhile). A move
never preempts: the destination must take it as the cluster is (priorities stay honoured). An
instance whose data is node-local cannot follow: refused, nothing written.

`check` is pure (the mirror in, the verified destination or a refusal out); `move` does the write.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from persys.model import ManifestError, Phase, WorkloadStatus
from persys.model.node_names import node_id_problem
from persys.model.workload import index_of, instance_id
from persys.scheduler import placement as pl
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import ClusterState, put_doc
from persys.scheduler.placing.engine_adapter import PlacementService, has_local_volumes, to_request, volume_home
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete

MAX_NAME = 253


@dataclass(frozen=True, slots=True)
class Verified:
    workload: str
    instance: str
    source: str
    dest: str
    explanation: str


def instance_of(workload_id: str, instance: str) -> str:
    """The instance id from what an operator typed: its id (`web.2`), or its index (`2`)."""
    if instance.isdigit() and len(instance) <= 6:
        return instance_id(workload_id, int(instance))
    return instance


def _request(state: ClusterState, wid: str, inst: str, source: str) -> pl.WorkloadRequest:
    w = state.workloads[wid].value
    req = to_request(w, inst, None, state.volumes)
    return dataclasses.replace(req, excluded_nodes=req.excluded_nodes | {source})


def check(state: ClusterState, placement: PlacementService, workload_id: str, instance: str, to_node: str
          ) -> Verified:
    """Whether the instance may move now and where to (verified by the engine on the current
    snapshot, reservations in flight counted; nothing reserved). Raises NotFound, ManifestError
    (bad input, naming the field) or MutationRefused (why it cannot move)."""
    if not instance or len(instance) > MAX_NAME:
        raise ManifestError([f"instance: 1-{MAX_NAME} characters are required"])
    if to_node and (bad := node_id_problem(to_node)):
        # A name no node can have is bad input (400 naming `to`), not a missing node (404).
        raise ManifestError([f"to: {bad.replace('node_id', 'node name', 1)}"])
    cur = state.workloads.get(workload_id)
    if cur is None or cur.value.deleting:
        raise NotFound(f"workload {workload_id!r}")
    w = cur.value
    inst = _instance(workload_id, instance, w.spec.replicas)
    source = _source(state, inst)
    if to_node and to_node == source:
        raise ManifestError([f"to: {inst} runs on {source} already"])
    if to_node and to_node not in state.nodes:
        raise NotFound(f"node {to_node!r}")
    home = volume_home(w, state.volumes)
    if has_local_volumes(w) or home:
        raise MutationRefused(f"instance {inst} cannot move: its node-local volume lives on {home or source}")
    req = _request(state, workload_id, inst, source)
    if to_node:
        return _check_target(placement, req, workload_id, inst, source, to_node)
    (decision,) = placement.plan([req])
    if decision.node_id is None:
        raise MutationRefused(f"no other node takes {inst} now: {decision.explain()}")
    return Verified(workload_id, inst, source, decision.node_id, decision.explain())


def _instance(workload_id: str, instance: str, replicas: int) -> str:
    """The instance id `instance` names (an id or an index): one of the workload's replicas, or
    ManifestError / NotFound saying why not."""
    inst = instance_of(workload_id, instance)
    if inst.partition(".")[0] != workload_id or inst != instance_id(workload_id, index_of(inst)):
        raise ManifestError([f"instance: {instance!r} is not an instance of {workload_id} (its ids: "
                             f"{instance_id(workload_id, 0)}, {instance_id(workload_id, 1)}, ... or an index)"])
    if index_of(inst) >= replicas:
        raise NotFound(f"instance {inst!r} (workload {workload_id} has {replicas} replica(s))")
    return inst


def _check_target(placement: PlacementService, req: pl.WorkloadRequest, workload_id: str, inst: str, source: str,
                  to_node: str) -> Verified:
    """`--to NODE`: every filter passes there, or MutationRefused naming each that fails."""
    ev = pl.evaluate_node(placement.snapshot(), req, to_node, placement.config)
    failed = [s for _, s in ev.verdicts if s is not None] if ev is not None else []
    if ev is None or failed:
        why = "; ".join(f"{s.code}: {s.reason}" for s in failed) or "not in the snapshot"
        raise MutationRefused(f"{inst} does not fit on {to_node}: {why}")
    return Verified(workload_id, inst, source, to_node, f"fits on {to_node} (every filter passed)")


def _source(state: ClusterState, inst: str) -> str:
    """The node the instance is on, unless it is on none or on its way already."""
    source = state.placement_of.get(inst)
    st = state.statuses.get(inst)
    if source is None:
        what = f"{st.value.phase}: {st.value.reason}" if st is not None else "not placed"
        raise MutationRefused(f"instance {inst} is on no node ({what}); nothing to move")
    if st is not None and (st.value.relocating_from or st.value.moving_off):
        raise MutationRefused(f"instance {inst} is being moved off {st.value.relocating_from or st.value.moving_off} "
                              "already")
    return source


def moving_status(prev: WorkloadStatus | None, v: Verified, actor: str, now: float) -> WorkloadStatus:
    return (prev or WorkloadStatus()).model_copy(update={
        "phase": Phase.PENDING, "reason": "Moving", "relocating_from": v.source, "left_node": "",
        "moving_off": v.source, "move_to": v.dest, "moved_at": now, "updated_at": now,
        "message": f"moved by {actor or 'an operator'} from {v.source} to {v.dest}: stopping it there first",
    })


def moved_request(req: pl.WorkloadRequest, st: WorkloadStatus | None) -> pl.WorkloadRequest:
    """How placement sees an instance being moved: never back where it came from, on the verified
    node first (a node-local volume's pin, which a move never has, wins)."""
    if st is None or not st.moving_off:
        return req
    return dataclasses.replace(req, excluded_nodes=req.excluded_nodes | {st.moving_off},
                               pinned_node=req.pinned_node or st.move_to or None)


def unpinned(req: pl.WorkloadRequest, st: Any) -> pl.WorkloadRequest | None:
    """The request again without the verified node, when that node no longer takes it (None: it
    was not pinned by a move)."""
    status = st.value if st is not None else None
    if status is None or not status.moving_off or not status.move_to or req.pinned_node != status.move_to:
        return None
    return dataclasses.replace(req, pinned_node=None)


async def move(s: Shell, workload_id: str, instance: str, to_node: str, actor: str, dry_run: bool = False
               ) -> dict[str, Any]:
    s.require_normal()
    state = s.state
    v = check(state, s.placement, workload_id, instance, to_node)
    now = time.time()
    answer = {"workload": v.workload, "instance": v.instance, "from": v.source, "to": v.dest,
              "verified": v.explanation[:2000], "dryRun": dry_run, "movedAt": 0.0 if dry_run else now}
    if dry_run:
        return answer
    akey = keys.assignment(v.source, v.instance)
    a = state.assignments.get(v.source, {}).get(v.instance)
    cur = state.workloads[workload_id]
    if a is None:
        raise MutationRefused(f"instance {v.instance} left {v.source} meanwhile; try again")
    st = state.statuses.get(v.instance)
    new = moving_status(st.value if st else None, v, actor, now)
    ok = await state.commit([Compare(keys.workload(workload_id), cur.mod_revision), Compare(akey, a.mod_revision)],
                            [Delete(akey), put_doc(keys.status(v.instance), new)], fenced=False)
    if not ok:
        raise MutationRefused(f"workload {workload_id!r} changed meanwhile; try again")
    s.emit("Moving", f"workload/{workload_id}", f"{v.instance}: {v.source} -> {v.dest} (by {actor or '?'})",
           "Moved", node=v.source)
    s.enqueue(workload_id)
    return answer
