"""Reconciliation as a pure decision (like Nomad's reconciler): one workload and the mirror in,
a plan out: the guarded writes that converge its instances (withdraw surplus replicas, move
instances off draining or lost nodes, bring assignments up to the workload's revision, delete
it, say why a refused one is not placed) and the instances that need a node. The replica's
shell applies the plan in order (`Replica._apply`) and hands the needs to placement.

Every write carries its own guard (the workload's revision, or the assignment's), so a plan
decided from a mirror that moved on meanwhile is refused by the store, never half applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from persys.model import NodeStatus, OnDisconnect, Phase, Workload, WorkloadStatus
from persys.model.workload import index_of, instance_id
from persys.scheduler import failures, keys, quarantine, taint_eviction, volume_rules
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.group_commit import TXN_MAX_OPS, chunk_ops
from persys.scheduler.placement_service import has_local_volumes
from persys.store.base import Compare, Delete, Put

# Whether a node's agent still runs an instance, as far as the replica can tell (reports.runs_on).
RunsOn = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    subject: str
    message: str
    reason: str = ""


@dataclass(slots=True)
class Write:
    """One guarded store transaction of a plan, and what follows from whether it lands."""

    compares: list[Compare]
    ops: list[Put | Delete]
    events: list[Event] = field(default_factory=list)  # published once it lands
    then: list[Write] = field(default_factory=list)  # written after it, if it lands
    otherwise: Write | None = None  # written instead, if it does not land
    requeue: str = ""  # a workload to look at again if it does not land
    forget_usage: list[str] = field(default_factory=list)  # instances whose usage goes once it lands


@dataclass(slots=True)
class Need:
    """An instance that needs a node, decided on at the workload's revision `wrev`."""

    workload: Workload
    wrev: int
    instance: str


@dataclass(slots=True)
class Plan:
    writes: list[Write] = field(default_factory=list)
    needs: list[Need] = field(default_factory=list)


def plan(state: Mirror, wid: str, inflight: set[str], runs_on: RunsOn, now: float,
         stop_delay: float = 0.0) -> Plan:
    """What converges workload `wid` (`inflight`: instances whose placement is being committed;
    `stop_delay`: see `relocation`)."""
    cur = state.workloads.get(wid)
    existing = set(state.instances.get(wid, ()))
    if cur is None and wid in state.refused:
        return Plan(refused_writes(state, wid, existing, runs_on, now))
    if cur is None:
        return Plan(orphan_writes(state, existing))
    w, wrev = cur.value, cur.mod_revision
    if w.deleting:
        return Plan(deletion_writes(state, wid, wrev, existing, runs_on, now))
    wanted = {instance_id(wid, i) for i in range(w.spec.replicas)}
    out = Plan(orphan_writes(state, existing - wanted))  # scaled down: agents remove the surplus
    for inst in sorted(wanted, key=index_of):
        node_id = state.placement_of.get(inst)
        if node_id is not None:
            sync = sync_write(state, w, inst, node_id)
            move = relocation(state, w, wrev, inst, node_id, now, stop_delay)
            if move is None:
                out.writes += [sync] if sync else []
            elif move.ops and isinstance(move.ops[0], Delete):
                move.otherwise = sync  # not withdrawn (the workload changed): keep it current
                out.writes.append(move)
            else:  # blocked by a node-local volume: it stays, and is kept current
                out.writes += [move, *([sync] if sync else [])]
        elif inst not in inflight and not still_on_old_node(state, inst, runs_on):
            out.needs.append(Need(w, wrev, inst))
    return out


def refused_writes(state: Mirror, wid: str, existing: set[str], runs_on: RunsOn, now: float) -> list[Write]:
    """A stored workload the model refuses: never placed, never removed unasked; its unplaced
    instances say why (see quarantine)."""
    cur = state.refused[wid]
    r, rev = cur.value, cur.mod_revision
    if r.deleting:
        return deletion_writes(state, wid, rev, existing, runs_on, now)
    out = []
    for inst in failures.unplaced(existing | {wid}, state.placement_of):
        st = state.statuses.get(inst)
        new = quarantine.refused_status(st.value if st else None, r, now)
        if new is not None:
            out.append(Write([Compare(keys.workload(wid), rev)], [Put(keys.status(inst), new.to_json())],
                             [Event("WorkloadInvalid", f"workload/{wid}", r.message, quarantine.INVALID_SPEC)]))
    return out


def orphan_writes(state: Mirror, instances: set[str]) -> list[Write]:
    """Withdraw instances of no wanted replica: their assignments and statuses go."""
    ops: list[Put | Delete] = []
    for inst in sorted(instances, key=index_of):  # sorted: the same plan every time
        node_id = state.placement_of.get(inst)
        if node_id is not None:
            ops.append(Delete(keys.assignment(node_id, inst)))
        if inst in state.statuses:
            ops.append(Delete(keys.status(inst)))
    return [Write([], chunk) for chunk in chunk_ops(ops, TXN_MAX_OPS)]


def deletion_writes(state: Mirror, wid: str, wrev: int, instances: set[str], runs_on: RunsOn,
                    now: float) -> list[Write]:
    """Withdraw every assignment first; once no agent runs an instance, delete the workload."""
    withdraw: list[Put | Delete] = []
    waiting = False
    for inst in sorted(instances, key=index_of):
        st = state.statuses.get(inst)
        node_id = state.placement_of.get(inst)
        if node_id is not None:
            # Withdraw the assignment: the agent stops and removes what is no longer desired.
            status = (st.value if st else WorkloadStatus()).model_copy(
                update={"phase": Phase.DELETING, "reason": "Deleting", "message": "", "left_node": "",
                        "updated_at": now})
            withdraw += [Delete(keys.assignment(node_id, inst)), Put(keys.status(inst), status.to_json())]
            waiting = True
            continue
        on_node = st.value.node_id if st else ""
        if on_node and runs_on(inst, on_node):
            waiting = True  # the agent's next complete report without it re-enqueues the workload
    guard = [Compare(keys.workload(wid), wrev)]
    if withdraw:
        return [Write(guard, chunk) for chunk in chunk_ops(withdraw, TXN_MAX_OPS - 1)]
    if waiting:
        return []
    # Its inline volumes go with it (reclaimPolicy Delete) or stay retained, in the same write.
    vol_compares, vol_ops = volume_rules.reclaim_ops(state, wid, now)
    ops: list[Put | Delete] = [Delete(keys.workload(wid)), *vol_ops]
    ops += [Delete(keys.status(inst)) for inst in sorted(instances, key=index_of) if inst in state.statuses]
    # Its revision history goes with it (after the document: a later chunk that fails leaves
    # records that a new workload of the same name drops when it is created).
    ops += [Delete(keys.revision(wid, g)) for g in sorted(state.revision_generations.get(wid, ()))]
    first = TXN_MAX_OPS - len(vol_compares)
    rest = [Write([], chunk) for chunk in chunk_ops(ops[first:], TXN_MAX_OPS)]
    return [Write(guard + vol_compares, ops[:first],
                  [Event("WorkloadDeleted", f"workload/{wid}", "removed from the cluster")],
                  then=rest, forget_usage=sorted(instances))]


def relocation(state: Mirror, w: Workload, wrev: int, inst: str, node_id: str, now: float,
               stop_delay: float = 0.0) -> Write | None:
    """Move an instance off a draining or lost node (None: its node is fine, or not yet). An
    instance with a node-local volume cannot follow: it stays (a drain reports it as blocking)
    and says why. An `onDisconnect: Stop` instance of a lost node moves only `stop_delay` seconds
    after the node's last heartbeat: by then its node guard has killed it even if the agent is
    dead or frozen (persys.agent.node_guard), so two copies never run."""
    node = state.nodes.get(node_id)
    if node is None:
        why = f"node {node_id} is gone"
    elif node.value.draining:
        why = f"node {node_id} is draining"
    elif node.value.status == NodeStatus.NOT_READY:
        why = f"node {node_id} is lost ({node.value.status_reason})"
    else:
        evict = taint_eviction.eviction(node.value, w.spec.tolerations)
        if evict is None or evict.due > now:
            return None
        why = evict.why(node_id)
    st = state.statuses.get(inst)
    prev = st.value if st else WorkloadStatus()
    guard = [Compare(keys.workload(w.id), wrev)]
    pinned = has_local_volumes(w) and (prev.volume_node or node_id) == node_id
    if (not pinned and node is not None and not node.value.draining and w.spec.disconnect_policy() == OnDisconnect.STOP
            and now < node.value.last_heartbeat + stop_delay):
        return None  # the node guard has not surely killed it yet; the node monitor enqueues it again then
    if pinned:
        msg = f"{why}; not relocated: its node-local volume lives on {node_id}"
        if prev.message == msg:
            return None
        new = prev.model_copy(update={"reason": "NodeLost", "message": msg, "updated_at": now})
        return Write(guard, [Put(keys.status(inst), new.to_json())],
                     [Event("RelocationBlocked", f"workload/{w.id}", f"{inst}: {msg}", "NodeLocalVolume")])
    new = prev.model_copy(update={
        "phase": Phase.PENDING, "reason": "Relocating", "message": f"{why}; moving it elsewhere",
        "relocating_from": node_id, "left_node": "", "updated_at": now,
    })
    reason = "TaintEviction" if why.endswith("(NoExecute)") else "Relocating"
    return Write(guard, [Delete(keys.assignment(node_id, inst)), Put(keys.status(inst), new.to_json())],
                 [Event("Relocating", f"workload/{w.id}", f"{inst}: {why}", reason)])


def sync_write(state: Mirror, w: Workload, inst: str, node_id: str) -> Write | None:
    """Bring an instance's assignment up to its workload's revision and desired state."""
    cur = state.assignments.get(node_id, {}).get(inst)
    if cur is None:
        return None
    a = cur.value
    if a.revision == w.revision and a.desired_state == w.spec.desired_state:
        return None
    updated = a.model_copy(update={
        "revision": w.revision, "generation": w.generation, "desired_state": w.spec.desired_state,
        "cpu_millicores": w.spec.resources.cpu_millicores, "memory_mb": w.spec.resources.memory_mb,
        "disk_mb": w.spec.resources.disk_mb,
    })
    akey = keys.assignment(node_id, inst)
    return Write([Compare(akey, cur.mod_revision)], [Put(akey, updated.to_json())], requeue=w.id)


def still_on_old_node(state: Mirror, inst: str, runs_on: RunsOn) -> bool:
    """While a reachable node still runs an instance being moved off it, do not start a second
    copy elsewhere: a single-instance workload must never run twice."""
    st = state.statuses.get(inst)
    old = st.value.relocating_from if st else ""
    return bool(old) and runs_on(inst, old)
