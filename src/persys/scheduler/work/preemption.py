"""Preemption in the placement pipeline: a Pending instance of a workload with a priority above
0 may move lower-priority instances off one node (placement/preemption.py decides which). One
transaction withdraws the victims (Pending, reason Preempted, being moved off that node: they are
placed again elsewhere once their agent stopped them, as after a drain) and places the preemptor
there; the agent stops the victims (their stop grace applies) and starts it. Events name the
preemptor and the victims; `persys_preemptions_total` counts the victims."""

from __future__ import annotations

import time
from collections.abc import Callable

from persys.model import Phase, WorkloadStatus
from persys.scheduler import placement as pl
from persys.scheduler.decide.effects import Need
from persys.scheduler.interpret.group_commit import Unit, commit_units
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import put_doc
from persys.scheduler.placing import whatif as whatif_api
from persys.scheduler.work.shell import Shell
from persys.store.base import Compare, Delete, Put


def victim_status(prev: WorkloadStatus | None, node_id: str, preemptor: str, priority: int, now: float
                  ) -> WorkloadStatus:
    return (prev or WorkloadStatus()).model_copy(update={
        "phase": Phase.PENDING, "reason": "Preempted", "relocating_from": node_id, "left_node": "",
        "message": f"preempted on {node_id} by {preemptor} (priority {priority}); moving it elsewhere",
        "updated_at": now,
    })


async def try_preempt(s: Shell, need: Need, request: pl.WorkloadRequest,
                      place_unit: Callable[[pl.Decision, float, str], Unit]) -> bool:
    """Place `need` by preempting lower-priority instances on one node (`place_unit`: the writes
    that place it, as placement_commits builds them); False: no such node, or the transaction
    lost a race (the instance stays Pending, and is retried)."""
    if request.priority <= 0:
        return False
    state = s.state
    cluster = whatif_api.cluster_of(state, s.placement)
    found = pl.preemption(cluster, request, s.placement.config)
    if found is None:
        return False
    node_id, now = found.node_id, time.time()
    compares: list[Compare] = []
    ops: list[Put | Delete] = []
    for v in found.victims:
        inst = v.request.id
        akey = keys.assignment(node_id, inst)
        cur = state.assignments.get(node_id, {}).get(inst)
        if cur is None:
            return False  # it left meanwhile: decide again later
        st = state.statuses.get(inst)
        compares.append(Compare(akey, cur.mod_revision))
        ops += [Delete(akey), put_doc(keys.status(inst),
                                      victim_status(st.value if st else None, node_id, need.instance,
                                                    request.priority, now))]
    names = ", ".join(f"{v.request.id} (priority {v.request.priority})" for v in found.victims)
    unit = place_unit(found.decision, now, f"; preempted {names} on {node_id} (priority {request.priority})")
    s.placement.reserve_decided(request, node_id, found.decision.devices)
    (ok,) = await commit_units(state.commit, [Unit([*compares, *unit.compares], [*ops, *unit.ops])])
    if not ok:
        s.placement.release(need.instance)
        return False
    wid = need.workload.id
    s.emit("Preempting", f"workload/{wid}", f"{need.instance} (priority {request.priority}) preempted {names} "
           f"on {node_id}", "Preemption", node=node_id)
    for v in found.victims:
        s.emit("Preempted", f"workload/{v.request.id.partition('.')[0]}",
               f"{v.request.id}: preempted on {node_id} by {need.instance} (priority {request.priority})",
               "Preemption", node=node_id)
    s.metrics.preemptions.inc((), len(found.victims))
    return True
