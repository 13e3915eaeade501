"""What a replica shows of the cluster: pure functions from the mirror (and the in-memory facts
agents sent) to the documents its API returns. Their shapes are declared as pydantic models in
views/models.py, which the gateway's OpenAPI document uses."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from persys.model import Phase, WorkloadStatus, WorkloadUsage
from persys.model.workload import index_of, instance_id, workload_of
from persys.scheduler.decide.liveness import GuardState
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.placement_doc import placement_doc as placement_doc  # re-exported
from persys.scheduler.decide.placement_doc import reasons_doc as reasons_doc  # re-exported
from persys.scheduler.errors import NotFound
from persys.scheduler.mirror import quarantine
from persys.scheduler.mirror.reports import LiveNode
from persys.scheduler.placing.engine_adapter import has_local_volumes
from persys.scheduler.views.pages import Page, SortedIds, take_page

SUMMED_USAGE = ("memoryBytes", "diskReadBytes", "diskWriteBytes", "netRxBytes", "netTxBytes")


def page_json(view: dict[str, Any]) -> bytes:
    return json.dumps(view, separators=(",", ":")).encode()


def placement_view(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored placement document with every score spelled out (node_id, total, breakdown)."""
    names = doc.get("scorers")
    if not names:
        return doc  # nothing placed, or a document stored before scores were compact
    scores = [{"node_id": n, "total": t, "breakdown": dict(zip(names, parts, strict=False))}
              for n, t, parts in doc.get("scores", [])]
    return {k: v for k, v in doc.items() if k != "scorers"} | {"scores": scores}


def instance_view(state: Mirror, usage: Mapping[str, WorkloadUsage], inst: str) -> dict[str, Any]:
    st = state.statuses.get(inst)
    status = st.value if st else WorkloadStatus(reason="Scheduling")
    measured = usage.get(inst) if status.phase == Phase.RUNNING else None
    return {
        "instance": inst,
        "node": state.placement_of.get(inst) or status.node_id,
        "phase": str(status.phase),
        "reason": status.reason,
        "message": status.message,
        "observedRevision": status.observed_revision,
        "runtimeId": status.runtime_id,
        "restarts": status.restarts,
        "usage": (measured or WorkloadUsage()).to_doc(),
        "placement": placement_view(status.placement),
        "drift": status.drift,
        "updatedAt": status.updated_at,
        "movedAt": status.moved_at,  # the last move (instance_move): 0 never
    }


def workload_view(state: Mirror, usage: Mapping[str, WorkloadUsage], wid: str,
                  summary: bool = False) -> dict[str, Any]:
    cur = state.workloads.get(wid)
    if cur is None and wid in state.refused:
        known = sorted(set(state.instances.get(wid, ())) | {wid}, key=index_of)
        return quarantine.refused_view(state.refused[wid].value, [instance_view(state, usage, i) for i in known])
    if cur is None:
        raise NotFound(f"workload {wid!r}")
    w = cur.value
    wanted = [instance_id(wid, i) for i in range(w.spec.replicas)]
    extra = sorted(set(state.instances.get(wid, ())) - set(wanted), key=index_of)
    instances = [instance_view(state, usage, i) for i in wanted + extra]
    first = instances[0]
    # The workload shows its first replica that is not Running (the one worth looking at).
    focus = next((i for i in instances if i["phase"] != "Running"), first)
    running = sum(1 for i in instances[: len(wanted)] if i["phase"] == "Running")
    phase = "Running" if running == len(wanted) else focus["phase"]
    return {
        "id": w.id,
        "name": w.name,
        "type": w.spec.type,
        "labels": w.labels,
        "desiredState": "Deleted" if w.deleting else str(w.spec.desired_state),
        "revision": w.revision,
        "generation": w.generation,
        "replicas": w.spec.replicas,
        "ready": f"{running}/{len(wanted)}",
        "phase": phase,
        "node": first["node"],
        "nodes": sorted({i["node"] for i in instances if i["node"]}),
        "reason": focus["reason"],
        "message": focus["message"],
        "observedRevision": first["observedRevision"],
        "runtimeId": first["runtimeId"],
        "restarts": sum(i["restarts"] for i in instances),
        "usage": {
            "cpuPercent": round(sum(i["usage"]["cpuPercent"] for i in instances), 3),
            **{k: sum(i["usage"][k] for i in instances) for k in SUMMED_USAGE},
        },
        "placement": focus["placement"],
        "drift": [{"instance": i["instance"], **i["drift"]} for i in instances if i["drift"]],
        "instances": instances,
        "createdAt": w.created_at,
        "updatedAt": max([w.updated_at] + [i["updatedAt"] for i in instances]),
        # Lists leave the spec out: specs may be large, and a page of them would be pages.
        **({} if summary else {"spec": w.spec.to_doc()}),
    }


def node_view(state: Mirror, live: Mapping[str, LiveNode], node_id: str) -> dict[str, Any]:
    cur = state.nodes.get(node_id)
    if cur is None:
        raise NotFound(f"node {node_id!r}")
    doc = cur.value.to_doc()
    doc["labels"] = cur.value.effective_labels()
    doc["taints"] = [t.to_doc() for t in cur.value.effective_taints()]
    entry = live.get(node_id)
    if entry is not None:
        doc["lastHeartbeat"] = entry.last_heartbeat_wall
        doc["usage"] = entry.usage.to_doc()
    assigned = [a.value for a in state.assignments.get(node_id, {}).values()]
    doc["allocated"] = {
        "cpuMillicores": sum(a.cpu_millicores for a in assigned),
        "memoryMb": sum(a.memory_mb for a in assigned),
        "diskMb": sum(a.disk_mb for a in assigned),
        "workloads": len(assigned),
    }
    doc["workloads"] = sorted(a.instance_id for a in assigned)  # instance ids
    return doc


def drain_status(state: Mirror, live: Mapping[str, LiveNode], node_id: str) -> dict[str, Any]:
    cur = state.nodes.get(node_id)
    if cur is None:
        raise NotFound(f"node {node_id!r}")
    entry = live.get(node_id)
    assigned = state.assignments.get(node_id, {})
    on_node = {i for i in set(assigned) | (entry.present if entry else set()) if workload_of(i) in state.workloads}
    blocked, remaining = [], []
    for inst in sorted(on_node):
        w = state.workloads[workload_of(inst)].value
        st = state.statuses.get(inst)
        if has_local_volumes(w) and inst in assigned:
            blocked.append({"instance": inst, "reason": f"its node-local volume lives on {node_id}"})
        else:
            remaining.append({"instance": inst, "phase": str(st.value.phase) if st else ""})
    # Off the node: placed elsewhere and starting, or waiting for room (reason Unschedulable, no
    # node: the message says why). Both keep the drain from being done.
    moving = [{"instance": inst, "phase": str(st.value.phase), "node": state.placement_of.get(inst, ""),
               "message": st.value.message, "reason": st.value.reason}
              for inst, st in state.statuses.items() if st.value.relocating_from == node_id and inst not in on_node]
    n = cur.value
    done = n.draining and not remaining and not moving and not blocked
    return {
        "node": node_id, "draining": n.draining, "cordoned": n.cordoned, "deadline": n.drain_deadline,
        "remaining": remaining, "moving": sorted(moving, key=lambda m: m["instance"]), "blocked": blocked,
        "done": done,
    }


def replica_explanations(state: Mirror, wid: str) -> dict[str, Any]:
    """The stored placement explanation of each replica of a workload."""
    cur = state.workloads.get(wid)
    if cur is None:
        raise NotFound(f"workload {wid!r}")
    replicas = []
    for i in range(cur.value.spec.replicas):
        inst = instance_id(wid, i)
        st = state.statuses.get(inst)
        status = st.value if st else WorkloadStatus(reason="Scheduling")
        replicas.append({
            "instance": inst, "phase": str(status.phase), "node": state.placement_of.get(inst, ""),
            "explanation": status.placement.get("explanation", status.message),
            "decision": placement_view(status.placement),
        })
    return {"workload": wid, "replicas": replicas}


def liveness_view(g: GuardState, to_wall: float) -> dict[str, Any]:
    """The mass-loss guard as health shows it (`to_wall`: add to a clock value for wall time)."""
    return {
        "suspended": g.suspended,
        "since": g.suspended_since + to_wall if g.suspended_since is not None else 0.0,
        "endsAt": g.ends_at + to_wall if g.suspended else 0.0,
        "reason": g.reason,
        "silentNodes": g.silent,
        "judgedNodes": g.judged,
    }


def workload_page(state: Mirror, usage: Mapping[str, WorkloadUsage], ids: SortedIds, after: str, limit: int,
                  node_id: str = "") -> Page:
    """Workload summaries (views without the spec: `workload_view` has it) after `after` in id
    order, as JSON; with `node_id`, only workloads with an instance there."""

    def render(wid: str) -> bytes | None:
        if wid not in state.workloads:
            return None
        view = workload_view(state, usage, wid, summary=True)
        return None if node_id and node_id not in view["nodes"] else page_json(view)

    return take_page(ids.after(after), render, limit)


def node_page(state: Mirror, live: Mapping[str, LiveNode], ids: SortedIds, after: str, limit: int) -> Page:
    """Node views after `after` in id order, as JSON."""
    return take_page(ids.after(after), lambda n: page_json(node_view(state, live, n)) if n in state.nodes else None,
                     limit)
