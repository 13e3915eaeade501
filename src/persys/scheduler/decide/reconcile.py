"""Reconciliation (Nomad's reconciler): one workload and the mirror in, a plan out, in intents:
the guarded writes that converge its instances (withdraw surplus replicas, move instances off
draining or lost nodes, bring assignments up to the workload's revision, delete it, say why a
refused one is not placed) and the instances that need a node.

Every write carries its own guard (the workload's revision, or the assignment's), so a plan
decided from a mirror that moved on meanwhile is refused by the store, never half applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from persys.model import NodeStatus, OnDisconnect, Phase, Workload, WorkloadStatus
from persys.model.workload import index_of, instance_id
from persys.scheduler.decide.effects import MAX_INTENTS, Event, Guard, Intent, Need, Write, chunks, drop, put
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.refused import INVALID_SPEC, refused_status
from persys.scheduler.decide.taints import eviction
from persys.scheduler.decide.volumes import has_local_volumes, reclaim

# Whether a node's agent still runs an instance, as far as the replica can tell (reports.runs_on).
RunsOn = Callable[[str, str], bool]


@dataclass(slots=True)
class Plan:
    writes: list[Write] = field(default_factory=list)
    needs: list[Need] = field(default_factory=list)


def plan(m: Mirror, wid: str, inflight: set[str], runs_on: RunsOn, now: float, stop_delay: float = 0.0) -> Plan:
    """What converges workload `wid` (`inflight`: instances whose placement is being committed;
    `stop_delay`: see `relocation`)."""
    cur = m.workloads.get(wid)
    existing = set(m.instances.get(wid, ()))
    if cur is None and wid in m.refused:
        return Plan(refused_writes(m, wid, existing, runs_on, now))
    if cur is None:
        return Plan(orphan_writes(m, existing))
    w, wrev = cur.value, cur.mod_revision
    if w.deleting:
        return Plan(deletion_writes(m, wid, wrev, existing, runs_on, now))
    wanted = {instance_id(wid, i) for i in range(w.spec.replicas)}
    out = Plan(orphan_writes(m, existing - wanted))  # scaled down: agents remove the surplus
    for inst in sorted(wanted, key=index_of):
        node_id = m.placement_of.get(inst)
        if node_id is not None:
            out.writes += converge(m, w, wrev, inst, node_id, now, stop_delay)
        elif inst not in inflight and not still_on_old_node(m, inst, runs_on):
            out.needs.append(Need(w, wrev, inst))
    return out


def converge(m: Mirror, w: Workload, wrev: int, inst: str, node_id: str, now: float, stop_delay: float
             ) -> list[Write]:
    """A placed instance: moved off its node if it must leave, else kept current."""
    sync = sync_write(m, w, inst, node_id)
    move = relocation(m, w, wrev, inst, node_id, now, stop_delay)
    if move is None:
        return [sync] if sync else []
    if move.intents and move.intents[0].drops:
        move.otherwise = sync  # not withdrawn (the workload changed): keep it current
        return [move]
    return [move, *([sync] if sync else [])]  # blocked by a node-local volume: it stays, kept current


def refused_writes(m: Mirror, wid: str, existing: set[str], runs_on: RunsOn, now: float) -> list[Write]:
    """A stored workload the model refuses: never placed, never removed unasked; its unplaced
    instances say why (see quarantine)."""
    cur = m.refused[wid]
    r, rev = cur.value, cur.mod_revision
    if r.deleting:
        return deletion_writes(m, wid, rev, existing, runs_on, now)
    out = []
    for inst in unplaced(existing | {wid}, m.placement_of):
        st = m.statuses.get(inst)
        new = refused_status(st.value if st else None, r, now)
        if new is not None:
            out.append(Write([Guard("workload", wid, rev)], [put("status", inst, new)],
                             [Event("WorkloadInvalid", f"workload/{wid}", r.message, INVALID_SPEC)]))
    return out


def unplaced(instances: set[str] | list[str], placement_of: dict[str, str]) -> list[str]:
    """The instances without a node (placed ones keep their status: their agent reports it)."""
    return sorted({i for i in instances if i not in placement_of})


def orphan_writes(m: Mirror, instances: set[str]) -> list[Write]:
    """Withdraw instances of no wanted replica: their assignments and statuses go."""
    intents: list[Intent] = []
    for inst in sorted(instances, key=index_of):  # sorted: the same plan every time
        node_id = m.placement_of.get(inst)
        if node_id is not None:
            intents.append(drop("assignment", f"{node_id}/{inst}"))
        if inst in m.statuses:
            intents.append(drop("status", inst))
    return [Write([], chunk) for chunk in chunks(intents)]


def deletion_writes(m: Mirror, wid: str, wrev: int, instances: set[str], runs_on: RunsOn, now: float
                    ) -> list[Write]:
    """Withdraw every assignment first; once no agent runs an instance, delete the workload."""
    withdraw: list[Intent] = []
    waiting = False
    for inst in sorted(instances, key=index_of):
        st = m.statuses.get(inst)
        node_id = m.placement_of.get(inst)
        if node_id is not None:
            # Withdraw the assignment: the agent stops and removes what is no longer desired.
            status = (st.value if st else WorkloadStatus()).model_copy(
                update={"phase": Phase.DELETING, "reason": "Deleting", "message": "", "left_node": "",
                        "updated_at": now})
            withdraw += [drop("assignment", f"{node_id}/{inst}"), put("status", inst, status)]
            waiting = True
            continue
        on_node = st.value.node_id if st else ""
        if on_node and runs_on(inst, on_node):
            waiting = True  # the agent's next complete report without it re-enqueues the workload
    guard = [Guard("workload", wid, wrev)]
    if withdraw:
        return [Write(guard, chunk) for chunk in chunks(withdraw, MAX_INTENTS - 1)]
    if waiting:
        return []
    return [removal(m, wid, guard, instances, now)]


def removal(m: Mirror, wid: str, guard: list[Guard], instances: set[str], now: float) -> Write:
    """The workload's document goes, with its inline volumes (reclaimPolicy Delete; retained
    ones stay), its statuses and its revision history (after the document: a later write that
    fails leaves records that a new workload of the same name drops when it is created)."""
    vol_guards, vol_intents = reclaim(m, wid, now)
    intents = [drop("workload", wid), *vol_intents]
    intents += [drop("status", inst) for inst in sorted(instances, key=index_of) if inst in m.statuses]
    intents += [drop("revision", f"{wid}/{g}") for g in sorted(m.revision_generations.get(wid, ()))]
    first = MAX_INTENTS - len(vol_guards)
    rest = [Write([], chunk) for chunk in chunks(intents[first:])]
    return Write(guard + vol_guards, intents[:first],
                 [Event("WorkloadDeleted", f"workload/{wid}", "removed from the cluster")],
                 then=rest, forget_usage=sorted(instances))


def leave_reason(m: Mirror, w: Workload, node_id: str, now: float) -> str:
    """Why an instance must leave its node now ("" when it may stay)."""
    node = m.nodes.get(node_id)
    if node is None:
        return f"node {node_id} is gone"
    if node.value.draining:
        return f"node {node_id} is draining"
    if node.value.status == NodeStatus.NOT_READY:
        return f"node {node_id} is lost ({node.value.status_reason})"
    evict = eviction(node.value, w.spec.tolerations)
    if evict is None or evict.due > now:
        return ""
    return evict.why(node_id)


def relocation(m: Mirror, w: Workload, wrev: int, inst: str, node_id: str, now: float,
               stop_delay: float = 0.0) -> Write | None:
    """Move an instance off a draining or lost node (None: its node is fine, or not yet). An
    instance with a node-local volume cannot follow: it stays (a drain reports it as blocking)
    and says why. An `onDisconnect: Stop` instance of a lost node moves only `stop_delay` seconds
    after the node's last heartbeat: by then its node guard has killed it even if the agent is
    dead or frozen (persys.agent.node_guard), so two copies never run."""
    why = leave_reason(m, w, node_id, now)
    if not why:
        return None
    node = m.nodes.get(node_id)
    st = m.statuses.get(inst)
    prev = st.value if st else WorkloadStatus()
    guard = [Guard("workload", w.id, wrev)]
    pinned = has_local_volumes(w) and (prev.volume_node or node_id) == node_id
    if (not pinned and node is not None and not node.value.draining and w.spec.disconnect_policy() == OnDisconnect.STOP
            and now < node.value.last_heartbeat + stop_delay):
        return None  # the node guard has not surely killed it yet; the node monitor enqueues it again then
    if pinned:
        msg = f"{why}; not relocated: its node-local volume lives on {node_id}"
        if prev.message == msg:
            return None
        new = prev.model_copy(update={"reason": "NodeLost", "message": msg, "updated_at": now})
        return Write(guard, [put("status", inst, new)],
                     [Event("RelocationBlocked", f"workload/{w.id}", f"{inst}: {msg}", "NodeLocalVolume")])
    new = prev.model_copy(update={
        "phase": Phase.PENDING, "reason": "Relocating", "message": f"{why}; moving it elsewhere",
        "relocating_from": node_id, "left_node": "", "updated_at": now,
    })
    reason = "TaintEviction" if why.endswith("(NoExecute)") else "Relocating"
    return Write(guard, [drop("assignment", f"{node_id}/{inst}"), put("status", inst, new)],
                 [Event("Relocating", f"workload/{w.id}", f"{inst}: {why}", reason)])


def sync_write(m: Mirror, w: Workload, inst: str, node_id: str) -> Write | None:
    """Bring an instance's assignment up to its workload's revision and desired state."""
    cur = m.assignments.get(node_id, {}).get(inst)
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
    ident = f"{node_id}/{inst}"
    return Write([Guard("assignment", ident, cur.mod_revision)], [put("assignment", ident, updated)], requeue=w.id)


def still_on_old_node(m: Mirror, inst: str, runs_on: RunsOn) -> bool:
    """While a reachable node still runs an instance being moved off it, do not start a second
    copy elsewhere: a single-instance workload must never run twice."""
    st = m.statuses.get(inst)
    old = st.value.relocating_from if st else ""
    return bool(old) and runs_on(inst, old)
