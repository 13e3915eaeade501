"""What to do with volume records, and what a finished step writes: pure functions shared by the
volume controller (network volumes, on the active replica) and the node volume work (local
volumes, carried out by the agent of the node that holds their data)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from persys.model.volume import Volume, VolumePhase
from persys.scheduler.mirror.follower import Versioned

StepKind = Literal["provision", "resize", "delete", "snapshot", "unsnapshot"]
NODE_STEPS = ("resize", "delete", "snapshot", "unsnapshot")  # a node provisions at first attach instead
REASON_MAX = 1024


@dataclass(frozen=True, slots=True)
class Action:
    kind: StepKind
    volume: Volume
    mod_revision: int
    snapshot: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a step's end writes: the record replaced (`volume`) or removed (None), and the event."""

    volume: Volume | None
    event: str
    message: str
    reason: str = ""


def actions(volumes: Mapping[str, Versioned[Volume]], drivers: Collection[str],
            not_before: Mapping[str, float], now: float, node: str = "") -> list[Action]:
    """What to do now (pure). Without `node`: the network volumes whose driver the controller
    has. With `node`: the local volumes whose data lives on that node."""
    out = []
    for vid, cur in sorted(volumes.items()):
        v = cur.value
        if not_before.get(vid, 0.0) > now or v.spec.driver not in drivers:
            continue
        if (v.spec.driver == "local") != bool(node) or (node and v.node != node):
            continue
        if v.phase == VolumePhase.DELETING:
            out.append(Action("delete", v, cur.mod_revision))
        elif v.provisioned_mb == 0 and v.phase in (VolumePhase.PENDING, VolumePhase.FAILED):
            if not node:
                out.append(Action("provision", v, cur.mod_revision))
        elif 0 < v.provisioned_mb < v.spec.size_mb:
            out.append(Action("resize", v, cur.mod_revision))
        elif v.provisioned_mb and (todo := _snapshot_step(v, cur.mod_revision)) is not None:
            out.append(todo)
    return out


def _snapshot_step(v: Volume, rev: int) -> Action | None:
    """The first snapshot to make or remove so the backend's follow the wanted ones."""
    for snap in v.wanted_snapshots:
        if snap not in v.snapshots:
            return Action("snapshot", v, rev, snap)
    for snap in v.snapshots:
        if snap not in v.wanted_snapshots:
            return Action("unsnapshot", v, rev, snap)
    return None


def done(a: Action, size_mb: int | None, snapshots: Collection[str], where: str, now: float | None = None
         ) -> Outcome:
    """A step that succeeded: `size_mb` None when the data is gone (a delete)."""
    v = a.volume
    if size_mb is None:
        return Outcome(None, "VolumeDeleted", f"{v.spec.driver} data removed{where}")
    updated = v.model_copy(update={"phase": VolumePhase.AVAILABLE, "provisioned_mb": size_mb,
                                   "snapshots": list(snapshots), "reason": "",
                                   "updated_at": time.time() if now is None else now})
    kind, what = {"provision": ("VolumeProvisioned", f"{size_mb} MiB on {v.spec.driver}{where}"),
                  "resize": ("VolumeResized", f"{size_mb} MiB{where}"),
                  "snapshot": ("VolumeSnapshotted", f"snapshot {a.snapshot}{where}"),
                  "unsnapshot": ("VolumeSnapshotDeleted", f"snapshot {a.snapshot}{where}")}[a.kind]
    return Outcome(updated, kind, what)


def failed(a: Action, reason: str, now: float | None = None) -> Outcome | None:
    """A step that failed: the record says why (None: it already does). A delete stays Deleting
    (it is retried as one); anything else makes the volume Failed until a retry succeeds."""
    v, reason = a.volume, reason[:REASON_MAX]
    phase = VolumePhase.DELETING if a.kind == "delete" else VolumePhase.FAILED
    if v.phase == phase and v.reason == reason:
        return None
    updated = v.model_copy(update={"phase": phase, "reason": reason,
                                   "updated_at": time.time() if now is None else now})
    return Outcome(updated, "VolumeFailed", f"{a.kind}: {reason[:300]}", reason="VolumeFailed")
