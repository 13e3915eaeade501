"""Placement decisions made durable (pure): the write one decision becomes (its assignment,
created only if absent and only while the workload is at the revision decided on; its status;
the local volume records that now live on its node) with the events once it lands, and the
status of an instance no node fits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from persys.model import Assignment, Phase, Workload, WorkloadStatus
from persys.model.volume import Volume
from persys.scheduler import placement as pl
from persys.scheduler.decide.effects import Effects, Event, Guard, Need, Write, put
from persys.scheduler.decide.mirror import Mirror, Versioned
from persys.scheduler.decide.placement_doc import placement_doc
from persys.scheduler.decide.volumes import has_local_volumes, volume_ids


@dataclass(slots=True)
class Placed:
    """A decision on its way to the store."""

    need: Need
    decision: pl.Decision
    explanation: str = ""
    moved_from: str = ""
    decided_ns: int = 0  # when the engine pass began (wall clock, ns), kept only when tracing
    seen: dict[str, Any] | None = None  # what the decision saw beyond the store (explain --at)

    @property
    def instance(self) -> str:
        return self.need.instance


def placement_write(p: Placed, prev: WorkloadStatus | None, now: float, homes: Sequence[Versioned[Volume]] = (),
                    note: str = "") -> Write:
    """The guarded write of one decision. `homes`: local volume records without a node yet,
    which now live where the instance goes; `note`: e.g. whom it preempted. Records on `p`
    where the instance moved from and the explanation (the events say them)."""
    node_id = p.decision.node_id
    assert node_id is not None
    w, inst = p.need.workload, p.instance
    assignment = Assignment(
        instance_id=inst, node_id=node_id, revision=w.revision, generation=w.generation,
        desired_state=w.spec.desired_state, cpu_millicores=w.spec.resources.cpu_millicores,
        memory_mb=w.spec.resources.memory_mb, disk_mb=w.spec.resources.disk_mb,
        devices=list(p.decision.devices) or None, created_at=now,
    )
    volume_node = (prev.volume_node if prev else "") or (node_id if has_local_volumes(w) else "")
    p.moved_from = prev.relocating_from if prev else ""
    p.explanation = p.decision.explain() + note
    status = WorkloadStatus(
        phase=Phase.SCHEDULED, node_id=node_id, reason="Scheduled", message=p.explanation,
        placement=placement_doc(p.decision, p.explanation, p.seen), volume_node=volume_node,
        relocating_from=p.moved_from, moved_at=prev.moved_at if prev else 0.0, updated_at=now,
    )
    ident = f"{node_id}/{inst}"
    out = Write([Guard("workload", w.id, p.need.wrev), Guard("assignment", ident, 0)],
                [put("assignment", ident, assignment), put("status", inst, status)], placed_events(p))
    for h in homes:
        out.guards.append(Guard("volume", h.value.id, h.mod_revision))
        out.intents.append(put("volume", h.value.id, h.value.model_copy(update={"node": node_id, "updated_at": now})))
    return out


def placed_events(p: Placed) -> list[Event]:
    wid, inst, node = p.need.workload.id, p.instance, p.decision.node_id or ""
    out = [Event("WorkloadScheduled", f"workload/{wid}", f"{inst}: {p.explanation}" if inst != wid else p.explanation,
                 "Scheduled", node=node)]
    if p.moved_from:
        out.append(Event("Relocated", f"workload/{wid}", f"{inst}: {p.moved_from} -> {node}", "Relocated", node=node))
    return out


def unhomed_local_volumes(w: Workload, volumes: Mapping[str, Versioned[Volume]]) -> list[Versioned[Volume]]:
    """The workload's local volume records that no node holds yet."""
    out = []
    for vid in volume_ids(w.id, w.spec):
        rec = volumes.get(vid)
        if rec is not None and rec.value.spec.driver == "local" and not rec.value.node:
            out.append(rec)
    return out


def pending_status(prev: WorkloadStatus | None, decision: pl.Decision, now: float,
                   seen: dict[str, Any] | None = None) -> WorkloadStatus | None:
    """The status of an instance no node fits (None: it says so already)."""
    reason = decision.explain_detailed()
    if prev is not None and prev.phase == Phase.PENDING and prev.message == reason:
        return None
    # An instance moved off a node (drain, loss) that fits nowhere is still being moved: keeping
    # where it came from keeps it in the drain's progress (it used to vanish from it, and the
    # drain said done while it sat Pending).
    return WorkloadStatus(phase=Phase.PENDING, reason="Unschedulable", message=reason,
                          placement=placement_doc(decision, reason, seen),
                          volume_node=prev.volume_node if prev else "",
                          relocating_from=prev.relocating_from if prev else "",
                          moving_off=prev.moving_off if prev else "", move_to=prev.move_to if prev else "",
                          moved_at=prev.moved_at if prev else 0.0, updated_at=now)


def on_placed(m: Mirror, batch: Sequence[Placed], now: float) -> tuple[Effects, list[tuple[Placed, Exception]]]:
    """A batch of decisions to make durable, many to a transaction (each still lands or not on
    its own guards); a decision whose documents cannot be built is handed back with its error,
    so it alone fails."""
    fx = Effects(grouped=True)
    broken: list[tuple[Placed, Exception]] = []
    homed: set[str] = set()  # a volume record is written by one placement of a batch at most
    for p in batch:
        try:
            st = m.statuses.get(p.instance)
            homes = [h for h in unhomed_local_volumes(p.need.workload, m.volumes) if h.value.id not in homed]
            homed.update(h.value.id for h in homes)
            fx.writes.append(placement_write(p, st.value if st else None, now, homes))
        except Exception as err:  # one placement whose documents cannot be built must not hold back the rest
            broken.append((p, err))
    return fx, broken


def pending_write(need: Need, prev: WorkloadStatus | None, decision: pl.Decision, now: float,
                  seen: dict[str, Any] | None = None) -> Write | None:
    """An instance no node fits: its Pending status, guarded by the workload's revision decided
    on, published once written (None: its status says so already)."""
    status = pending_status(prev, decision, now, seen)
    if status is None:
        return None
    wid, inst = need.workload.id, need.instance
    return Write([Guard("workload", wid, need.wrev)], [put("status", inst, status)],
                 [Event("WorkloadPending", f"workload/{wid}", f"{inst}: {status.message}" if inst != wid
                        else status.message, "Unschedulable")])
