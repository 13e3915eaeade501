"""What decisions need to know of a workload's volumes (pure): which records its volumes stand
for, whether a node-local volume pins it, and what becomes of its inline volumes with it."""

from __future__ import annotations

from persys.model.volume import VolumePhase, has_data, inline_volume_id
from persys.model.workload import Workload, WorkloadSpec
from persys.scheduler.decide.effects import Guard, Intent, drop, put
from persys.scheduler.decide.mirror import Mirror


def has_local_volumes(w: Workload) -> bool:
    """Inline local volumes (a claimed local Volume pins through its record: `volume_home`)."""
    return any(v.driver == "local" and v.claim is None for v in w.spec.volumes)


def volume_ids(workload_id: str, spec: WorkloadSpec) -> list[str]:
    """The volume records a workload's volumes stand for: claims by name, inline ones by id."""
    return [v.claim if v.claim is not None else inline_volume_id(workload_id, v.name) for v in spec.volumes]


def reclaim(m: Mirror, wid: str, now: float) -> tuple[list[Guard], list[Intent]]:
    """When a workload is removed: its inline volumes with reclaimPolicy Delete go to Deleting
    (their data is removed by the node or controller that can); retained ones stay, unowned."""
    guards: list[Guard] = []
    intents: list[Intent] = []
    w = m.workloads.get(wid)
    # Its own inline volumes (a workload refused by the model: every record it may own).
    ids = {inline_volume_id(wid, v.name) for v in w.value.spec.volumes if v.claim is None} if w else set(m.volumes)
    for vid in sorted(ids):
        cur = m.volumes.get(vid)
        if cur is None:
            continue
        v = cur.value
        if v.owner != wid or v.phase == VolumePhase.DELETING:
            continue
        guards.append(Guard("volume", vid, cur.mod_revision))
        if v.spec.reclaim_policy.value != "Delete":
            continue
        if not has_data(v):  # never provisioned nor placed: no data to remove
            intents.append(drop("volume", vid))
        else:
            intents.append(put("volume", vid, v.model_copy(update={
                "phase": VolumePhase.DELETING, "reason": f"its workload {wid} was deleted", "updated_at": now})))
    return guards, intents
